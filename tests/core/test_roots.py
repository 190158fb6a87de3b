"""core/roots.py: the shard's root namespace. Capabilities register their root objects there
(tests/core/test_boundary.py checks they never import core.keys); core's readers see the same
registry through core.keys; a key inside core's folders, malformed, or owned twice is refused."""

from __future__ import annotations

import uuid

import pytest

from shardsink.core import keys, roots


def test_a_capability_registers_its_roots_in_roots_and_cores_readers_know_them() -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    folder = roots.register_root(f"{name}/", owner="test", prefix=True, expiry="after_grace")
    assert roots.register_root(f"{name}/", owner="test", prefix=True, expiry="after_grace") == folder, "idempotent"
    exact = roots.register_root(f"{name}.json", owner="test")
    assert folder in keys.registered() and exact in keys.registered(), "core's readers see the same registry"
    assert keys.is_registered_root(f"{name}/a.json") and keys.is_registered_root(f"{name}.json")
    assert not keys.is_registered_root(f"{name}/../state/LATEST.json") and not keys.is_registered_root("other.json")
    assert keys.known(f"{name}/x") and keys.known(keys.LATEST) and keys.known("parts/d/p.parquet")
    assert not keys.known(f"{name}x.json")
    assert f"{name}/" in keys.expiring_prefixes() and f"{name}.json" not in keys.expiring_prefixes()
    assert keys.CORE_PREFIXES == roots.CORE_PREFIXES and keys.LATEST.startswith(roots.STATE_PREFIX)



@pytest.mark.parametrize(("key", "kwargs"), [
    ("state/mine.json", {}), ("parts/x/", {"prefix": True}), ("staging/y.json", {}), ("leases/z", {}),
    ("/abs.json", {}), ("", {}), ("a/../state/v/1.json", {}), ("cache/", {"prefix": True, "expiry": "soon"}),
])
def test_a_root_inside_cores_layout_or_malformed_is_refused_naming_it(key: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=repr(key).replace("/", ".")[1:-1] or "''"):
        roots.register_root(key, owner="test", **kwargs)  # type: ignore[arg-type]
    assert all(o.key != key for o in roots.registered())


def test_one_key_has_one_owner() -> None:
    key = f"t-{uuid.uuid4().hex[:8]}.json"
    roots.register_root(key, owner="a")
    with pytest.raises(ValueError, match="already registered"):
        roots.register_root(key, owner="b")
    with pytest.raises(ValueError, match="already registered"):
        roots.register_root(key, owner="a", expiry="after_grace")
