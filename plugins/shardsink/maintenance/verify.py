"""``verify``: check a shard's retained state and data end to end, and classify its objects.

Problems (each names its object; any problem makes ``shardsink verify`` exit 4):

* a retained state version that does not decode, claims another seqno, or is missing
  from the chain ``[oldest, head]`` (or exists beyond a gap after the head);
* an upper that moves back, a since that moves back, or ``since > upper``;
* the hint (``state/LATEST.json``) unreadable or pointing below the oldest version;
* a rollup the head needs that is missing;
* a referenced part that is missing, has another byte size or another row count than
  the state records;
* a negative multiplicity as of ``since`` (the oldest readable time) or ``upper − 1``;
* on a shard with no other problem, a retained history GC cannot classify objects by.

Objects (neither problems nor ever deleted here): every object is live, awaiting GC, in flight or
leaked, as :func:`shardsink.maintenance.census_read.take_census` says (the one classification
the Shards page, ``inspect --objects`` and GC's dry run show too): :attr:`VerifyReport.leaks`
and :attr:`VerifyReport.in_flight` are its leaked and in-flight objects.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shardsink.core import after_commit
from shardsink.core import checks as ck
from shardsink.core import state as st
from shardsink.core.admin import AdminHandle
from shardsink.core.census import Census, Classified
from shardsink.core.roots import RootObjects
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError, ShardsinkError
from shardsink.maintenance.census_read import take_census
from shardsink.maintenance.gc_types import DEFAULT_GRACE_S
from shardsink.maintenance.history import Listing, batches_at, list_state, retained_start

#: The exit code of ``shardsink verify`` when it finds problems.
EXIT_PROBLEMS = 4


@dataclass(frozen=True)
class Problem:
    object: str  # the object key (relative to the shard), or "<url> as_of T"
    message: str


@dataclass(frozen=True)
class Leak:
    """A leaked object (:mod:`shardsink.core.census`)."""

    object: str
    kind: str  # part | manifest | rollup | version | lease | unknown
    bytes: int
    age_s: float


@dataclass(frozen=True)
class InFlight:
    """A staged object that is not leaked: ``why`` says what may still commit or delete it."""

    object: str
    kind: str  # part | manifest
    bytes: int
    age_s: float
    why: str


@dataclass(frozen=True)
class VerifyReport:
    url: str
    head: int | None
    oldest: int | None
    versions: int
    parts: int
    problems: tuple[Problem, ...]
    #: Every object in its class (None: it could not be classified; a problem says why).
    objects: Census | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def leaks(self) -> tuple[Leak, ...]:
        return tuple(Leak(o.key, o.kind, o.bytes, o.age_s) for o in self._of("leaked"))

    @property
    def in_flight(self) -> tuple[InFlight, ...]:
        return tuple(InFlight(o.key, o.kind, o.bytes, o.age_s, o.why) for o in self._of("in_flight"))

    def _of(self, cls: str) -> tuple[Classified, ...]:
        return () if self.objects is None else tuple(o for o in self.objects.objects if o.cls == cls)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url, "ok": self.ok, "head": self.head, "oldest": self.oldest, "versions": self.versions,
            "parts": self.parts, "problems": [asdict(p) for p in self.problems],
            "leaks": [asdict(x) for x in self.leaks], "in_flight": [asdict(x) for x in self.in_flight],
            "objects": None if self.objects is None else self.objects.to_dict(),
        }


def verify(shard: Shard, *, check_rows: bool = True, now: float | None = None,
           grace_s: float = DEFAULT_GRACE_S) -> VerifyReport:
    """Run every check (module docstring). ``check_rows`` reads each part's footer (one GET each).
    ``now`` and ``grace_s``: the clock and grace period objects are classified at."""
    ck.check_seconds(grace_s, what="grace period")
    t = time.time() if now is None else now
    m = shard.admin()
    problems: list[Problem] = []
    # The head first, then the listing: a version committed in between is listed, not a gap.
    head_version: st.Version | None = None
    try:
        head_version = m.head()
    except ShardsinkError as e:
        problems.append(Problem(m.hint_object, f"cannot find the head: {e}"))
    head = head_version.seqno if head_version is not None else None
    listing = list_state(m)
    oldest = listing.oldest
    if oldest is None:
        return VerifyReport(shard.url, None, None, 0, 0, (Problem(m.versions_folder, "no state versions"),))
    if head is None:
        head = max(listing.versions)
    while head + 1 in listing.versions:  # committed while we listed
        head += 1
    try:
        # Versions an interrupted GC left below a gap under its anchored version are leaked.
        oldest = retained_start(m, listing, head)
    except CorruptionError:
        for s in listing.gaps(head):
            problems.append(Problem(m.version_object(s),
                                    f"missing from the chain of retained versions [{oldest}, {head}]"))
    for s in sorted(x for x in listing.versions if x > head):
        problems.append(Problem(m.version_object(s), f"exists beyond the head {head} (after a gap in the chain)"))

    versions = _decode_all(m, oldest, head, listing, problems)
    _check_chain(m, versions, problems)
    _check_hint(m, oldest, problems)

    refs = _referenced(m, versions, listing, problems)
    if head_version is not None:
        base = head_version.header.rollup
        if base > 0 and base not in listing.rollups:
            problems.append(Problem(m.rollup_object(base),
                                    f"missing; the head (version {head}) reads its batches from it"))

    listed = {o.key: o.info for o in m.list_parts()}
    _check_parts(m, refs, listed, problems, check_rows=check_rows)
    if not any(m.is_part(p.object) for p in problems) and head in versions:
        _check_multiplicity(shard, versions[head].header, problems)
    if head in versions and versions[head].header.options:  # derived views (the Iceberg view) check themselves
        views = after_commit.check_views(shard.url, versions[head], RootObjects(shard.url))
        problems += [Problem(obj, what) for obj, what in views]
    objects = _classified(shard, problems, now=t, grace_s=grace_s)
    return VerifyReport(shard.url, head, oldest, len(versions), len(refs), tuple(problems), objects)


def _classified(shard: Shard, problems: list[Problem], *, now: float, grace_s: float) -> Census | None:
    """The shard's objects in their classes; None if they cannot be classified (a problem, unless
    another one already says what is wrong with the history)."""
    try:
        return take_census(shard, now=now, grace_s=grace_s)
    except ShardsinkError as e:
        if not problems:
            problems.append(Problem(shard.url, f"its objects cannot be classified (GC could not collect them): {e}"))
        return None


def _decode_all(m: AdminHandle, oldest: int, head: int, listing: Listing,
                problems: list[Problem]) -> dict[int, st.Version]:
    wanted = [s for s in range(oldest, head + 1) if s in listing.versions]

    def one(s: int) -> tuple[int, st.Version | None]:
        try:
            return s, m.fetch(s)
        except ShardsinkError as e:
            problems.append(Problem(m.version_object(s), str(e)))
            return s, None

    with ThreadPoolExecutor(max_workers=16) as pool:
        got = list(pool.map(one, wanted))
    return {s: v for s, v in got if v is not None}


def _check_chain(m: AdminHandle, versions: dict[int, st.Version], problems: list[Problem]) -> None:
    prev: st.Version | None = None
    for s in sorted(versions):
        v = versions[s]
        h = v.header
        if h.upper is not None and h.since > h.upper:
            problems.append(Problem(m.version_object(s), f"since {h.since} is past upper {h.upper}"))
        if prev is not None and prev.seqno == s - 1:
            p = prev.header
            if (p.upper is None and h.upper is not None) or (
                    p.upper is not None and h.upper is not None and h.upper < p.upper):
                problems.append(Problem(m.version_object(s), f"upper moved back from {p.upper} (version {prev.seqno}) "
                                                             f"to {h.upper}"))
            if h.since < p.since:
                problems.append(Problem(m.version_object(s), f"since moved back from {p.since} to {h.since}"))
        prev = v


def _check_hint(m: AdminHandle, oldest: int, problems: list[Problem]) -> None:
    try:
        hint = m.hint()
    except CorruptionError as e:
        problems.append(Problem(m.hint_object, str(e)))
        return
    if hint is None:
        return  # readers list the versions; not a problem
    if hint.seqno < oldest:
        problems.append(Problem(m.hint_object, f"points at version {hint.seqno}, below the oldest retained {oldest}"))


def _referenced(m: AdminHandle, versions: dict[int, st.Version], listing: Listing,
                problems: list[Problem]) -> dict[str, tuple[st.PartMeta, int]]:
    """Parts referenced by the retained versions, from the oldest version whose batch list is
    computable (an interrupted GC may leave older, condemned versions above a broken chain)."""
    refs: dict[str, tuple[st.PartMeta, int]] = {}
    if not versions:
        return refs
    lo, hi = min(versions), max(versions)
    candidates = [lo, *sorted(r for r in listing.rollups if lo < r <= hi)]
    for start in candidates:
        try:
            base = batches_at(m, start, listing)
        except CorruptionError as e:
            last = e
            continue
        for b in base:
            for p in b.parts:
                refs.setdefault(p.key, (p, start))
        for s in range(start + 1, hi + 1):
            v = versions.get(s)
            for b in v.added if v is not None else ():
                for p in b.parts:
                    refs.setdefault(p.key, (p, s))
        return refs
    problems.append(Problem(m.version_object(lo), f"no retained version's batch list can be computed: {last}"))
    return refs


def _check_parts(m: AdminHandle, refs: dict[str, tuple[st.PartMeta, int]], listed: dict[str, Any],
                 problems: list[Problem], *, check_rows: bool) -> None:
    def one(item: tuple[str, tuple[st.PartMeta, int]]) -> Problem | None:
        key, (p, seqno) = item
        o = listed.get(key)
        if o is None:
            return Problem(key, f"missing (referenced by version {seqno})")
        if o.size != p.bytes:
            return Problem(key, f"has {o.size} bytes, the state records {p.bytes} (version {seqno})")
        if not check_rows:
            return None
        got = m.get(key)
        if got is None:
            return Problem(key, f"vanished while verifying (referenced by version {seqno})")
        try:
            rows = pq.read_metadata(pa.BufferReader(got)).num_rows
        except (pa.ArrowException, OSError) as e:
            return Problem(key, f"is not readable Parquet ({e})")
        if rows != p.rows:
            return Problem(key, f"has {rows} rows, the state records {p.rows} (version {seqno})")
        return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        problems.extend(x for x in pool.map(one, sorted(refs.items())) if x is not None)


def _check_multiplicity(shard: Shard, h: st.Header, problems: list[Problem]) -> None:
    times = []
    if h.upper is None:
        times.append(h.since)
    elif h.since < h.upper:
        times.extend(sorted({h.since, h.upper - 1}))
    for t in times:
        try:
            shard.snapshot(t)
        except CorruptionError as e:
            problems.append(Problem(f"{shard.url} as_of {t}", str(e)))
        except ShardsinkError as e:
            problems.append(Problem(f"{shard.url} as_of {t}", f"cannot read: {e}"))
