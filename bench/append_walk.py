"""How far the run's descriptions travel from the append task: a static walk of the calls (``ast`` only).

Issue (on a64593f): "Following ``descs`` from ``airflow/tasks.py:append_task``: 42 stays in 16 rooms, 9 climbs
back up a layer, 26 returns to a room already left"; target for HEAD: <= 15 stays, <= 2 climbs. Sources from
``git archive <commit> plugins/shardsink`` in a temp dir (``--head worktree``: the files as they are); nothing
is imported.

* Seed: ``append_task``'s parameter ``descs`` (both commits have it; else its parameters named ``*desc*``).
* Tracked names in a function (flow-insensitive fixpoint, nested def/class bodies excluded): the seed plus every
  plain name assigned from an expression mentioning a tracked name (``=``, ``+=``, ``:=``, annotated, ``for``/
  comprehension targets, ``with .. as``); attribute/subscript targets and ``xs.append(d)`` do not track.
* A call whose arguments or receiver mention a tracked name is followed when its callee is a function of
  plugins/shardsink: nested/same-module defs, imports (re-exports, module aliases, function-level imports),
  ``self.m``/``cls.m``/``super().m`` (package bases), ``Class.m``, ``Class(...)`` (its ``__init__``), ``x.m``
  where ``x``'s class is obvious (annotated; ``x = Class(...)`` or ``x = f(...)`` with ``f`` annotated to
  return a package class; ``self.x = Class(...)`` in ``__init__``). The callee's parameters given tracked
  arguments (``self`` for a tracked receiver) are its seed. Calls in source pre-order; each function entered
  once (DFS). Not followed, counted: ``external`` (builtins, outside imports/objects, package classes without
  ``__init__``), ``unresolved`` (receivers of no obvious class), ``again`` (a function already entered).
* A local function the followed call is handed (``load=load``) runs under the callee: it is entered from the
  callee's module, seeded with the tracked names its closure mentions (a callback is a climb when the callee
  sits lower).
* The walk's order is the order functions are entered; a **room** is a module, a **stay** one visit to a room
  in that order (consecutive functions of one module are one stay), a **climb** a stay whose module's layer is
  above the one before it (core and errors 0; storage, other top-level modules 1; sources, reclock 2; sinks,
  maintenance, iceberg, spark, read 3; airflow, provider 4): the path coming back up, whether by a return or
  by a callback; a **return** a stay in a room already visited. At a64593f this reads 42 stays: the issue's
  figure (an earlier version of this script counted functions entered as stays: 66 there; printed as
  "functions entered", with the calls that enter a function of a higher layer). "Stays in a layer": the
  stays with consecutive ones of one layer taken as one (how often the path changes layer).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import datetime
import io
import itertools
import subprocess
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PKG = "plugins/shardsink"
LAYERS = {"core": 0, "errors": 0, "storage": 1, "sources": 2, "reclock": 2, "sinks": 3, "maintenance": 3, "iceberg": 3,
          "spark": 3, "read": 3, "airflow": 4, "provider": 4}
WORKTREE = "worktree"  # --head worktree: the files as they are (uncommitted changes included)
FuncNode = ast.FunctionDef | ast.AsyncFunctionDef
Imports = dict[str, tuple[str, str | None]]  # local name -> (module, attribute; None: the module itself)


@dataclass(frozen=True)
class Func:
    module: str
    qual: str
    node: FuncNode = field(compare=False, hash=False)


@dataclass(frozen=True)
class Cls:
    module: str
    name: str
    node: ast.ClassDef = field(compare=False, hash=False)


class Mod(str):
    """A module of the package, by dotted name."""


EXTERNAL = "external"
Target = Func | Cls | Mod | str | None  # str: EXTERNAL; None: unresolved
Stay = tuple[Func, int, list[str], bool, bool]  # the function, depth, seed, climb, return


@dataclass
class Module:
    name: str
    tree: ast.Module
    defs: dict[str, FuncNode | ast.ClassDef]
    imports: Imports
    made_outside: set[str] = field(default_factory=set)


def imports_of(nodes: list[ast.AST]) -> Imports:
    out: Imports = {}
    for n in nodes:
        if isinstance(n, ast.Import):
            top = {a.name: a.name.split(".")[0] for a in n.names}
            out |= {a.asname or top[a.name]: (a.name if a.asname else top[a.name], None) for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out |= {a.asname or a.name: (n.module, a.name) for a in n.names}
    return out


def layer(module: str) -> int:
    return LAYERS.get(module.partition(".")[2].split(".")[0], 1)


class Index:
    """The package's modules, parsed; names resolved through imports and re-exports."""

    def __init__(self, pkg: Path) -> None:
        self.modules: dict[str, Module] = {}
        for path in sorted(pkg.rglob("*.py")):
            rel = path.relative_to(pkg.parent).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            tree = ast.parse(path.read_text(), filename=str(path))
            defs = {n.name: n for n in tree.body if isinstance(n, FuncNode | ast.ClassDef)}
            self.modules[name] = Module(name, tree, defs, imports_of(list(tree.body)))
        for m in self.modules.values():  # module globals made by an outside call (log = getLogger(...))
            m.made_outside = {t.id for n in m.tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                              and self.expr_target(m.name, n.value.func, {}) == EXTERNAL
                              for t in n.targets if isinstance(t, ast.Name)}

    def lookup(self, module: str, name: str, depth: int = 0) -> Target:
        if module not in self.modules:
            return None if module.split(".")[0] == "shardsink" else EXTERNAL
        m, node = self.modules[module], self.modules[module].defs.get(name)
        if isinstance(node, ast.ClassDef):
            return Cls(module, name, node)
        if node is not None:
            return Func(module, name, node)
        if f"{module}.{name}" in self.modules:
            return Mod(f"{module}.{name}")
        return self.import_target(m.imports[name], depth + 1) if name in m.imports and depth < 10 else None

    def import_target(self, imp: tuple[str, str | None], depth: int = 0) -> Target:
        mod, attr = imp
        if attr is not None:
            return self.lookup(mod, attr, depth)
        return Mod(mod) if mod in self.modules else (None if mod == "shardsink" else EXTERNAL)

    def method(self, cls: Cls, name: str, seen: frozenset[str] = frozenset()) -> Target:
        """``name`` on ``cls`` or its bases (depth first); EXTERNAL when a base is outside the package."""
        for n in cls.node.body:
            if isinstance(n, FuncNode) and n.name == name:
                return Func(cls.module, f"{cls.name}.{name}", n)
        outside = False
        for b in cls.node.bases:
            base = self.expr_target(cls.module, b, {})
            if isinstance(base, Cls) and base.name not in seen and (got := self.method(base, name, seen | {cls.name})):
                return got
            outside = outside or not isinstance(base, Cls)
        return EXTERNAL if outside or name.startswith("__") else None

    def expr_target(self, module: str, e: ast.expr, local: Imports) -> Target:
        """A ``Name`` or dotted ``Attribute`` resolved at module level (plus function-level imports)."""
        if isinstance(e, ast.Name):
            m = self.modules[module]
            if e.id in m.defs:
                return self.lookup(module, e.id)
            imp = local.get(e.id) or m.imports.get(e.id)
            if imp is not None:
                return self.import_target(imp)
            return EXTERNAL if hasattr(builtins, e.id) or e.id in m.made_outside else None
        if isinstance(e, ast.Attribute):
            base = self.expr_target(module, e.value, local)
            if isinstance(base, Mod):
                return self.lookup(base, e.attr)
            if isinstance(base, Cls):
                return self.method(base, e.attr)
            return base if base == EXTERNAL else None
        return None

    def annotated(self, module: str, ann: ast.expr | None) -> Cls | None:
        """The package class an annotation names (``X | None`` too; not quoted ones)."""
        if isinstance(ann, ast.BinOp):
            return self.annotated(module, ann.left) or self.annotated(module, ann.right)
        got = self.expr_target(module, ann, {}) if isinstance(ann, ast.Name | ast.Attribute) else None
        return got if isinstance(got, Cls) else None


