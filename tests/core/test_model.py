"""Model-based test: a shard behaves like a plain list of ``(row, time, diff)`` updates.

A hypothesis state machine drives one real shard and an in-memory model side by side:
appends of random small batches (inserts, retractions, repeated rows, multiplicities)
at the upper, empty appends, appends at a stale or future lower, retries of committed
description ids, fresh handles, and reads (``snapshot(as_of)`` for every valid as_of,
``changes(lower, upper)`` for every valid range) compared with the model. Invariants:
the seqno grows by exactly one per successful commit and never otherwise, the upper
never decreases. At the end :func:`support.audit` checks the stored objects.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support import SCHEMA, Row, audit, changes_counter, consolidated, contents, snapshot_counter, table_of

from shardsink import InvalidUsageError, ReadFrontierError, Shard, UpperMismatchError
from shardsink.storage.base import Blob
from shardsink.storage.local import LocalBlob
from shardsink.storage.s3 import S3Blob, make_client
from shardsink_dev.testing import MotoServer

BUCKET = "shardsink-test"
KEYS = ("a", "b", "c")


class ShardModel(RuleBasedStateMachine):
    """One shard (local folder or S3) against the list of updates it should hold."""

    def __init__(self, backend: str, moto: MotoServer | None = None) -> None:
        super().__init__()
        name = f"model-{uuid.uuid4().hex[:12]}"
        self.tmp: Path | None = None
        if backend == "local":
            self.tmp = Path(tempfile.mkdtemp(prefix="shardsink-model-"))
            self.url = (self.tmp / name).as_uri()
            self.direct: Blob = LocalBlob(self.tmp / name)
        else:
            assert moto is not None
            self.url = f"s3://{BUCKET}/{name}"
            self.direct = S3Blob(BUCKET, name, client=make_client(endpoint_url=moto.endpoint))
        self.updates: list[Row] = []
        self.committed: dict[str, list[Row]] = {}
        self.batches: dict[str, tuple[int, int, list[Row], int]] = {}  # desc → lower, upper, rows, seqno
        self.seqno = 0
        self.upper = 0
        self.start = 0
        self.seen_uppers: list[int] = []

    # --- helpers -----------------------------------------------------------------

    def _parts(self) -> set[str]:
        return {o.key for o in self.direct.list("parts/")}

    def _count(self, key: tuple[str, int]) -> int:
        return sum(d for k, n, _, d in self.updates if (k, n) == key)

    def _batch(self, data: st.DataObject, lower: int, upper: int) -> list[Row]:
        """Random updates in ``[lower, upper)`` that never make a multiplicity negative."""
        rows: list[Row] = []
        budget: dict[tuple[str, int], int] = {}
        for _ in range(data.draw(st.integers(0, 6), label="rows")):
            key = (data.draw(st.sampled_from(KEYS), label="k"), data.draw(st.integers(0, 2), label="n"))
            t = data.draw(st.integers(lower, upper - 1), label="time")
            have = budget.setdefault(key, self._count(key))
            if have > 0 and data.draw(st.booleans(), label="retract"):
                d = -data.draw(st.integers(1, have), label="retracted")
                budget[key] = have + d  # only what was committed before this batch
            else:
                d = data.draw(st.integers(1, 2), label="diff")
            rows.append((key[0], key[1], t, d))
        return rows

    def _time(self, data: st.DataObject, lo: int, hi: int, label: str) -> int:
        """A time in ``[lo, hi]``, half the time one where the model has updates (or next to one)."""
        near = sorted({t + d for _, _, t, _ in self.updates for d in (0, 1) if lo <= t + d <= hi})
        if near and data.draw(st.booleans(), label=f"{label} near data"):
            return data.draw(st.sampled_from(near), label=label)
        return data.draw(st.integers(lo, hi), label=label)

    def _append_ok(self, rows: list[Row], span: int) -> None:
        desc = f"d{len(self.batches)}-{uuid.uuid4().hex[:6]}"
        lower, upper = self.upper, self.upper + span
        r = self.shard.append(table_of(rows), lower=lower, upper=upper, desc_id=desc)
        assert (r.status, r.seqno) == ("committed", self.seqno + 1), r
        self.seqno += 1
        self.upper = upper
        self.updates.extend(rows)
        self.committed[desc] = rows
        self.batches[desc] = (lower, upper, rows, r.seqno)

    # --- rules ---------------------------------------------------------------------

    @initialize(start=st.integers(0, 20))
    def create(self, start: int) -> None:
        self.shard = Shard.create(self.url, SCHEMA, upper=start, blob=self.direct)
        self.start = self.upper = start

    @rule(span=st.integers(1, 5), data=st.data())
    def append_at_upper(self, span: int, data: st.DataObject) -> None:
        self._append_ok(self._batch(data, self.upper, self.upper + span), span)

    @rule(span=st.integers(1, 5))
    def empty_append_advances_upper(self, span: int) -> None:
        before = self._parts()
        self._append_ok([], span)
        assert self._parts() == before, "an empty batch writes no part"

    @rule(data=st.data(), span=st.integers(1, 5))
    def append_at_a_wrong_lower_is_refused(self, data: st.DataObject, span: int) -> None:
        choices = [x for x in range(max(0, self.start - 2), self.upper + 4) if x != self.upper]
        lower = data.draw(st.sampled_from(choices), label="wrong lower")
        rows = self._batch(data, lower, lower + span)  # staged, then deleted after the refusal
        parts = self._parts()
        with pytest.raises(UpperMismatchError) as e:
            self.shard.append(table_of(rows), lower=lower, upper=lower + span, desc_id=f"x-{uuid.uuid4().hex}")
        assert (e.value.expected, e.value.current) == (lower, self.upper)
        assert self._parts() == parts, "a refused append leaves no staged parts"

    @precondition(lambda self: bool(self.batches))
    @rule(data=st.data(), two_step=st.booleans())
    def retry_of_a_committed_description_is_already_committed(self, data: st.DataObject, two_step: bool) -> None:
        desc = data.draw(st.sampled_from(sorted(self.batches)), label="desc")
        lower, upper, rows, seqno = self.batches[desc]
        parts = self._parts()
        if two_step:
            staged = self.shard.stage(table_of(rows), lower=lower, upper=upper, desc_id=desc)
            r = self.shard.compare_and_append([staged], expected_upper=lower, new_upper=upper, desc_id=desc)
            assert self.shard.discard([staged]) == len(staged.parts)
        else:
            r = self.shard.append(table_of(rows), lower=lower, upper=upper, desc_id=desc)
        assert (r.status, r.seqno) == ("already_committed", seqno)
        assert self._parts() == parts

    @rule()
    def fresh_handle(self) -> None:
        self.shard = Shard(self.url, blob=self.direct)

    @precondition(lambda self: self.upper > 0)
    @rule(data=st.data())
    def snapshot_matches_model(self, data: st.DataObject) -> None:
        as_of = self._time(data, 0, self.upper - 1, "as_of")
        assert snapshot_counter(self.shard.snapshot(as_of)) == contents(self.updates, as_of)

    @rule(data=st.data())
    def snapshot_outside_frontiers_is_refused(self, data: st.DataObject) -> None:
        as_of = data.draw(st.integers(self.upper, self.upper + 3), label="as_of")
        with pytest.raises(ReadFrontierError):
            self.shard.snapshot(as_of)

    @rule(data=st.data())
    def changes_match_model(self, data: st.DataObject) -> None:
        lo = self._time(data, 0, self.upper, "lower")
        hi = self._time(data, lo, self.upper, "upper")
        got = changes_counter(self.shard.changes(lo, hi))
        assert got == consolidated(u for u in self.updates if lo <= u[2] < hi)

    @rule(data=st.data())
    def changes_beyond_upper_or_reversed_are_refused(self, data: st.DataObject) -> None:
        if data.draw(st.booleans(), label="reversed") and self.upper > 0:
            with pytest.raises(InvalidUsageError):
                self.shard.changes(self.upper, self.upper - 1)
        else:
            with pytest.raises(ReadFrontierError):
                self.shard.changes(0, self.upper + 1)

    # --- invariants ------------------------------------------------------------------

    @invariant()
    def seqno_counts_commits_and_upper_is_monotone(self) -> None:
        if not hasattr(self, "shard"):
            return
        info = self.shard.info()
        assert info.seqno == self.seqno, "the seqno grows by exactly one per successful commit"
        assert info.upper == self.upper
        assert not self.seen_uppers or self.seen_uppers[-1] <= info.upper, "the upper never decreases"
        self.seen_uppers.append(info.upper)

    def teardown(self) -> None:
        try:
            if hasattr(self, "shard"):
                a = audit(self.direct, self.committed, url=self.url)
                assert a.seqno == self.seqno and a.leaked == set()
        finally:
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)


def _settings(examples: int, steps: int) -> Any:
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def test_local_shard_behaves_like_a_list_of_updates() -> None:
    run_state_machine_as_test(lambda: ShardModel("local"), settings=_settings(30, 25))


def test_s3_shard_behaves_like_a_list_of_updates(moto: MotoServer) -> None:
    run_state_machine_as_test(lambda: ShardModel("s3", moto), settings=_settings(4, 12))
