"""The landing world: a producer landing Parquet files in a simulated S3 zone, and its model.

The zone is ``s3://sim-landing/zone`` (:class:`shardsink.sources.landing.LandingSource` reads it
through the served store, listing, indexing and planning with the library's own code). The
:class:`Producer` is an actor that, interval after interval, lands the interval's files and then
publishes the watermark past it (``_watermark.json``), as the watermark contract asks. With
``Plan.producer`` it also misbehaves after a publication: it lands a **late** file (times below
the watermark it published), **rewrites** a file (new bytes under an old key) or **restores** one
(an earlier version's exact bytes: S3 gives back the same ETag, with a new LastModified).

Every row is ``(k, n)`` with ``k`` naming its file version's content and ``n`` its event time, so
the model (:class:`ZoneModel`) knows where each row came from. Its rule, from the watermark
contract alone (never from the library's code): a landing of a key (a new file, a rewrite or a
restore) is *on time* when the watermark published then is at or below the earliest time of both
the old and the new bytes (nothing of either can have been sealed); a key all of whose landings
were on time must never be refused. At the end, after a clean drain past every time
(:func:`shardsink_dev.sim.zone_slot.drain`): every row of the bytes a key holds at the end is in the
shard exactly once unless the key was refused (an operator then moved it out), and no row is in
the shard twice or comes from nowhere (every landed row is ingested exactly once or its file is
refused, never silently dropped).
"""

from __future__ import annotations

import io
import json
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from shardsink.sources.landing import WATERMARK_KEY
from shardsink_dev.sim.ctx import LANDING_BUCKET, LANDING_URL, Sim
from shardsink_dev.sim.sched import Actor

#: The zone's key prefix in its bucket.
ZONE = LANDING_URL.split("/", 3)[3]
TIME_COLUMN = "event_time"


@dataclass(frozen=True)
class Content:
    """One version's bytes of a landed file: its rows ``(k, n)`` (``n`` is the event time)."""

    cid: int
    rows: tuple[tuple[str, int], ...]
    data: bytes

    @property
    def tmin(self) -> int:
        return min(n for _, n in self.rows)


@dataclass
class ZoneModel:
    """What was landed, when, and whether on time (module docstring)."""

    contents: list[Content] = field(default_factory=list)
    current: dict[str, Content | None] = field(default_factory=dict)  # key -> its bytes now (None: moved out)
    history: dict[str, list[Content]] = field(default_factory=dict)
    late: set[str] = field(default_factory=set)  # keys with a landing that was not on time
    watermark: int = 0

    def content(self, times: list[int]) -> Content:
        cid = len(self.contents)
        rows = tuple((f"c{cid}.{j}", t) for j, t in enumerate(times))
        table = pa.table({"k": [k for k, _ in rows], "n": [t for _, t in rows],
                          TIME_COLUMN: pa.array([t for _, t in rows], pa.int64())})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        c = Content(cid, rows, buf.getvalue())
        self.contents.append(c)
        return c

    def landed(self, key: str, c: Content) -> None:
        old = self.current.get(key)
        if self.watermark > min(c.tmin, old.tmin if old is not None else c.tmin):
            self.late.add(key)
        self.current[key] = c
        self.history.setdefault(key, []).append(c)

    def expected(self, upper: int, refused: set[str]) -> tuple[Counter[tuple[str, int]], set[tuple[str, int]]]:
        """The rows that must be in the shard once (below ``upper``), and every row that may be."""
        must: Counter[tuple[str, int]] = Counter()
        for key, c in self.current.items():
            if c is not None and key not in refused:
                must.update(r for r in c.rows if r[1] < upper)
        may = {r for c in self.contents for r in c.rows}
        return must, may


class Producer:
    """The zone's producer (module docstring): one actor per interval, ``period`` seconds apart."""

    def __init__(self, sim: Sim, model: ZoneModel, *, period: float, intervals: int) -> None:
        self.sim, self.model, self.period, self.intervals = sim, model, period, intervals
        self.files = 0

    def start(self) -> None:
        self._step(0, 0.0)

    def _step(self, i: int, delay: float) -> None:
        def end(a: Actor) -> None:
            self._judged(a)  # the producer is not under test: it never fails
            if i + 1 < self.intervals:
                self._step(i + 1, self.period)
        self.sim.sched.spawn(f"producer{i}", lambda: self._interval(i), delay=delay, crashable=False, on_end=end)

    def _interval(self, i: int) -> None:
        tape, width = self.sim.tape, self.sim.plan.interval
        lo = i * width
        mine = []
        for _ in range(1 + tape.draw(2)):
            span = width * (2 if tape.chance(200) and i + 1 < self.intervals else 1)
            times = sorted({lo + tape.draw(span) for _ in range(1 + tape.draw(3))})
            mine.append(f"f{self.files}.parquet")
            self.land(mine[-1], self.model.content(times))
            self.files += 1
        if tape.chance(150):  # rewritten before the watermark passes it: on time
            self.land(mine[0], self.model.content(sorted({lo + tape.draw(width) for _ in range(2)})))
        self.publish((i + 1) * width)
        for j in range(self.sim.plan.producer):  # later, at their own times, while runs read the zone
            self.sim.sched.spawn(f"producer{i}.{j}", lambda: self._misbehave(), delay=tape.pick((1.0, 10.0, 40.0)),
                                 crashable=False, on_end=self._judged)

    def _judged(self, a: Actor) -> None:
        if a.error is not None:
            raise self.sim.violation("producer-failed", f"{type(a.error).__name__}: {a.error}")

    def _misbehave(self) -> None:
        tape, m = self.sim.tape, self.model
        wm = m.watermark
        what = tape.draw(4)
        keys = sorted(k for k, c in m.current.items() if c is not None)
        if what == 1:  # a late file: times below the published watermark
            base = max(0, wm - 2 * self.sim.plan.interval)
            self.land(f"f{self.files}.parquet", m.content([base + tape.draw(wm - base)]))
            self.files += 1
        elif what == 2 and keys:  # rewritten in place
            key = keys[tape.draw(len(keys))]
            old = m.current[key]
            assert old is not None
            self.land(key, m.content(sorted({n for _, n in old.rows} | {old.tmin + tape.draw(20)})))
        elif what == 3 and keys:  # an earlier version's exact bytes restored
            key = keys[tape.draw(len(keys))]
            self.land(key, m.history[key][0])

    def land(self, key: str, c: Content) -> None:
        """Put ``c`` at ``key`` (the producer's own request, ordered by the scheduler like any other)."""
        self.sim.sched.request("put", f"{LANDING_URL}/{key}")
        self.sim.world.write("put", LANDING_BUCKET, f"{ZONE}/{key}", c.data)
        self.model.landed(key, c)

    def publish(self, watermark: int) -> None:
        self.sim.sched.request("put", f"{LANDING_URL}/{WATERMARK_KEY}")
        self.sim.world.write("put", LANDING_BUCKET, f"{ZONE}/{WATERMARK_KEY}",
                             json.dumps({"watermark": watermark}).encode())
        self.model.watermark = max(self.model.watermark, watermark)

    def remove(self, key: str) -> None:
        """An operator moves a refused file out of the zone."""
        self.sim.world.write("delete", LANDING_BUCKET, f"{ZONE}/{key}", None)
        self.model.current[key] = None
