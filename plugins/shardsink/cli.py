"""The ``shardsink`` command line: a contract for operators and scripts.

Exit codes: 0 success (including *already committed*), 1 any other failure,
2 invalid usage or bad input (nothing written), 3 upper mismatch (nothing appended;
stderr names the current upper), 4 ``verify`` found problems (each names its object),
5 a description's fate is unknown (its evidence is older than the retained history).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import pyarrow as pa

from shardsink import io as sio
from shardsink.core import checks as ck
from shardsink.core import parts as pt
from shardsink.core.shard import Shard
from shardsink.core.state import schema_to_json
from shardsink.errors import InvalidUsageError, ShardsinkError


def _checked(check: Callable[[], T]) -> T:
    """Run a :mod:`shardsink.core.checks` check for argparse: its refusal becomes a usage error (exit 2)."""
    try:
        return check()
    except InvalidUsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def parse_time(text: str) -> int:
    """Milliseconds since the epoch in ``[0, 2**63 - 1]``, from an integer or an ISO-8601 timestamp (UTC if naive)."""
    try:
        ms = int(text)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a time; expected integer milliseconds or an ISO-8601 timestamp"
            ) from e
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        ms = int(dt.timestamp() * 1000)
    return _checked(lambda: ck.check_time(ms))


T = TypeVar("T")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Finite seconds >= 0, from ``90``, ``90s``, ``15m``, ``1h`` or ``2d``; ``nan``, ``inf``, ``-1`` refused."""
    t = text.strip().lower()
    unit = _UNITS.get(t[-1:])
    try:
        value = float(t[:-1] if unit is not None else t) * (unit or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; expected e.g. 3600, 90s, 15m, 1h or 2d") from None
    return _checked(lambda: ck.check_seconds(value, what=f"duration {text!r} ="))


def parse_limit(text: str) -> int:
    """A count of at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    return _checked(lambda: ck.check_count(n, what="--limit", lo=1))


def parse_writer(text: str) -> str:
    """A writer name: 1 to 1,024 printable characters."""
    return _checked(lambda: ck.check_writer(text))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardsink", description="Exactly-once batch persistence into shards.")
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("create", help="create an empty shard")
    c.add_argument("url")
    c.add_argument("--schema-from", required=True, metavar="FILE", help="Parquet, CSV or JSONL file")
    c.add_argument("--upper", type=parse_time, default=0)

    a = sub.add_parser("append", help="append a file as the batch [lower, upper)")
    a.add_argument("url")
    a.add_argument("--lower", type=parse_time, required=True)
    a.add_argument("--upper", type=parse_time, required=True)
    a.add_argument("--input", required=True, metavar="FILE")
    a.add_argument("--desc-id", default=None)
    a.add_argument("--writer", type=parse_writer, default=None)

    i = sub.add_parser("inspect", help="show upper, since, seqno, batches, sizes and schema")
    i.add_argument("url")
    i.add_argument("--json", action="store_true")
    i.add_argument("--leaks", action="store_true", help="also list parts no batch references (lists parts/)")
    i.add_argument("--grace", type=parse_duration, default=3600.0, metavar="SECONDS",
                   help="with --leaks: ignore parts younger than this (in-flight writers); default 3600")

    rm = sub.add_parser("remap", help="show a remap shard's bindings (time -> source offsets)")
    rm.add_argument("url")
    rm.add_argument("--json", action="store_true")

    lg = sub.add_parser("log", help="show commits, newest first")
    lg.add_argument("url")
    lg.add_argument("--limit", type=parse_limit, default=20)
    lg.add_argument("--json", action="store_true")

    g = sub.add_parser("gc", help="delete history outside retention and objects nothing references")
    g.add_argument("url")
    g.add_argument("--grace", type=parse_duration, default=3600.0, metavar="DURATION",
                   help="never delete objects younger than this (in-flight writers); default 1h")
    g.add_argument("--dry-run", action="store_true", help="report what would be deleted; change nothing")
    g.add_argument("--json", action="store_true")

    vf = sub.add_parser("verify", help="check state chain, parts and multiplicities; list leaked objects")
    vf.add_argument("url")
    vf.add_argument("--json", action="store_true")

    cp = sub.add_parser("compact", help="merge batches (size-tiered), advancing since by retention and leases first")
    cp.add_argument("url")
    cp.add_argument("--no-since", action="store_true", help="only merge; leave since where it is")
    cp.add_argument("--json", action="store_true")

    rt = sub.add_parser("retention", help="show or set the shard's time-travel window (e.g. 7d, 12h, none)")
    rt.add_argument("url")
    rt.add_argument("--set", dest="retention", default=None, metavar="DURATION",
                    help="new retention: 7d, 12h, 30m, 45s, 500ms, 2w, or 'none' to keep all history")

    for name, helptext in (("snapshot", "contents as of a time"), ("changes", "updates in [from, to)")):
        r = sub.add_parser(name, help=helptext)
        r.add_argument("url")
        if name == "snapshot":
            r.add_argument("--as-of", type=parse_time, default=None)
        else:
            r.add_argument("--from", dest="lower", type=parse_time, required=True)
            r.add_argument("--to", dest="upper", type=parse_time, required=True)
        r.add_argument("--format", choices=["jsonl", "csv", "parquet"], default=None)
        r.add_argument("--output", default=None, metavar="FILE")
    return p


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


def _commit_json(c: Any) -> dict[str, Any]:
    return {"at": c.at, "kind": c.kind, "desc_id": c.desc_id, "lower": c.lower, "upper": c.upper,
            "rows": c.rows, "writer": c.writer, **({"props": dict(c.props)} if c.props else {})}


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


def _run(args: argparse.Namespace) -> int:
    if args.cmd == "create":
        src = sio.read_file(args.schema_from)
        schema = pt.user_schema(src.schema)
        Shard.create(args.url, schema, upper=args.upper)
        print(f"created {Shard(args.url).url} with upper {args.upper}, columns {schema.names}")
        return 0
    shard = Shard.open(args.url)
    if args.cmd == "append":
        schema = shard.schema
        types = pa.schema([*schema, pa.field(pt.TIME, pa.int64()), pa.field(pt.DIFF, pa.int64())])
        table = sio.read_file(args.input, types=types)
        r = shard.append(table, lower=args.lower, upper=args.upper, desc_id=args.desc_id, writer=args.writer)
        verb = "committed" if r.status == "committed" else "already committed"
        print(f"{verb}: desc {r.desc_id} [{r.lower}, {r.upper}) at seqno {r.seqno}, {r.rows} rows")
        return 0
    if args.cmd == "remap":
        return _remap(args)
    if args.cmd == "inspect":
        d = inspect_json(shard)
        from shardsink.reclock.inspect import reclock_info

        rc = reclock_info(shard)
        if rc is not None:
            d["reclock"] = rc
        if args.leaks:
            d["leaked_parts"] = [
                {"key": o.key, "bytes": o.size, "modified": o.modified}
                for o in shard.leaked_parts(grace_seconds=args.grace)
            ]
        if args.json:
            print(json.dumps(d, indent=2))
        else:
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
            if args.leaks:
                print()
                leaks = d["leaked_parts"]
                print(f"{len(leaks)} leaked parts (unreferenced, older than {args.grace:g} s)")
                if leaks:
                    print(_table([[x["key"], x["bytes"]] for x in leaks], ["key", "bytes"]))
        return 0
    if args.cmd == "log":
        entries = [{"seqno": s, **_commit_json(c)} for s, c in shard.log(limit=args.limit)]
        if args.json:
            print(json.dumps(entries, indent=2))
        else:
            cols = ["seqno", "at", "kind", "desc_id", "lower", "upper", "rows", "writer"]
            print(_table([[e[c] for c in cols] for e in entries], cols))
        return 0
    if args.cmd == "gc":
        from shardsink.maintenance.gc import GcOptions, collect

        report = collect(shard, GcOptions(grace_s=args.grace, dry_run=args.dry_run))
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
        else:
            verb = "would delete" if report.dry_run else "deleted"
            print(f"{report.url}: head {report.head}, oldest retained version {report.oldest_before} -> "
                  f"{report.oldest_after} (bound: {report.reason})")
            print(f"{verb}: {report.versions_deleted} versions, {report.rollups_deleted} rollups, "
                  f"{report.parts_deleted} parts ({report.part_bytes_deleted} bytes), {report.manifests_deleted} "
                  f"manifests, {report.leases_expired} expired leases, {report.plans_deleted} read plans")
            print(f"kept: {report.young_kept} unreferenced objects younger than {args.grace:g} s, "
                  f"{len(report.still_possible)} descriptions that may still commit")
            for line in report.skipped:
                print(f"skipped: {line}")
        return 0
    if args.cmd == "verify":
        from shardsink.maintenance.verify import EXIT_PROBLEMS, verify

        vr = verify(shard)
        if args.json:
            print(json.dumps(vr.to_dict(), indent=2))
        else:
            state = "ok" if vr.ok else f"{len(vr.problems)} problems"
            print(f"{vr.url}: {state}; versions {vr.oldest}..{vr.head} ({vr.versions}), {vr.parts} referenced parts, "
                  f"{len(vr.leaks)} leaked objects")
            for p in vr.problems:
                print(f"PROBLEM {p.object}: {p.message}")
            for x in vr.leaks:
                print(f"leak    {x.object} ({x.kind}, {x.bytes} bytes, {x.age_s:.0f} s old)")
        return 0 if vr.ok else EXIT_PROBLEMS

    if args.cmd == "compact":
        return _compact(shard, args)
    if args.cmd == "retention":
        return _retention(shard, args)
    if args.cmd in ("snapshot", "changes"):
        if args.cmd == "snapshot":
            t = shard.snapshot(args.as_of)
            keys = shard.schema.names
        else:
            t = shard.changes(args.lower, args.upper)
            keys = [*shard.schema.names, pt.TIME]
        if t.num_rows:
            t = t.sort_by([(k, "ascending") for k in keys])
        fmt = args.format or (sio.format_of(args.output) if args.output else "jsonl")
        sio.write_table(t, fmt=fmt, output=args.output)
        return 0
    raise InvalidUsageError(f"unknown command {args.cmd!r}")


def _remap(args: argparse.Namespace) -> int:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its documented exit code (callable in-process, e.g. from tests)."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except ShardsinkError as e:
        print(f"shardsink: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        return 0


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
