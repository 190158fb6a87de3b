"""Property test: compaction and since advances never change what a reader can see.

Extends the core model test's state machine (:class:`core.test_model.ShardModel`: random
appends with retractions, retries, fresh handles) with appends of unordered parts (issue
20: rows as given, duplicates of ``(row, time)`` allowed; alone or mixed with sorted parts in
one batch), compactions (random fan-in, streaming or one-shot merges, a memory budget small
enough that unordered input spills sorted runs, or not) and since advances (retention or
explicit targets).
Around every compaction, ``snapshot(t)`` for every ``t >= since`` (every time that
matters: update times, since, upper - 1) and ``changes(a, b)`` for ``a >= since`` must be
identical before and after, and equal the model.

Comparing change feeds after since advanced (times < since may have been compacted
forward to since): the shard reads every time ``t < since`` as ``since``, so
``changes(a, b)`` is the model's updates with ``max(t, since)`` in ``[a, b)``,
consolidated; for ``a > since`` that is just the updates in ``[a, b)``.
"""

from __future__ import annotations

import shutil
import uuid
from collections import Counter
from typing import Any

import pytest
from core.test_model import ShardModel, _settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule, run_state_machine_as_test
from support import audit, changes_counter, consolidated, contents, snapshot_counter, table_of

from shardsink import ReadFrontierError
from shardsink.core.state import PartOrder
from shardsink.maintenance import CompactOptions, MergeOptions, ScheduleOptions, advance_since, compact, set_retention
from shardsink_dev.testing import MotoServer


