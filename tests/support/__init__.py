"""Test support: the fault proxy (:mod:`support.faultproxy`) and an independent audit.

:func:`audit` checks a shard's objects against a plain model of what writers were told
was committed. It decodes state versions with :mod:`json` and parts with
:mod:`pyarrow.parquet` directly, not with the library's codec, so a bug in the library's
own reading of its state cannot hide a bug in its writing. It only uses a backend
(``Blob``) for raw GET and LIST.

A model row is ``(k, n, time, diff)`` for the test schema :data:`SCHEMA`.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shardsink import Shard
from shardsink.storage.base import Blob

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64())])
Row = tuple[str, int, int, int]  # (k, n, time, diff)
#: Commit kinds that change no data: compaction (same updates, times < since advanced), since, retention.
MAINTENANCE = ("compact", "since", "retention")
_VKEY = re.compile(r"^state/v/(\d{20})\.json$")


def rows_for(desc_id: str, lower: int, upper: int, count: int = 3) -> list[Row]:
    """``count`` distinct inserts named after ``desc_id``, times spread over ``[lower, upper)``."""
    span = upper - lower
    return [(f"{desc_id}:{i}", i, lower + (i * 7) % span, 1) for i in range(count)]


def table_of(rows: Iterable[Row]) -> pa.Table:
    rows = list(rows)
    return pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.string()),
            "n": pa.array([r[1] for r in rows], pa.int64()),
            "_time": pa.array([r[2] for r in rows], pa.int64()),
            "_diff": pa.array([r[3] for r in rows], pa.int64()),
        }
    )


def consolidated(rows: Iterable[Row]) -> Counter[tuple[str, int, int]]:
    """Model updates summed per ``(k, n, time)``, zero sums dropped."""
    c: Counter[tuple[str, int, int]] = Counter()
    for k, n, t, d in rows:
        c[(k, n, t)] += d
    return Counter({key: d for key, d in c.items() if d != 0})


def contents(rows: Iterable[Row], as_of: int) -> Counter[tuple[str, int]]:
    """Model snapshot: multiplicity per row of the updates with ``time <= as_of``."""
    c: Counter[tuple[str, int]] = Counter()
    for k, n, t, d in rows:
        if t <= as_of:
            c[(k, n)] += d
    assert all(v >= 0 for v in c.values()), f"model went negative: {c}"
    return Counter({key: v for key, v in c.items() if v > 0})


def snapshot_counter(table: pa.Table) -> Counter[tuple[str, int]]:
    """A library snapshot (user columns + ``_count``) as a Counter."""
    return Counter({(r["k"], r["n"]): r["_count"] for r in table.to_pylist()})


def changes_counter(table: pa.Table) -> Counter[tuple[str, int, int]]:
    """A library change feed (user columns + ``_time``/``_diff``) as a Counter."""
    out: Counter[tuple[str, int, int]] = Counter()
    for r in table.to_pylist():
        key = (r["k"], r["n"], r["_time"])
        assert key not in out, f"change feed is not consolidated: {key} twice"
        out[key] = r["_diff"]
    return out


@dataclass
class Audit:
    """What :func:`audit` found (after all its assertions passed)."""

    seqno: int
    uppers: list[int | None]
    commits: list[dict[str, Any]]
    referenced: set[str]
    parts: set[str]
    versions: list[dict[str, Any]] = field(repr=False)

    @property
    def leaked(self) -> set[str]:
        """Objects under ``parts/`` that no live batch references."""
        return self.parts - self.referenced

    def seqno_of(self, desc_id: str) -> int:
        found = [v["seqno"] for v in self.versions if v["commit"].get("desc_id") == desc_id]
        assert len(found) == 1, f"{desc_id} is in versions {found}"
        return found[0]


def audit(blob: Blob, committed: Mapping[str, Iterable[Row]], *, url: str | None = None) -> Audit:
    """Check a shard's objects against the model ``committed`` (desc id → its rows).

    ``committed`` must hold every description a writer was told is committed (or
    already committed), and nothing else. Asserts:

    * state versions are exactly ``0..n`` (contiguous, none missing, none extra), each
      naming its own seqno; version 0 is the ``create``;
    * every later version is one commit whose lower is the previous upper and whose
      upper is the new header upper: the upper never decreases; or a maintenance commit
      (compact/since/retention) that keeps the upper, never moves since back, and only
      removes live batches;
    * each description id appears in exactly one version, and the set of committed
      description ids equals the model's: nothing lost, nothing duplicated, nothing
      phantom;
    * every part a live batch references exists (nothing referenced was deleted), and one
      recorded as sorted (no ``order``, or ``"sorted"``) is sorted and consolidated;
    * the updates in the referenced parts, read directly, equal the model's; and the
      library's snapshot at ``upper - 1`` and change feed over ``[initial, upper)``
      equal the model.
    """
    model = {d: list(rows) for d, rows in committed.items()}
    keys = sorted(o.key for o in blob.list("state/v/"))
    seqnos = [int(m.group(1)) for k in keys if (m := _VKEY.match(k))]
    assert len(seqnos) == len(keys), f"unexpected objects under state/v/: {keys}"
    assert seqnos == list(range(len(seqnos))), f"state versions are not contiguous 0..n: {seqnos}"
    versions: list[dict[str, Any]] = []
    for s in seqnos:
        got = blob.get(f"state/v/{s:020d}.json")
        assert got is not None, f"state version {s} vanished"
        d = json.loads(got.data)
        assert d["seqno"] == s, f"state/v/{s} claims seqno {d['seqno']}"
        versions.append(d)
    assert versions and versions[0]["commit"]["kind"] == "create", "version 0 is not the create"
    uppers: list[int | None] = [versions[0]["header"]["upper"]]
    live: dict[str, dict[str, Any]] = {}
    for prev, v in itertools.pairwise(versions):
        c, h = v["commit"], v["header"]
        assert c["kind"] in ("append", "close", *MAINTENANCE), f"seqno {v['seqno']}: unexpected commit kind {c['kind']}"
        assert h["since"] >= prev["header"]["since"], f"seqno {v['seqno']}: since went backwards"
        if c["kind"] in MAINTENANCE:
            # Maintenance never moves the upper; a compaction replaces live batches by one.
            assert h["upper"] == prev["header"]["upper"], f"seqno {v['seqno']}: {c['kind']} moved the upper"
            assert c["kind"] == "compact" or not (v["added"] or v["removed"]), f"seqno {v['seqno']}: batches changed"
            for gone in v["removed"]:
                assert gone in live, f"seqno {v['seqno']}: compaction removed {gone}, which was not live"
                live.pop(gone)
        else:
            assert not v["removed"], f"seqno {v['seqno']}: an append removed batches"
            assert c["lower"] == prev["header"]["upper"], (
                f"seqno {v['seqno']}: batch lower {c['lower']} != previous upper {prev['header']['upper']}"
            )
            # format 2: a close's record has no upper (format 1 stored None)
            assert h["upper"] == c.get("upper"), f"seqno {v['seqno']}: header upper {h['upper']} != commit upper"
            assert h["upper"] is None or h["upper"] > c["lower"], f"seqno {v['seqno']}: upper went backwards"
        for b in v["added"]:
            batch_id = c["compaction_id"] if "compaction_id" in c else c["desc_id"]  # format 2 / format 1
            assert b["desc_id"] == batch_id and b["seqno"] == v["seqno"], f"seqno {v['seqno']}: foreign batch"
            assert b["desc_id"] not in live, f"batch {b['desc_id']} added twice"
            live[b["desc_id"]] = b
        uppers.append(h["upper"])
    since = versions[-1]["header"]["since"]
    commits = [v["commit"] for v in versions[1:] if v["commit"]["kind"] not in MAINTENANCE]
    dup = {d: n for d, n in Counter(c["desc_id"] for c in commits).items() if n > 1}
    assert not dup, f"description ids committed more than once: {dup}"
    in_state = {c["desc_id"] for c in commits}
    assert in_state == set(model), (
        f"committed descriptions differ from the model: lost {sorted(set(model) - in_state)}, "
        f"phantom {sorted(in_state - set(model))}"
    )
    referenced = {p["key"] for b in live.values() for p in b["parts"]}
    parts = {o.key for o in blob.list("parts/")}
    missing = referenced - parts
    assert not missing, f"parts referenced by the state are missing: {sorted(missing)}"

    # The data, read straight from the referenced parts. A part recorded without an order (or
    # "sorted") must be consolidated and sorted; an "unordered" one may hold rows in any order.
    orders = {p["key"]: p.get("order", "sorted") for b in live.values() for p in b["parts"]}
    # A part recorded with diffs "ones" stores no _diff column: every row's diff is 1.
    ones = {p["key"] for b in live.values() for p in b["parts"] if p.get("diffs", "column") == "ones"}
    stored: Counter[tuple[str, int, int]] = Counter()
    for key in sorted(referenced):
        got = blob.get(key)
        assert got is not None, f"part {key} vanished"
        assert orders[key] in ("sorted", "unordered"), f"part {key} records an unknown order {orders[key]!r}"
        seen: list[tuple[tuple[bool, Any], ...]] = []  # (is null, value) per key: nulls sort last
        assert orders[key] == "unordered" or key not in ones, f"part {key} is sorted with implicit diffs"
        table = pq.read_table(pa.BufferReader(got.data))
        assert ("_diff" in table.column_names) != (key in ones), f"part {key} contradicts its recorded diffs"
        for r in table.to_pylist():
            r.setdefault("_diff", 1)
            assert r["_diff"] != 0, f"part {key} holds a zero diff"
            stored[(r["k"], r["n"], max(r["_time"], since))] += r["_diff"]
            seen.append(tuple((v is None, 0 if v is None else v) for v in (r["k"], r["n"], r["_time"])))
        if orders[key] == "sorted":
            assert all(a < b for a, b in itertools.pairwise(seen)), (
                f"part {key} is recorded as sorted but is not sorted and consolidated by (row, time)")
    stored = Counter({k: d for k, d in stored.items() if d != 0})
    everything = [row for rows in model.values() for row in rows]
    # Compaction may have advanced times below since to since: compare at that resolution.
    advanced = [(k, n, max(t, since), d) for k, n, t, d in everything]
    assert stored == consolidated(advanced), "updates in the parts differ from the model"

    # The same, through the library's reads.
    upper, initial = uppers[-1], uppers[0]
    shard = Shard(url or blob.url, blob=blob)
    if upper is not None and upper > 0 and since <= upper - 1:
        assert snapshot_counter(shard.snapshot(upper - 1)) == contents(everything, upper - 1)
        assert assert_int(initial) <= upper
        start = max(assert_int(initial), since)
        assert changes_counter(shard.changes(start, upper)) == consolidated(
            r for r in advanced if r[2] >= start)
    hint = blob.get("state/LATEST.json")
    if hint is not None:
        assert json.loads(hint.data)["seqno"] <= seqnos[-1], "the hint names a version that does not exist"
    return Audit(seqnos[-1], uppers, commits, referenced, parts, versions)


def assert_int(x: int | None) -> int:
    assert x is not None
    return x