def body_nodes(fn: FuncNode) -> list[ast.AST]:
    """Every node of the function's body in source pre-order, nested def/class bodies excluded."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(reversed(fn.body))
    while todo:
        out.append(n := todo.pop())
        todo += [] if isinstance(n, FuncNode | ast.ClassDef) else reversed(list(ast.iter_child_nodes(n)))
    return out


def mentions(e: ast.AST | None, names: set[str]) -> bool:
    return e is not None and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(e))


def target_names(t: ast.AST) -> list[str]:
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, ast.Tuple | ast.List):
        return [x for e in t.elts for x in target_names(e)]
    return target_names(t.value) if isinstance(t, ast.Starred) else []


def flows(n: ast.AST) -> list[tuple[list[ast.expr], ast.expr | None]]:
    """The (targets, source expression) pairs of one node that assigns names."""
    if isinstance(n, ast.Assign):
        return [(list(n.targets), n.value)]
    if isinstance(n, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
        return [([n.target], n.value)]
    if isinstance(n, ast.For | ast.AsyncFor | ast.comprehension):
        return [([n.target], n.iter)]
    if isinstance(n, ast.With | ast.AsyncWith):
        return [([i.optional_vars], i.context_expr) for i in n.items if i.optional_vars is not None]
    return []


def tracked_names(nodes: list[ast.AST], seed: set[str]) -> set[str]:
    names, pairs = set(seed), [p for n in nodes for p in flows(n)]
    while new := {x for ts, value in pairs if mentions(value, names) for t in ts for x in target_names(t)} - names:
        names |= new
    return names


def bind(fn: FuncNode, call: ast.Call, names: set[str], receiver: bool | None) -> set[str]:
    """The callee's parameters that receive a tracked argument; ``receiver``: the first parameter is
    the receiver (True: a tracked one), None: an unbound call."""
    a = fn.args
    pos, kwonly = [p.arg for p in a.posonlyargs + a.args], [p.arg for p in a.kwonlyargs]
    var, kwarg = a.vararg.arg if a.vararg else None, a.kwarg.arg if a.kwarg else None
    if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list):
        receiver = None
    out: set[str] = {pos[0]} if receiver and pos else set()
    pos = pos[1:] if receiver is not None else pos
    for i, arg in enumerate(call.args):
        if mentions(arg, names):
            out |= ({var} if var else set(pos[i:])) if isinstance(arg, ast.Starred) or i >= len(pos) else {pos[i]}
    for k in call.keywords:
        if mentions(k.value, names):
            named = k.arg is not None and (k.arg in pos or k.arg in kwonly)
            out |= {k.arg} if named and k.arg else {kwarg} if kwarg else set()
    return out


@dataclass
class Walk:
    index: Index
    stays: list[Stay] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    sites: Counter[str] = field(default_factory=Counter)

    def enter(self, fn: Func, seed: set[str], caller: str | None, depth: int) -> None:
        self.seen.add((fn.module, fn.qual))
        rooms = {s[0].module for s in self.stays}
        climb = caller is not None and layer(fn.module) > layer(caller)
        back = caller is not None and fn.module != caller and fn.module in rooms
        self.stays.append((fn, depth, sorted(seed), climb, back))
        nodes = body_nodes(fn.node)
        names = tracked_names(nodes, seed)
        local = imports_of([n for n in nodes if isinstance(n, ast.Import | ast.ImportFrom)])
        nested = {n.name: n for n in nodes if isinstance(n, FuncNode)}
        types = self.local_types(fn, nodes, local)
        for call in (n for n in nodes if isinstance(n, ast.Call)):
            receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
            if not (mentions(receiver, names) or any(mentions(a, names) for a in call.args)
                    or any(mentions(k.value, names) for k in call.keywords)):
                continue
            target, bound = self.callee(fn, call.func, local, nested, types)
            if isinstance(target, Cls):
                init = self.index.method(target, "__init__")
                target, bound = (init, False) if isinstance(init, Func) else (EXTERNAL, None)
            if not isinstance(target, Func):
                self.sites["external" if target == EXTERNAL else "unresolved"] += 1
            elif (target.module, target.qual) in self.seen:
                self.sites["again"] += 1
            else:
                self.sites["followed"] += 1
                own = None if bound is None else bound and mentions(receiver, names)
                self.enter(target, bind(target.node, call, names, own), fn.module, depth + 1)
                self.callbacks(fn, call, names, nested, target, depth)

    def callbacks(self, fn: Func, call: ast.Call, names: set[str], nested: dict[str, FuncNode], callee: Func,
                  depth: int) -> None:
        """A local function handed to the callee (``load=load``) runs under it: entered from the
        callee's module, seeded with the tracked names its closure mentions (none: not followed)."""
        for e in [*call.args, *(k.value for k in call.keywords)]:
            if not (isinstance(e, ast.Name) and e.id in nested):
                continue
            inner = Func(fn.module, f"{fn.qual}.<locals>.{e.id}", nested[e.id])
            seed = {n for n in names if mentions(inner.node, {n})}
            if seed and (inner.module, inner.qual) not in self.seen:
                self.enter(inner, seed, callee.module, depth + 2)

    def local_types(self, fn: Func, nodes: list[ast.AST], local: Imports) -> dict[str, Cls]:
        """The local names whose class is obvious (the module docstring)."""
        a = fn.node.args
        out = {p.arg: c for p in a.posonlyargs + a.args + a.kwonlyargs
               if (c := self.index.annotated(fn.module, p.annotation)) is not None}
        own = self.index.modules[fn.module].defs.get(fn.qual.split(".")[0] if "." in fn.qual else "")
        if isinstance(own, ast.ClassDef):
            out["self"] = out["cls"] = Cls(fn.module, own.name, own)
        for n in nodes:
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                if (c := self.index.annotated(fn.module, n.annotation)) is not None:
                    out[n.target.id] = c
            elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.targets[0], ast.Name):
                got = self.index.expr_target(fn.module, n.value.func, local)
                got = self.index.annotated(got.module, got.node.returns) if isinstance(got, Func) else got
                if isinstance(got, Cls):
                    out[n.targets[0].id] = got
        return out

    def callee(self, fn: Func, e: ast.expr, local: Imports, nested: dict[str, FuncNode],
               types: dict[str, Cls]) -> tuple[Target, bool | None]:
        """The call's target and whether its first parameter is the receiver (None: unbound)."""
        if isinstance(e, ast.Name):
            if e.id in nested:
                return Func(fn.module, f"{fn.qual}.<locals>.{e.id}", nested[e.id]), None
            return self.index.expr_target(fn.module, e, local), None
        if not isinstance(e, ast.Attribute):
            return None, None
        base = e.value
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            bases = [self.index.expr_target(fn.module, b, local) for b in types["self"].node.bases] \
                if "self" in types else []
            return next((self.index.method(b, e.attr) for b in bases if isinstance(b, Cls)), EXTERNAL), True
        cls = self.receiver_class(fn, base, local, types)
        if cls is not None:
            return self.index.method(cls, e.attr), True
        got = self.index.expr_target(fn.module, base, local)
        if isinstance(got, Mod):
            return self.index.lookup(got, e.attr), None
        if isinstance(got, Cls):
            return self.index.method(got, e.attr), None
        return (EXTERNAL if got == EXTERNAL else None), None

    def receiver_class(self, fn: Func, e: ast.expr, local: Imports, types: dict[str, Cls]) -> Cls | None:
        """The obvious class of a receiver (the module docstring)."""
        if isinstance(e, ast.Name):
            return types.get(e.id)
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
            init = self.index.method(types["self"], "__init__") if "self" in types else None
            made = [self.index.expr_target(init.module, n.value.func, {}) for n in ast.walk(init.node)
                    if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                    and any(ast.unparse(t) == ast.unparse(e) for t in n.targets)] if isinstance(init, Func) else []
            return made[0] if made and isinstance(made[0], Cls) else None
        if not isinstance(e, ast.Call):
            return None
        got: Target = None
        if isinstance(e.func, ast.Attribute):
            cls = self.receiver_class(fn, e.func.value, local, types)
            got = self.index.method(cls, e.func.attr) if cls is not None else None
        elif isinstance(e.func, ast.Name):
            got = self.index.expr_target(fn.module, e.func, local)
        got = self.index.annotated(got.module, got.node.returns) if isinstance(got, Func) else got
        return got if isinstance(got, Cls) else None


