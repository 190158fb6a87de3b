"""What the Shards page shows, as JSON-able dicts: read from the shards themselves (no Airflow imports).

Every function here only READS shard state (state versions, part and lease listings);
none writes or deletes anything. Shard URLs name a bucket and a prefix or a local folder,
never credentials (:mod:`shardsink.storage.url` refuses anything else), so they are safe
to show.

Cost per shard: ``summary`` = one head read and the classification of its objects
(:func:`shardsink.maintenance.census_read.take_census`: one listing of the shard, GC's horizon,
the retained removals and the fates of unreferenced descriptions; the only answer to "what is
leaked" or "awaiting GC"); ``detail`` adds one read per state version shown (bounded by ``limit``) and,
for the staged-but-waiting band, one listing of ``staging/`` and one manifest read per staged
description; ``preview`` = a full snapshot read (bounded by the shard's size; meant for
small/medium shards and on-call inspection, not for bulk export); ``schema_history`` = one
head read.
The schema history is the JSON ``shardsink schema URL --json`` prints
(:func:`shardsink.cli_schema.entry_json`).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import hashlib
import math
from typing import Any

from shardsink.cli_schema import entry_json
from shardsink.core import schema as sch
from shardsink.core import state as st
from shardsink.core.census import Census
from shardsink.core.commits import Commit
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError
from shardsink.maintenance.census_read import take_census
from shardsink.maintenance.gc_types import DEFAULT_GRACE_S
from shardsink.sinks.waiting import waiting_json
from shardsink.storage.url import parse_url

#: Commits shown on a shard's page (newest first); the chart uses the same versions.
DEFAULT_HISTORY = 200
#: Rows shown by the snapshot preview.
PREVIEW_ROWS = 100
WRITER_PREFIX = "airflow:"


def shard_id(url: str) -> str:
    """A short, URL-safe, stable id of a (normalised) shard URL: the page's address of the shard."""
    return hashlib.sha256(str(parse_url(url)).encode()).hexdigest()[:16]


def iso(ms: int | None) -> str | None:
    """A time in ms since the epoch as an ISO-8601 UTC string (None stays None: the empty frontier)."""
    if ms is None:
        return None
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def dag_run_of(writer: str) -> tuple[str, str] | None:
    """``(dag_id, run_id)`` of a commit written by a DAG run (writer ``airflow:<dag_id>/<run_id>``)."""
    if not writer.startswith(WRITER_PREFIX) or "/" not in writer:
        return None
    dag_id, _, run_id = writer[len(WRITER_PREFIX):].partition("/")
    return (dag_id, run_id) if dag_id and run_id else None


def _commit(seqno: int, c: Commit, *, upper: int | None, since: int) -> dict[str, Any]:
    """A commit for the Shards page: its record's own fields, what it did in words, and the
    batch it committed (``desc_id``, ``lower``/``upper`` and their times, ``rows``; None for
    a kind that commits no batch)."""
    run = dag_run_of(c.writer)
    b = c.batch()
    return {
        **c.to_json(), "seqno": seqno, "what": c.describe(), "desc_id": b[0] if b else None,
        "lower": b[1] if b else None, "upper": b[2] if b else None, "rows": b[3] if b else None,
        "lower_time": iso(b[1]) if b else None, "upper_time": iso(b[2]) if b else None,
        "shard_upper": upper, "shard_since": since,
        "dag_id": run[0] if run else None, "run_id": run[1] if run else None,
    }


def summary(url: str, *, grace_s: float = DEFAULT_GRACE_S, now: float | None = None) -> dict[str, Any]:
    """One row of the shard list: frontiers, sizes, retention, leases, its objects by class
    (``objects``: counts and bytes, no list) and the last commit."""
    row, _, _ = _summary(Shard.open(url), url, grace_s=grace_s, now=now)
    return row


def _summary(shard: Shard, url: str, *, grace_s: float, now: float | None
             ) -> tuple[dict[str, Any], Census | None, st.Version]:
    """The list row, the classification behind its ``objects`` and the head it describes."""
    v = shard.reader().head()
    h = v.header
    retention = getattr(h, "retention", None)  # added by maintenance; absent on older shards
    leases = shard.leases()
    census: Census | None = None
    error = None
    try:
        census = take_census(shard, now=now, grace_s=grace_s)
    except CorruptionError as e:  # the page still shows the shard; verify names what is broken
        error = f"its objects cannot be classified: {e}"
    return {
        "id": shard_id(url), "url": shard.url, "exists": True,
        "seqno": v.seqno, "upper": h.upper, "upper_time": iso(h.upper), "closed": h.upper is None,
        "since": h.since, "since_time": iso(h.since),
        "batches": h.stats.batches, "parts": h.stats.parts, "rows": h.stats.rows, "bytes": h.stats.bytes,
        "retention_ms": retention, "leases": len(leases),
        "objects": None if census is None else census.to_dict(listed=False), "objects_error": error,
        "schema": [{"name": f.name, "type": str(f.type)} for f in h.schema], "schema_id": sch.current(h).id,
        "last_commit": _commit(v.seqno, v.commit, upper=h.upper, since=h.since),
    }, census, v


