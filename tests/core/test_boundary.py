"""The handle boundary: nothing above ``core/`` spells a shard's keys, builds its parts, drives
its commit machine or opens its store. Those layers go through the handles (``Shard.writer()``,
``reader()``, ``admin()``) and :class:`shardsink.core.roots.RootObjects`; only core knows the layout.

Read from the source with :mod:`ast` (no module is imported), in every module of
``plugins/shardsink`` outside ``core/`` and of ``bench/`` and ``shardsink_dev/`` (benchmarks and
dev helpers are held to it too: they are how the library is shown to work).

**Imports.** Every import counts, deferred, ``TYPE_CHECKING`` and relative ones included, and so
do ``importlib.import_module("...")`` and attribute chains through an imported package
(``shardsink.core.keys.version_key``).

**Attributes** (outside ``core/`` and ``storage/``, which own the machine and the store). A
handle keeps its commit machine and store in private attributes; reaching them walks around
every handle as surely as an import does (``shard._machine.commit(cmd)`` skips the family
check). No type is known from the source, so the rule is by name: any attribute access, load
or store, named in :data:`FORBIDDEN_ATTRS` is an offence, whatever it is read from, and so is
``getattr``/``setattr``/``hasattr`` with such a name as a constant. The names are the handles'
own (:func:`test_the_forbidden_names_are_every_way_a_handle_holds_its_machine_or_store` reads
them off live handles). Exceptions (:func:`_allowed`), each a different object by its spelling:

* ``platform.machine`` (the standard library's host architecture, in benchmark reports);
* a *call* of a ``.blob()`` method: a landing zone's store (``LandingSource.blob()``), not a
  shard's. Safe because no handle has a member named ``blob`` or ``machine`` at all (asserted
  by the same test), so ``shard.blob()`` cannot reach anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from shardsink.core.machine import Machine
from shardsink.core.shard import Shard
from shardsink.storage.retry import RetryingBlob

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"
PKG = "shardsink"
#: The trees scanned: (folder, its top-level package name).
TREES = ((PLUGINS / PKG, PKG), (ROOT / "bench", "bench"), (ROOT / "shardsink_dev", "shardsink_dev"))
#: Packages below the boundary: the import rule skips core/, the attribute rule core/ and storage/.
CORE = "shardsink.core"
STORAGE = "shardsink.storage"

#: Modules no module outside core/ may import, and why.
FORBIDDEN_MODULES = {
    "shardsink.core.keys": "the shard layout's keys (use the handles' methods, named by meaning)",
    "shardsink.core.builder": "the batch builder (WriteHandle.builder / AdminHandle.builder hand one out)",
    "shardsink.core.machine": "the commit machine (WriteHandle.commit / AdminHandle.commit)",
}
#: The store factory: opening a shard's store bypasses every handle.
FORBIDDEN_NAME = "open_blob"
STORE_MODULES = ("shardsink.storage", "shardsink.storage.url")

#: Attribute names that reach a shard handle's commit machine or store, and whose they are.
FORBIDDEN_ATTRS = {
    "machine": "the commit machine (Shard.machine is gone: use the handles)",
    "_machine": "the private commit machine of Shard, ReadHandle and WriteHandle",
    "_m": "the private commit machine of AdminHandle",
    "blob": "the shard's store (Shard.blob is gone: use the handles)",
    "_blob": "a private store",
}
ATTR_FUNCS = ("getattr", "setattr", "hasattr", "delattr")

#: Module (or package: every module in it) -> (the offence it may have: a substring of it, why).
#: Nothing is exempt from the attribute rule.
EXEMPT = {
    "shardsink.storage": (FORBIDDEN_NAME, "the store factory's own package"),
    "shardsink.sources.landing": (FORBIDDEN_NAME, "opens a landing zone (a folder of source files, no shard "
                                                  "layout), not a shard; its executors read the zone's files"),
    "shardsink_dev.synthetic": (FORBIDDEN_NAME, "lands files in a landing zone, not a shard"),
    "bench.landing_history": (FORBIDDEN_NAME, "sizes a landing zone's files, not a shard's"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, top in TREES:
        for p in sorted(folder.rglob("*.py")):
            name = ".".join([top, *p.relative_to(folder).with_suffix("").parts])
            out[name.removesuffix(".__init__")] = p
    return out


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _absolute(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _forbidden(target: str) -> str | None:
    """The forbidden module ``target`` (a dotted name) is or lies in, else None."""
    return next((m for m in FORBIDDEN_MODULES if _within(target, m)), None)


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _through(node: ast.Attribute, aliases: dict[str, str]) -> str | None:
    """``node`` as written if it names a forbidden module through an imported package
    (``shardsink.core.keys`` after ``import shardsink``); only the shortest such chain."""
    chain = _dotted(node)
    if not chain or chain[0] not in aliases:
        return None
    full = ".".join([aliases[chain[0]], *chain[1:]])
    return ".".join(chain) if _forbidden(full) and not _forbidden(full.rpartition(".")[0]) else None


def _import_offences(module: str, tree: ast.Module, is_pkg: bool) -> list[str]:
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> the shardsink module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _forbidden(a.name):
                    found.append(f"{node.lineno}: import {a.name}")
                if a.name.split(".")[0] == PKG:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else PKG
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_pkg, node)
            for a in node.names:
                full = f"{base}.{a.name}"
                if _forbidden(full) or (a.name == FORBIDDEN_NAME and base in STORE_MODULES):
                    found.append(f"{node.lineno}: from {base} import {a.name}")
                if base.split(".")[0] == PKG:
                    aliases[a.asname or a.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == FORBIDDEN_NAME:
                found.append(f"{node.lineno}: .{FORBIDDEN_NAME}")
            elif (through := _through(node, aliases)) is not None:
                found.append(f"{node.lineno}: {through}")
        elif isinstance(node, ast.Call):
            fn = _dotted(node.func)
            if fn and fn[-1] in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _forbidden(arg.value):
                    found.append(f"{node.lineno}: {fn[-1]}({arg.value!r})")
    return found


def _allowed(node: ast.Attribute, called: set[int]) -> bool:
    """The documented exceptions (module docstring): ``platform.machine`` and ``<x>.blob()`` calls."""
    if node.attr == "machine" and isinstance(node.value, ast.Name) and node.value.id == "platform":
        return True
    return node.attr == "blob" and id(node) in called


def _attribute_offences(tree: ast.Module) -> list[str]:
    found: list[str] = []
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS and not _allowed(node, called):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTR_FUNCS
              and len(node.args) > 1 and isinstance(arg := node.args[1], ast.Constant)
              and arg.value in FORBIDDEN_ATTRS):
            found.append(f"{node.lineno}: {node.func.id}(..., {arg.value!r})")
    return found


def offences(module: str, source: str, *, is_pkg: bool = False) -> list[str]:
    """What ``module`` (its ``source``) reaches across the boundary: ``"<line>: <what>"`` each."""
    tree = ast.parse(source)
    found = [] if _within(module, CORE) else _import_offences(module, tree, is_pkg)
    if not (_within(module, CORE) or _within(module, STORAGE)):
        found += _attribute_offences(tree)
    return sorted(set(found), key=lambda s: (int(s.split(":")[0]), s))


def _exemption(module: str) -> str | None:
    return next((k for k in EXEMPT if _within(module, k)), None)


def test_nothing_outside_core_reaches_keys_builder_machine_store_factory_or_a_handles_insides() -> None:
    offenders: list[str] = []
    used: set[str] = set()
    mods = _modules()
    assert "shardsink.core.keys" in mods and len(mods) > 100, f"module discovery broke: {len(mods)} modules"
    assert {"bench.long_life", "shardsink_dev.demo", "shardsink_dev.sim.ctx"} <= set(mods), "a tree went unscanned"
    for name, path in mods.items():
        found = offences(name, path.read_text(), is_pkg=path.name == "__init__.py")
        ex = _exemption(name)
        if ex is not None and found and all(EXEMPT[ex][0] in f for f in found):
            used.add(ex)
            continue
        offenders += [f"{path.relative_to(ROOT)}:{f}" for f in found]
    print("\n".join(["boundary offenders:", *offenders]) if offenders else "boundary: no offenders")
    assert not offenders, ("modules outside core/ reach across the handle boundary (use the handles, "
                           "or RootObjects for registered root objects):\n" + "\n".join(offenders))
    assert used == set(EXEMPT), f"stale exemptions (nothing needs them any more): {sorted(set(EXEMPT) - used)}"


def test_the_forbidden_names_are_every_way_a_handle_holds_its_machine_or_store(tmp_path: Path) -> None:
    """Every attribute a live handle keeps its machine or store in is a forbidden name, none is
    public, and no handle has a member named ``machine`` or ``blob`` (what makes the ``.blob()``
    call exception safe)."""
    import pyarrow as pa

    shard = Shard.create(f"file://{tmp_path}/s", pa.schema([("k", pa.string())]))
    for handle in (shard, shard.writer(), shard.reader(), shard.admin()):
        kind = type(handle).__name__
        held = {n for n, v in vars(handle).items() if isinstance(v, Machine | RetryingBlob)}
        assert held and held <= set(FORBIDDEN_ATTRS), f"{kind} holds its machine or store in {held}"
        assert not any(n in dir(type(handle)) for n in ("machine", "blob")), f"{kind} has a machine or blob member"
        public = {n for n in dir(handle) if not n.startswith("_")}
        leaks = {n for n in public if isinstance(getattr(handle, n), Machine | RetryingBlob)}
        assert not leaks, f"{kind} hands out its machine or store as {leaks}"


@pytest.mark.parametrize("source", [
    "from shardsink.core import keys",
    "from shardsink.core.keys import version_key",
    "import shardsink.core.keys",
    "import shardsink.core.machine as m",
    "from shardsink.core import builder as b",
    "from ..core import keys",
    "from ..core.builder import BatchBuilder",
    "from shardsink.storage import open_blob",
    "from shardsink.storage.url import open_blob as ob",
    "import shardsink.storage.url\nshardsink.storage.url.open_blob('file:///x')",
    "import shardsink\nshardsink.core.keys.version_key(1)",
    "from shardsink import core\ncore.machine.Machine",
    "import importlib\nimportlib.import_module('shardsink.core.keys')",
    "def f():\n    if TYPE_CHECKING:\n        from shardsink.core.machine import Machine",
    # reaching a handle's insides
    "shard.machine.commit(cmd)",
    "Shard.open(url).machine.head()",
    "shard._machine.commit(cmd)",
    "shard.writer()._machine.blob.put('x', b'')",
    "shard.admin()._m.commit(cmd)",
    "shard.blob.list('parts/')",
    "shard._blob.delete('state/LATEST.json')",
    "m = shard.machine",
    "s.machine.clock = f",
    "getattr(shard, '_machine')",
    "blob = shard.blob\nblob.put('x', b'')",
])
def test_the_check_catches_every_way_of_reaching_across(source: str) -> None:
    assert offences("shardsink.maintenance.x", source), source
    assert "from .." in source or offences("bench.x", source), source


@pytest.mark.parametrize("source", [
    '"""See :mod:`shardsink.core.keys` and open_blob; shard.machine and shard.blob are gone."""',
    "from shardsink.storage.url import ShardUrl, parse_url",
    "from shardsink.core import fate, state\nfrom shardsink.core.admin import AdminHandle",
    "from shardsink.core.shard import Shard\nd = {}\nd.keys()",
    "from . import keys",  # shardsink.maintenance.keys is no core module
    "import platform\nplatform.machine()",
    "src.blob().list('')\nsrc.landing.blob().get('k')",
    "Shard(url, blob=store)",  # the public constructor's store
    "shard.writer().commit(cmd)\nshard.admin().list_objects()",
])
def test_the_check_leaves_the_handles_and_mere_mentions_alone(source: str) -> None:
    assert offences("shardsink.maintenance.x", source) == [], source


def test_core_and_storage_keep_their_own_attributes() -> None:
    assert offences("shardsink.core.leases", "shard._machine.head()\nshard.blob.put('k', b'')") == []
    assert offences("shardsink.storage.ranged", "self.blob.get_source_range('k', 0, 1)") == []