def seed_of(fn: FuncNode) -> set[str]:
    every = [a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)]
    return {"descs"} if "descs" in every else {p for p in every if "desc" in p}


def measure(commit: str, verbose: bool) -> dict[str, Any]:
    if commit == WORKTREE:
        index = Index(ROOT / PKG)
    else:
        with tempfile.TemporaryDirectory(prefix="append_walk.") as tmp:
            tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, PKG], check=True,
                                 capture_output=True).stdout
            with tarfile.open(fileobj=io.BytesIO(tar)) as t:
                t.extractall(tmp, filter="data")
            index = Index(Path(tmp) / PKG)
    start = index.lookup("shardsink.airflow.tasks", "append_task")
    assert isinstance(start, Func), "append_task not found"
    walk = Walk(index)
    walk.enter(start, seed_of(start.node), None, 0)
    path = [s[0].module.removeprefix("shardsink.") for s in walk.stays]
    sha = WORKTREE if commit == WORKTREE else subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", commit], check=True, capture_output=True,
        text=True).stdout.strip()
    if verbose:
        print(f"-- walk at {sha} (seed {sorted(seed_of(start.node))}; [the callee's tracked parameters])")
        for fn, depth, seed, climb, back in walk.stays:
            print(f"{'  ' * depth}{fn.module.removeprefix('shardsink.')}:{fn.qual} [{', '.join(seed)}]"
                  + (" CLIMB" if climb else "") + (" RETURN" if back else ""))
    visits = [m for i, m in enumerate(path) if i == 0 or path[i - 1] != m]
    return {"commit": sha, "stays": len(visits), "rooms": len(set(path)),
            "climbs": sum(layer(f"shardsink.{b}") > layer(f"shardsink.{a}") for a, b in itertools.pairwise(visits)),
            "returns": sum(m in visits[:i] for i, m in enumerate(visits)),
            "layer_stays": sum(i == 0 or layer(f"shardsink.{m}") != layer(f"shardsink.{visits[i - 1]}")
                               for i, m in enumerate(visits)),
            "calls": len(walk.stays), "call_climbs": sum(s[3] for s in walk.stays),
            "unresolved": walk.sites["unresolved"], "external": walk.sites["external"],
            "again": walk.sites["again"], "visits": visits}


