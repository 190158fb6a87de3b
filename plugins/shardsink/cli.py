"""The ``shardsink`` command line: a contract for operators and scripts.

Exit codes: 0 success (including *already committed*), 1 any other failure,
2 invalid usage or bad input (nothing written), 3 upper mismatch (nothing appended;
stderr names the current upper), 4 ``verify`` found problems (each names its object),
5 a description's fate is unknown (its evidence is older than the retained history),
130 interrupted (Ctrl-C). ``gc --desc`` and ``drop`` live in :mod:`shardsink.cli_admin`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import pyarrow as pa

from shardsink import cli_admin, cli_iceberg, cli_schema
from shardsink import io as sio
from shardsink.cli_args import build_parser
from shardsink.core import after_commit
from shardsink.core.census import Census
from shardsink.core.commits import Commit
from shardsink.core.shard import Shard
from shardsink.core.state_codec import schema_to_json
from shardsink.core.updates import DIFF, TIME, user_schema
from shardsink.errors import InvalidUsageError, ShardsinkError


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[("-" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(list(headers)), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def inspect_json(shard: Shard) -> dict[str, Any]:
    info = shard.info()
    return {
        "url": info.url,
        "seqno": info.seqno,
        "upper": info.upper,
        "closed": info.upper is None,
        "since": info.since,
        "retention": info.retention,
        "batches": info.stats.batches,
        "parts": info.stats.parts,
        "rows": info.stats.rows,
        "bytes": info.stats.bytes,
        "schema": schema_to_json(info.schema)["fields"],
        "last_commit": {"seqno": info.seqno, **_commit_json(info.last_commit)},
    }


def _commit_json(c: Commit) -> dict[str, Any]:
    return c.to_json()


def _compact(shard: Shard, args: argparse.Namespace) -> int:
    from shardsink import maintenance as mt

    since = None if args.no_since else mt.advance_since(shard)
    res = mt.compact(shard)
    if args.json:
        print(json.dumps({
            "since": None if since is None else {"before": since.before, "after": since.after,
                                                 "lease_cap": since.lease_cap},
            "batches_before": res.batches_before, "batches_after": res.batches_after,
            "merges": [{"compaction_id": m.compaction_id, "status": m.status, "inputs": len(m.inputs),
                        "seqno": m.seqno, "rows_in": m.rows_in, "rows_out": m.rows_out, "parts_in": m.parts_in,
                        "parts_out": m.parts_out} for m in res.merges],
        }, indent=2))
        return 0
    if since is not None:
        moved = f"{since.before} -> {since.after}" if since.after != since.before else f"stays at {since.after}"
        print(f"since {moved}" + (f" (held by a lease at {since.lease_cap})" if since.lease_cap is not None else ""))
    print(f"batches {res.batches_before} -> {res.batches_after}: {res.applied} merges applied, "
          f"{len(res.merges) - res.applied} refused")
    for m in res.merges:
        print(f"  {m.status}: {m.compaction_id} {len(m.inputs)} batches, {m.rows_in} -> {m.rows_out} rows, "
              f"{m.parts_in} -> {m.parts_out} parts")
    return 0


def _retention(shard: Shard, args: argparse.Namespace) -> int:
    from shardsink import maintenance as mt

    if args.retention is not None:
        changed = mt.set_retention(shard, args.retention)
        value = mt.format_duration(mt.retention_of(shard))
        print(f"retention {'set to' if changed else 'already'} {value}")
        return 0
    print(f"retention {mt.format_duration(mt.retention_of(shard))}")
    return 0


def _create(args: argparse.Namespace) -> int:
    src = sio.read_file(args.schema_from)
    schema = user_schema(src.schema)
    shard = Shard.create(args.url, schema, upper=args.upper)
    print(f"created {Shard(args.url).url} with upper {args.upper}, columns {schema.names}")
    if args.iceberg:
        from shardsink import iceberg

        iceberg.enable(shard)
        print(iceberg.current_location(shard))
    return 0


def _append(shard: Shard, args: argparse.Namespace) -> int:
    schema = shard.schema
    types = pa.schema([*schema, pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())])
    table = sio.read_file(args.input, types=types)
    r = shard.append(table, lower=args.lower, upper=args.upper, desc_id=args.desc_id, writer=args.writer)
    verb = "committed" if r.status == "committed" else "already committed"
    print(f"{verb}: desc {r.desc_id} [{r.lower}, {r.upper}) at seqno {r.seqno}, {r.rows} rows")
    return 0


def _inspect(shard: Shard, args: argparse.Namespace) -> int:
    d = inspect_json(shard)
    from shardsink.maintenance.census_read import take_census
    from shardsink.reclock.inspect import reclock_info
    from shardsink.sinks.waiting import waiting_json

    rc = reclock_info(shard)
    if rc is not None:
        d["reclock"] = rc
    d["staged_waiting"] = waiting_json(shard, d["upper"])
    census = take_census(shard, now=args.clock(), grace_s=args.grace) if args.objects else None
    if census is not None:
        d["objects"] = census.to_dict()
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    keys = ["url", "seqno", "upper", "since", "retention", "batches", "parts", "rows", "bytes"]
    print(_table([[k, d[k]] for k in keys], ["field", "value"]))
    print()
    print(_table([[f["name"], f["type"], f["nullable"]] for f in d["schema"]], ["column", "type", "nullable"]))
    if rc is not None:
        print()
        h = rc["health"] or {}
        rows = [["remap shard", rc["remap"]], ["source frontier", json.dumps(rc["source_frontier"])],
                ["resume from", json.dumps(rc["resume_frontier"])],
                ["source health", f"{h.get('status')} at {h.get('at')}" + (
                    f": {h['error']}" if h.get("error") else "")]]
        print(_table(rows, ["reclock", "value"]))
    if d["staged_waiting"]:
        print()
        print(f"{len(d['staged_waiting'])} descriptions staged at or ahead of the upper, waiting for their turn:")
        print(_table([[w["desc_id"], w["lower"], w["upper"], f"{w['staged_slots']}/{w['slots']}", w["turn"]]
                      for w in d["staged_waiting"]], ["description", "lower", "upper", "slots", "turn"]))
    if census is not None:
        print()
        print(f"objects (grace period {args.grace:g} s): {census.render()}")
        for line in _object_lines(census):
            print(line)
    return 0


def _object_lines(census: Census) -> list[str]:
    """Every object but the live ones, for people: awaiting GC by when GC may take them, then each
    one in flight and each one leaked, with why (:mod:`shardsink.core.census`)."""
    groups: dict[str, list[int]] = {}
    for o in census.of("retained"):
        groups.setdefault(o.why, []).append(o.bytes)
    lines = [f"awaiting GC {len(b)} objects ({sum(b)} bytes): {why}" for why, b in groups.items()]
    lines += [f"in flight {o.key} ({o.kind}, {o.bytes} bytes, {o.age_s:.0f} s old): {o.why}"
              for o in census.of("in_flight")]
    lines += [f"leak      {o.key} ({o.kind}, {o.bytes} bytes, {o.age_s:.0f} s old): {o.why}"
              for o in census.of("leaked")]
    return lines


def _log(shard: Shard, args: argparse.Namespace) -> int:
    commits = shard.log(limit=args.limit)
    entries = [{"seqno": s, **_commit_json(c)} for s, c in commits]
    if args.json:
        print(json.dumps(entries, indent=2))
    else:
        cols = ["seqno", "at", "kind", "what", "writer"]
        print(_table([[s, c.at, c.kind, c.describe(), c.writer] for s, c in commits], cols))
    return 0


def _gc(shard: Shard, args: argparse.Namespace) -> int:
    from shardsink.maintenance.gc import collect
    from shardsink.maintenance.gc_types import GcOptions

    if args.desc is not None:
        return cli_admin.gc_desc(shard, args)

    report = collect(shard, GcOptions(grace_s=args.grace, dry_run=args.dry_run, clock=args.clock))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    verb = "would delete" if report.dry_run else "deleted"
    print(f"{report.url}: head {report.head}, oldest retained version {report.oldest_before} -> "
          f"{report.oldest_after} (bound: {report.reason})")
    print(f"{verb}: {report.versions_deleted} versions, {report.rollups_deleted} rollups, "
          f"{report.parts_deleted} parts ({report.part_bytes_deleted} bytes), {report.manifests_deleted} "
          f"manifests, {report.leases_expired} expired leases, {report.plans_deleted} expired input records")
    print(f"kept: {report.young_kept} unreferenced objects younger than {args.grace:g} s, "
          f"{len(report.still_possible)} descriptions that may still commit")
    for line in report.skipped:
        print(f"skipped: {line}")
    if report.objects is not None:
        print(f"objects now: {report.objects.render()}")
        for line in _object_lines(report.objects):
            print(line)
    return 0


def _verify(shard: Shard, args: argparse.Namespace) -> int:
    from shardsink.maintenance.verify import EXIT_PROBLEMS, verify

    vr = verify(shard, grace_s=args.grace, now=args.clock())
    if args.json:
        print(json.dumps(vr.to_dict(), indent=2))
        return 0 if vr.ok else EXIT_PROBLEMS
    state = "ok" if vr.ok else f"{len(vr.problems)} problems"
    objects = "not classified (see the problems)" if vr.objects is None else vr.objects.render()
    print(f"{vr.url}: {state}; versions {vr.oldest}..{vr.head} ({vr.versions}), {vr.parts} referenced parts; "
          f"objects: {objects}")
    for p in vr.problems:
        print(f"PROBLEM {p.object}: {p.message}")
    for line in _object_lines(vr.objects) if vr.objects is not None else ():
        print(line)
    return 0 if vr.ok else EXIT_PROBLEMS


def _read(shard: Shard, args: argparse.Namespace) -> int:
    """``snapshot`` and ``changes``: the rows sorted, in the requested format."""
    if getattr(args, "engine", "pyarrow") != "pyarrow":  # a leased engine read (shardsink.read)
        from shardsink.read.tables import engine_table

        changes = None if args.cmd == "snapshot" else (args.lower, args.upper)
        t = engine_table(args.engine, shard.url, as_of=args.as_of if changes is None else None, changes=changes,
                         schema=getattr(args, "schema", "current"))
        keys = [c for c in t.column_names if c not in ("_count", DIFF)]
    elif args.cmd == "snapshot":
        t = shard.snapshot(args.as_of, schema=getattr(args, "schema", "current"))
        keys = [c for c in t.column_names if c != "_count"]
    else:
        t = shard.changes(args.lower, args.upper, schema=getattr(args, "schema", "current"))
        keys = [c for c in t.column_names if c != DIFF]
    if t.num_rows:
        t = t.sort_by([(k, "ascending") for k in keys])
    fmt = args.format or (sio.format_of(args.output) if args.output else "jsonl")
    sio.write_table(t, fmt=fmt, output=args.output)
    return 0


def _remap(shard: Shard, args: argparse.Namespace) -> int:
    """The bindings are read from ``args.url``; ``shard`` (opened first, as for every command) is not used."""
    from shardsink.reclock.inspect import bindings_json

    d = bindings_json(args.url)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    print(f"remap shard {d['remap']}: upper {d['upper']}, {len(d['bindings'])} bindings")
    rows = [[b["time"], b["at"], json.dumps(b["frontier"]),
             ", ".join(f"#{f['ordinal']} {f['key']}" for f in b["files"][:5])
             + (f" (+{len(b['files']) - 5} more)" if len(b["files"]) > 5 else "")] for b in d["bindings"]]
    print(_table(rows, ["time", "at", "frontier (next offset per partition)", "files first bound"]))
    return 0


#: The sub-commands that run on an opened shard (``create`` is the one that makes it).
_COMMANDS: dict[str, Callable[[Shard, argparse.Namespace], int]] = {
    "append": _append,
    "remap": _remap,
    "inspect": _inspect,
    "log": _log,
    "gc": _gc,
    "verify": _verify,
    "compact": _compact,
    "retention": _retention,
    "schema": cli_schema.run,
    "snapshot": _read,
    "changes": _read,
    "drop": cli_admin.drop,
}


def _run(args: argparse.Namespace) -> int:
    if args.cmd == "create":
        return _create(args)
    if args.cmd == "iceberg":
        return cli_iceberg.run(args)
    shard = Shard.open(args.url)
    handler = _COMMANDS.get(args.cmd)
    if handler is None:
        raise InvalidUsageError(f"unknown command {args.cmd!r}")
    return handler(shard, args)


def main(argv: Sequence[str] | None = None, *, clock: Callable[[], float] = time.time) -> int:
    """Run one command and return its documented exit code (callable in-process, e.g. from tests).
    ``clock``: epoch seconds, the time ``inspect --objects``, ``verify`` and ``gc`` judge ages by.
    The after-commit work the command's commits queued (the Iceberg view's upkeep) is done before it
    returns (:func:`shardsink.core.after_commit.drain`, at most its ``DRAIN_TIMEOUT`` seconds)."""
    args = build_parser().parse_args(argv)
    args.clock = clock
    try:
        return _run(args)
    except ShardsinkError as e:
        print(f"shardsink: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        return 0
    finally:  # SUBTLE: run() ends with os._exit, which runs no exit flush: the command's views first
        after_commit.drain(after_commit.DRAIN_TIMEOUT)


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``shardsink`` executable: :func:`main`, then a hard exit with its code.

    SUBTLE: pyarrow can abort the interpreter at exit (``terminate called without an
    active exception``, SIGABRT; apache/arrow#34314): its C++ thread pools are torn down
    by static destructors while a pool thread is still joinable. The command's work is
    done by then, but the abort replaces its documented exit code with -6. So once the
    output is flushed and logging shut down, the process ends with ``os._exit``, which
    runs no static destructors. Only the executable does this; :func:`main` returns.
    """
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: --help (0) and usage errors (2)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:
        code = 130
    except Exception:  # a bug or an unclassified failure: exit 1 as documented, with its traceback
        traceback.print_exc()
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BrokenPipeError, ValueError):  # reader gone / stream closed: nothing to add
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