class MaintainedShardModel(ShardModel):
    """The core model plus compaction and since."""

    def __init__(self, backend: str = "local", moto: MotoServer | None = None) -> None:
        super().__init__(backend, moto)
        self.since = 0
        self.retention: int | None = None
        self.compactions = 0

    # --- model views --------------------------------------------------------------

    def _advanced(self) -> list[tuple[str, int, int, int]]:
        return [(k, n, max(t, self.since), d) for k, n, t, d in self.updates]

    def _view(self) -> tuple[dict[int, Counter[Any]], dict[tuple[int, int], Counter[Any]]]:
        """Every snapshot that matters and a spread of change feeds, as the shard reads them."""
        times = sorted({max(t, self.since) for *_, t, _ in self.updates} | {self.since, self.upper - 1})
        times = [t for t in times if self.since <= t < self.upper]
        snaps = {t: snapshot_counter(self.shard.snapshot(t)) for t in times}
        edges = sorted({self.since, self.upper, *(t for t in times[::3])})
        feeds = {(a, b): changes_counter(self.shard.changes(a, b)) for a in edges[::2] for b in edges if a <= b}
        return snaps, feeds

    def _check_view(self, view: tuple[dict[int, Counter[Any]], dict[tuple[int, int], Counter[Any]]]) -> None:
        snaps, feeds = view
        for t, got in snaps.items():
            assert got == contents(self.updates, t), f"snapshot({t}) differs from the model"
        adv = self._advanced()
        for (a, b), got in feeds.items():
            assert got == consolidated(u for u in adv if a <= u[2] < b), f"changes({a}, {b}) differs from the model"

    # --- unordered appends ----------------------------------------------------------

    @precondition(lambda self: hasattr(self, "shard"))
    @rule(span=st.integers(1, 5), data=st.data(),
          orders=st.sampled_from([("unordered",), ("unordered", "sorted"), ("sorted", "unordered"),
                                  ("unordered", "unordered")]))
    def append_unordered_parts_at_upper(self, span: int, data: st.DataObject, orders: tuple[PartOrder, ...]) -> None:
        """One batch staged as unordered parts (the rows shuffled, a row repeated), alone or
        beside sorted parts of the same description."""
        rows = self._batch(data, self.upper, self.upper + span)
        if rows and data.draw(st.booleans(), label="repeat a (row, time)"):
            k, n, t, _ = rows[0]
            rows.append((k, n, t, 1))  # an insert never makes a multiplicity negative
        rows = data.draw(st.permutations(rows), label="row order")
        cut = data.draw(st.integers(0, len(rows)), label="cut") if len(orders) == 2 else len(rows)
        desc = f"u{len(self.batches)}-{uuid.uuid4().hex[:6]}"
        lower, upper = self.upper, self.upper + span
        staged = [self.shard.stage(table_of(piece), lower=lower, upper=upper, desc_id=desc, order=order)
                  for piece, order in zip((rows[:cut], rows[cut:]), orders, strict=False)]
        r = self.shard.compare_and_append(staged, expected_upper=lower, new_upper=upper, desc_id=desc)
        assert (r.status, r.seqno) == ("committed", self.seqno + 1), r
        self.seqno += 1
        self.upper = upper
        self.updates.extend(rows)
        self.committed[desc] = rows
        self.batches[desc] = (lower, upper, rows, r.seqno)

    # --- maintenance rules --------------------------------------------------------

    @precondition(lambda self: hasattr(self, "shard"))
    @rule(fan_in=st.integers(2, 4), streamed=st.booleans(), batch_rows=st.integers(1, 4),
          budget=st.sampled_from([1, 2_000, 1 << 30]))
    def compact_changes_nothing_visible(self, fan_in: int, streamed: bool, batch_rows: int, budget: int) -> None:
        before = self._view() if self.upper > self.since else None
        opts = CompactOptions(schedule=ScheduleOptions(fan_in=fan_in),
                              merge=MergeOptions(batch_rows=batch_rows, small_bytes=0 if streamed else 1 << 30,
                                                 memory_budget=budget))
        res = compact(self.shard, options=opts)
        assert all(m.status == "applied" for m in res.merges), res
        self.seqno += len(res.merges)
        self.compactions += len(res.merges)
        assert all(b.order == "sorted" for b in self.shard.batches()), "compaction left unordered parts"
        if before is not None:
            after = self._view()
            assert after == before, "a compaction changed a snapshot or a change feed"
            self._check_view(after)

    @precondition(lambda self: hasattr(self, "shard") and self.upper > self.since + 1)
    @rule(data=st.data(), by_retention=st.booleans())
    def advance_since_keeps_later_reads(self, data: st.DataObject, by_retention: bool) -> None:
        if by_retention:
            self.retention = data.draw(st.integers(1, max(1, self.upper - self.since)), label="retention")
            if set_retention(self.shard, self.retention):
                self.seqno += 1
            r = advance_since(self.shard)
            expected = max(self.since, self.upper - self.retention)
        else:
            target = data.draw(st.integers(self.since, self.upper - 1), label="since target")
            r = advance_since(self.shard, target=target)
            # since = min(target, upper - retention): the retention window holds it back too.
            cap = target if self.retention is None else min(target, self.upper - self.retention)
            expected = max(self.since, cap)
        assert r.after == expected, r
        if r.seqno is not None:
            self.seqno += 1
        self.since = r.after
        self._check_view(self._view())

    # --- reads, adapted to since ----------------------------------------------------

    @precondition(lambda self: self.upper > 0)
    @rule(data=st.data())
    def snapshot_matches_model(self, data: st.DataObject) -> None:
        if self.upper <= self.since:
            return
        as_of = self._time(data, self.since, self.upper - 1, "as_of")
        assert snapshot_counter(self.shard.snapshot(as_of)) == contents(self.updates, as_of)
        if self.since > 0:
            with pytest.raises(ReadFrontierError, match="since"):
                self.shard.snapshot(self.since - 1)

    @rule(data=st.data())
    def changes_match_model(self, data: st.DataObject) -> None:
        lo = self._time(data, self.since, self.upper, "lower")
        hi = self._time(data, lo, self.upper, "upper")
        got = changes_counter(self.shard.changes(lo, hi))
        assert got == consolidated(u for u in self._advanced() if lo <= u[2] < hi)
        if self.since > 0:
            with pytest.raises(ReadFrontierError, match="since"):
                self.shard.changes(self.since - 1, hi)

    def teardown(self) -> None:
        try:
            if hasattr(self, "shard"):
                a = audit(self.direct, self.committed, url=self.url)
                assert a.seqno == self.seqno
                # Compacted-away inputs stay until GC; nothing else may be unreferenced.
                replaced = {p["key"] for v in a.versions for b in v["added"] for p in b["parts"]} - a.referenced
                assert a.leaked <= replaced, f"unreferenced parts that no batch ever held: {a.leaked - replaced}"
        finally:
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)


def test_compaction_and_since_never_change_a_snapshot_or_change_feed_at_or_after_since() -> None:
    run_state_machine_as_test(MaintainedShardModel, settings=_settings(25, 30))


def test_on_s3_compaction_and_since_never_change_a_snapshot_or_change_feed_at_or_after_since(
        moto: MotoServer) -> None:
    # Fewer, shorter runs than on the local folder: every step is HTTP to moto (suite time).
    run_state_machine_as_test(lambda: MaintainedShardModel("s3", moto), settings=_settings(4, 15))
