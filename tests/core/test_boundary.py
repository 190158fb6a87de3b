"""The handle boundary: nothing above ``core/`` spells a shard's keys, builds its parts, drives
its commit machine or opens its store. Those layers go through the handles (``Shard.writer()``,
``reader()``, ``admin()``) and :class:`shardsink.core.roots.RootObjects`; only core knows the layout.

Read from the source with :mod:`ast` (no module is imported): every import counts, deferred,
``TYPE_CHECKING`` and relative ones included, and so do ``importlib.import_module("...")`` and
attribute chains through an imported package (``shardsink.core.keys.version_key``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
PKG = "shardsink"

#: Modules no module outside core/ may import, and why.
FORBIDDEN_MODULES = {
    "shardsink.core.keys": "the shard layout's keys (use the handles' methods, named by meaning)",
    "shardsink.core.builder": "the batch builder (WriteHandle.builder / AdminHandle.builder hand one out)",
    "shardsink.core.machine": "the commit machine (WriteHandle.commit / AdminHandle.commit)",
}
#: The store factory: opening a shard's store bypasses every handle.
FORBIDDEN_NAME = "open_blob"
STORE_MODULES = ("shardsink.storage", "shardsink.storage.url")

#: Module (or package: every module in it) -> why it may use the store factory. Nothing is
#: exempt from the core-internal modules.
EXEMPT = {
    "shardsink.storage": "the store factory's own package",
    "shardsink.sources.landing": "opens a landing zone (a folder of source files, no shard layout), not a shard",
    "shardsink.sources.landing_read": "executors open the landing zone to read its files, not a shard",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted((PLUGINS / PKG).rglob("*.py")):
        name = ".".join(p.relative_to(PLUGINS).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _absolute(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _forbidden(target: str) -> str | None:
    """The forbidden module ``target`` (a dotted name) is or lies in, else None."""
    return next((m for m in FORBIDDEN_MODULES if target == m or target.startswith(m + ".")), None)


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


def offences(module: str, source: str, *, is_pkg: bool = False) -> list[str]:
    """What ``module`` (its ``source``) reaches across the boundary: ``"<line>: <what>"`` each."""
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> the shardsink module it is bound to
    tree = ast.parse(source)
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
    return sorted(set(found), key=lambda s: (int(s.split(":")[0]), s))


def _exemption(module: str) -> str | None:
    return next((k for k in EXEMPT if module == k or module.startswith(k + ".")), None)


def test_nothing_outside_core_reaches_keys_builder_machine_or_the_store_factory() -> None:
    offenders: list[str] = []
    used: set[str] = set()
    mods = _modules()
    assert "shardsink.core.keys" in mods and len(mods) > 100, f"module discovery broke: {len(mods)} modules"
    for name, path in mods.items():
        if name.startswith("shardsink.core.") or name == "shardsink.core":
            continue
        found = offences(name, path.read_text(), is_pkg=path.name == "__init__.py")
        ex = _exemption(name)
        if ex is not None and found and all(FORBIDDEN_NAME in f for f in found):
            used.add(ex)
            continue
        offenders += [f"{path.relative_to(PLUGINS.parent)}:{f}" for f in found]
    print("\n".join(["boundary offenders:", *offenders]) if offenders else "boundary: no offenders")
    assert not offenders, ("modules outside core/ reach across the handle boundary (use the handles, "
                           "or RootObjects for registered root objects):\n" + "\n".join(offenders))
    assert used == set(EXEMPT), f"stale exemptions (nothing needs them any more): {sorted(set(EXEMPT) - used)}"


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
])
def test_the_check_catches_every_way_of_reaching_across(source: str) -> None:
    assert offences("shardsink.maintenance.x", source), source


@pytest.mark.parametrize("source", [
    '"""See :mod:`shardsink.core.keys` and open_blob."""',
    "from shardsink.storage.url import ShardUrl, parse_url",
    "from shardsink.core import fate, state\nfrom shardsink.core.admin import AdminHandle",
    "from shardsink.core.shard import Shard\nd = {}\nd.keys()",
    "from . import keys",  # shardsink.maintenance.keys is no core module
])
def test_the_check_leaves_the_handles_and_mere_mentions_alone(source: str) -> None:
    assert offences("shardsink.maintenance.x", source) == [], source
