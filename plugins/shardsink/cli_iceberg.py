"""``shardsink iceberg``: the Iceberg view of a shard (:mod:`shardsink.iceberg`).

* ``shardsink iceberg URL [--as-of T]``: the current metadata file's full location on the first
  line (what ``StaticTable.from_metadata`` and ``scan_iceberg`` take), then the current snapshot;
  with ``--as-of T`` (ms or ISO-8601) the snapshot holding the contents as of shard time ``T``
  (read it filtered to ``_time <= T``).
* ``shardsink iceberg enable URL``: turn the view on (the shard option) and write its first snapshot.
* ``shardsink iceberg sync URL``: bring the view up to date from any state (idempotent).
* ``shardsink iceberg register URL --catalog NAME --table NS.TABLE``: register it in a pyiceberg catalog.

Refusals (a shard without the view, a catalog that cannot load, an existing table, a malformed
name) exit 2 with the reason, nothing written.
"""

from __future__ import annotations

import argparse
from typing import Any

from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError

ACTIONS = ("enable", "sync", "register")


def add_parsers(sub: Any, *, parse_time: Any, parse_writer: Any) -> None:
    """Register ``iceberg`` on ``sub``; the argument types are :mod:`shardsink.cli_args`'s."""
    ic = sub.add_parser("iceberg", help="the shard's Iceberg view: print its metadata location; enable, sync, "
                                        "register")
    ic.add_argument("words", nargs="+", metavar="[enable|sync|register] URL")
    ic.add_argument("--as-of", type=parse_time, default=None, metavar="TIME",
                    help="print the snapshot holding the contents as of this shard time (ms or ISO-8601)")
    ic.add_argument("--catalog", help="register: the pyiceberg catalog's name")
    ic.add_argument("--table", help="register: the table, as namespace.name")
    ic.add_argument("--writer", type=parse_writer, default=None, help="enable: the name the option's commit carries")


def run(args: argparse.Namespace) -> int:
    from shardsink import iceberg
    from shardsink.iceberg.catalog import register

    words = list(args.words)
    action = words.pop(0) if words[0] in ACTIONS and len(words) > 1 else "show"
    if len(words) != 1:
        raise InvalidUsageError(f"expected `shardsink iceberg [{'|'.join(ACTIONS)}] URL`, got {args.words!r:.200}")
    shard = Shard.open(words[0])
    if action == "enable":
        print(f"iceberg view of {shard.url} at seqno {iceberg.enable(shard, writer=args.writer)}")
        print(iceberg.current_location(shard))
    elif action == "sync":
        n = iceberg.sync(shard)
        print(iceberg.current_location(shard))
        print(f"{n} version(s) written")
    elif action == "register":
        if not args.catalog or not args.table:
            raise InvalidUsageError("register needs --catalog NAME and --table NAMESPACE.TABLE")
        print(register(shard, catalog=args.catalog, table=args.table))
        print(f"registered as {args.table} in catalog {args.catalog}")
    else:
        _show(shard, args.as_of)
    return 0


def _show(shard: Shard, as_of: int | None) -> None:
    from shardsink import iceberg

    print(iceberg.current_location(shard))
    if as_of is None:
        return
    snap = iceberg.snapshot_as_of(shard, as_of)
    if snap is None:
        raise InvalidUsageError(f"no retained snapshot of {shard.url} holds the contents as of {as_of}",
                                value=str(as_of))
    print(f"snapshot {snap.snapshot_id} (shard seqno {snap.sequence_number}, upper {snap.summary['shardsink.upper']}); "
          f"read it with _time <= {as_of}")
