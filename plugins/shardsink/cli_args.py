"""The ``shardsink`` command line's grammar: its sub-commands and options (:func:`build_parser`),
and the argument types that check each value with :mod:`shardsink.core.checks` before
anything runs (a refused value is an argparse usage error: exit 2, nothing written).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from shardsink import cli_admin, cli_iceberg, cli_schema
from shardsink.core import checks as ck
from shardsink.errors import InvalidUsageError


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


def parse_desc_id(text: str) -> str:
    """A description id: one key segment (:func:`shardsink.core.checks.check_desc_id`)."""
    return _checked(lambda: ck.check_desc_id(text))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardsink", description="Exactly-once batch persistence into shards.")
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("create", help="create an empty shard")
    c.add_argument("url")
    c.add_argument("--schema-from", required=True, metavar="FILE", help="Parquet, CSV or JSONL file")
    c.add_argument("--upper", type=parse_time, default=0)
    c.add_argument("--iceberg", action="store_true", help="keep an Iceberg view of it (shardsink iceberg)")

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
    i.add_argument("--objects", "--leaks", dest="objects", action="store_true",
                   help="also classify every object: live, awaiting GC (and when GC may take it), in flight, "
                        "leaked (lists the whole shard)")
    i.add_argument("--grace", type=parse_duration, default=3600.0, metavar="DURATION",
                   help="with --objects: GC's grace period; an unreferenced object younger than it is in flight, "
                        "not leaked; default 1h")

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
    g.add_argument("--desc", default=None, metavar="DESC_ID", type=parse_desc_id,
                   help="only what this description staged, as its fate allows, whatever its age: refused while it "
                        "may still commit (exit 2) or when its fate is unknown (exit 5)")

    vf = sub.add_parser("verify", help="check state chain, parts and multiplicities; classify every object "
                                       "(live, awaiting GC, in flight, leaked)")
    vf.add_argument("url")
    vf.add_argument("--json", action="store_true")
    vf.add_argument("--grace", type=parse_duration, default=3600.0, metavar="DURATION",
                    help="GC's grace period: an unreferenced object younger than it is in flight, not leaked; "
                         "default 1h")

    cp = sub.add_parser("compact", help="merge batches (size-tiered), advancing since by retention and leases first")
    cp.add_argument("url")
    cp.add_argument("--no-since", action="store_true", help="only merge; leave since where it is")
    cp.add_argument("--json", action="store_true")

    cli_schema.add_parser(sub)
    cli_admin.add_parsers(sub)
    cli_iceberg.add_parsers(sub, parse_time=parse_time, parse_writer=parse_writer)

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
        r.add_argument("--engine", choices=["pyarrow", "duckdb"], default="pyarrow",
                       help="read with pyarrow (default) or DuckDB (needs shardsink[duckdb]); same rows")
        r.add_argument("--schema", choices=["current", "as_of"], default="current",
                       help="read with the current schema (default) or the one current at the read's time")
    return p