def missing(url: str) -> dict[str, Any]:
    """The list row of a configured or declared shard that has not been created yet."""
    return {"id": shard_id(url), "url": str(parse_url(url)), "exists": False}


def detail(url: str, *, limit: int = DEFAULT_HISTORY, grace_s: float = DEFAULT_GRACE_S,
           now: float | None = None) -> dict[str, Any]:
    """A shard's page: its summary, the last ``limit`` commits back to the oldest retained version (newest
    first, each with the shard's upper and since after it: the chart's points), the schema history
    (oldest first, as of the summary's seqno), the descriptions staged at or ahead of the upper (a
    backfill's band of intervals waiting to append in order:
    :func:`shardsink.sinks.waiting.waiting_json`, each with its ``lower_time`` / ``upper_time``; reads
    only, never a fate: one may have committed since), live leases, and every object but the live ones
    in its class (``objects.objects``: awaiting GC with when GC may take it, in flight, leaked;
    :mod:`shardsink.core.census`)."""
    shard = Shard.open(url)
    out, census, head = _summary(shard, url, grace_s=grace_s, now=now)
    versions = shard.reader().history(limit=limit, head=head)  # back to the oldest retained version
    out["schema_history"] = [entry_json(e) for e in sch.history(versions[0].header)]
    out["commits"] = [_commit(v.seqno, v.commit, upper=v.header.upper, since=v.header.since) for v in versions]
    out["history_complete"] = versions[-1].seqno == 0
    out["staged_waiting"] = [{**w, "lower_time": iso(w["lower"]), "upper_time": iso(w["upper"])}
                             for w in waiting_json(shard, out["upper"])]
    out["lease_list"] = [
        {"lease_id": ls.lease_id, "as_of": ls.as_of, "as_of_time": iso(ls.as_of), "holder": ls.holder,
         "acquired_at": iso(int(ls.acquired_at * 1000)), "expires_at": iso(int(ls.expires_at * 1000))}
        for ls in shard.leases()
    ]
    if census is not None:
        out["objects"] = census.to_dict()
    return out


def schema_history(url: str) -> dict[str, Any]:
    """The shard's schema history (oldest first), as ``shardsink schema URL --json`` prints it."""
    shard = Shard.open(url)
    return {"id": shard_id(url), "url": shard.url, "schemas": [entry_json(e) for e in shard.schema_history()]}


def commits_by(url: str, writer: str, *, limit: int = 50) -> list[dict[str, Any]]:
    """The commits among the last ``limit`` whose writer is ``writer`` (newest first)."""
    shard = Shard.open(url)
    return [_commit(s, c, upper=b[2] if (b := c.batch()) else None, since=-1)
            for s, c in shard.log(limit=limit) if c.writer == writer]


def _cell(value: Any) -> Any:
    """A JSON-safe rendering of one Arrow value."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | dt.timedelta):
        return str(value)
    if isinstance(value, list | tuple):
        return [_cell(x) for x in value]
    if isinstance(value, dict):
        return {str(k): _cell(x) for k, x in value.items()}
    return str(value)


def preview(url: str, *, as_of: int | None = None, rows: int = PREVIEW_ROWS) -> dict[str, Any]:
    """The first ``rows`` rows of the snapshot as of ``as_of`` (default upper - 1), with ``_count``.

    ReadFrontierError (from the shard) if ``as_of`` is outside ``[since, upper)``.
    """
    shard = Shard.open(url)
    table = shard.snapshot(as_of)
    h = shard.reader().head().header
    used = as_of if as_of is not None else (h.upper - 1 if h.upper is not None else None)
    head = table.slice(0, rows)
    return {
        "as_of": used, "as_of_time": iso(used), "total_rows": table.num_rows, "columns": head.column_names,
        "rows": [[_cell(r[c]) for c in head.column_names] for r in head.to_pylist()],
    }
