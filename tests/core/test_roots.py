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
    assert folder in roots.registered() and exact in roots.registered(), "one registry"
    assert roots.is_registered_root(f"{name}/a.json") and roots.is_registered_root(f"{name}.json")
    assert not roots.is_registered_root(f"{name}/../state/LATEST.json") and not roots.is_registered_root("other.json")
    assert roots.known(f"{name}/x") and roots.known(keys.LATEST) and roots.known("parts/d/p.parquet")
    assert not roots.known(f"{name}x.json")
    assert f"{name}/" in roots.expiring_prefixes() and f"{name}.json" not in roots.expiring_prefixes()
    assert keys.LATEST.startswith(roots.STATE_PREFIX)
    assert not hasattr(keys, "registered") and not hasattr(keys, "CORE_PREFIXES"), "one place answers: roots"



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