def report(base: dict[str, Any], head: dict[str, Any]) -> str:
    def line(r: dict[str, Any]) -> str:
        return (f"{r['commit']}: {r['stays']} stays in {r['rooms']} rooms, {r['climbs']} climbs, {r['returns']} "
                f"returns; {r['layer_stays']} stays in a layer; {r['calls']} functions entered "
                f"({r['call_climbs']} calls up a layer); call sites not "
                f"followed: {r['unresolved']} unresolved, {r['external']} external, {r['again']} again")

    keys = ("stays", "rooms", "climbs", "returns", "layer_stays", "calls")
    ratios = ", ".join(f"{k} {head[k] / base[k]:.2f}x" if base[k] else f"{k} {head[k]} vs 0" for k in keys)
    met = {k: "met" if head[k] <= n else "NOT met" for k, n in (("stays", 15), ("climbs", 2))}
    return "\n".join([
        f"- baseline {line(base)}", f"- HEAD {line(head)}", f"- HEAD/baseline: {ratios}",
        f"- targets (HEAD): stays {head['stays']} <= 15 {met['stays']}; climbs {head['climbs']} <= 2 {met['climbs']};"
        " the issue's baseline: 42 stays / 16 rooms / 9 climbs / 26 returns",
        f"- baseline rooms in walk order: {' → '.join(base['visits'])}",
        f"- HEAD rooms in walk order: {' → '.join(head['visits'])}"])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--base", default="a64593f"), ap.add_argument("--head", default="HEAD")
    ap.add_argument("--verbose", action="store_true", help="print each walk, one stay a line")
    ap.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args()
    print(text := report(measure(args.base, args.verbose), measure(args.head, args.verbose)))
    if not args.no_results:
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(f"\n## append_walk ({when}; static, `python bench/append_walk.py`)\n\n{text}\n")


if __name__ == "__main__":
    main()
