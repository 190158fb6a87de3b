"""Bindings, stamping and the remap shard without Spark: the rules every reclocked source relies on."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from shardsink.errors import CorruptionError, InvalidUsageError
from shardsink.reclock.bindings import Binding, Bindings, spans, split
from shardsink.reclock.remap import Proposal, RemapShard


def test_each_offset_gets_the_earliest_binding_time_that_covers_it_whatever_the_descriptions() -> None:
    rnd = random.Random(3)
    history, f, t = [], {"0": 0, "1": 0}, 100
    for _ in range(30):
        t += rnd.randrange(1, 5)
        f = {p: o + rnd.randrange(0, 4) for p, o in f.items()}
        history.append(Binding(t, dict(f)))
    b = Bindings(upper=t + 1, since=0, history=tuple(history))
    want = {}
    for h in reversed(history):  # the earliest covering binding wins
        for p, end in h.frontier.items():
            for o in range(end):
                want[(p, o)] = h.time
    for _ in range(20):  # any cut of the time line into descriptions stamps the same way
        cuts = sorted({100, t + 1, *rnd.sample(range(101, t + 1), 5)})
        got: dict[tuple[str, int], int] = {}
        for lo, hi in itertools.pairwise(cuts):
            for slot in range(3):
                for s in split(spans(b, lo, hi), slot=slot, slots=3, chunk=2):
                    assert lo <= s.time < hi
                    for o in range(s.start, s.end):
                        assert (s.partition, o) not in got, "an offset was read twice"
                        got[(s.partition, o)] = s.time
        assert got == want


def test_spans_refuse_unbound_times_and_frontiers_never_move_back(tmp_path: object) -> None:
    b = Bindings(upper=110, since=0, history=(Binding(105, {"0": 3}),))
    with pytest.raises(InvalidUsageError, match="not bound yet"):
        spans(b, 100, 111)
    remap = RemapShard.open_or_create(f"file://{tmp_path}/remap", initial_upper=100)
    remap.bind_through(110, lambda _: Proposal({"0": 5}))
    with pytest.raises(CorruptionError, match="moved back"):
        remap.bind_through(120, lambda _: Proposal({"0": 4}))
    assert RemapShard.open(f"file://{tmp_path}/remap").bindings().upper == 110, "nothing was bound"


def test_a_time_that_has_a_binding_is_never_bound_again(tmp_path: object) -> None:
    remap = RemapShard.open_or_create(f"file://{tmp_path}/remap", initial_upper=0)
    first = remap.bind_through(50, lambda _: Proposal({"0": 5}))
    calls = Counter[str]()

    def later(_: Bindings) -> Proposal:
        calls["propose"] += 1
        return Proposal({"0": 99})

    again = RemapShard.open(f"file://{tmp_path}/remap").bind_through(40, later)
    assert not again.minted and calls["propose"] == 0
    assert again.bindings.frontier_at(49) == first.bindings.frontier_at(49) == {"0": 5}
