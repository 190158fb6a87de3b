"""``shardsink schema``: show a shard's schema history, or commit one schema change.

``shardsink schema URL [--json]`` lists every schema (id, fields with their field ids, and
the seqno, time and upper of the change that made it current). ``--add NAME:TYPE``
(``--required`` for a non-nullable column, only on an empty shard), ``--drop NAME``,
``--rename OLD:NEW``, ``--widen NAME:TYPE`` or ``--nullable NAME`` commits exactly one
change through the one conditional put (:mod:`shardsink.core.schema`). TYPE is a pyarrow
alias (``int64``, ``string``, ``double``, ``timestamp[ms]``, ``decimal128(12,2)``, …).
A refused change exits 2 naming the column, the old and new type and what is allowed;
nothing is written.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardsink.core import schema as sch
from shardsink.core.shard import Shard
from shardsink.core.state import SchemaEntry
from shardsink.errors import InvalidUsageError


def add_parser(sub: Any) -> None:
    """Register the ``schema`` sub-command on ``sub`` (argparse sub-parsers)."""
    sp = sub.add_parser("schema", help="show the schema history, or commit one schema change")
    sp.add_argument("url")
    sp.add_argument("--json", action="store_true")
    one = sp.add_mutually_exclusive_group()
    one.add_argument("--add", metavar="NAME:TYPE", default=None, help="add a column (nullable unless --required)")
    one.add_argument("--drop", metavar="NAME", default=None, help="drop a column (hidden from reads at once)")
    one.add_argument("--rename", metavar="OLD:NEW", default=None, help="rename a column (no data rewritten)")
    one.add_argument("--widen", metavar="NAME:TYPE", default=None,
                     help="widen a column's type (int8->int16->int32->int64, float->double, decimal precision "
                          "up at the same scale, string->large_string)")
    one.add_argument("--nullable", metavar="NAME", default=None, help="make a required column nullable")
    sp.add_argument("--required", action="store_true", help="with --add: the column is not nullable")


def _split(text: str, what: str) -> tuple[str, str]:
    name, sep, rest = text.partition(":")
    if not sep or not name or not rest:
        raise InvalidUsageError(f"{what} {text!r:.200} must be of the form {what}", value=text[:200])
    return name, rest


def change_of(args: argparse.Namespace) -> sch.SchemaChange | None:
    """The one change the options name (None: just show the history)."""
    if args.required and args.add is None:
        raise InvalidUsageError("--required applies to --add only")
    if args.add is not None:
        name, type_ = _split(args.add, "NAME:TYPE")
        return sch.SchemaChange(kind="add", name=name, type=type_, nullable=not args.required)
    if args.drop is not None:
        return sch.SchemaChange(kind="drop", name=args.drop)
    if args.rename is not None:
        old, new = _split(args.rename, "OLD:NEW")
        return sch.SchemaChange(kind="rename", name=old, new_name=new)
    if args.widen is not None:
        name, type_ = _split(args.widen, "NAME:TYPE")
        return sch.SchemaChange(kind="widen", name=name, type=type_)
    if args.nullable is not None:
        return sch.SchemaChange(kind="nullable", name=args.nullable)
    return None


def entry_json(e: SchemaEntry) -> dict[str, Any]:
    """One schema of the history as JSON: ``id``, the ``seqno``, time (``at``, ISO-8601; None for
    a shard's implicit first schema) and shard ``upper`` of the change that made it current,
    and its ``fields`` (field id, name, type, nullable). THE one form: ``shardsink schema
    --json`` prints it and the Shards page's API (:mod:`shardsink.provider.inventory`) serves it."""
    return {"id": e.id, "seqno": e.seqno, "at": e.at or None, "upper": e.upper,
            "fields": [{"id": f.id, "name": f.name, "type": f.type, "nullable": f.nullable} for f in e.fields]}


def run(shard: Shard, args: argparse.Namespace) -> int:
    change = change_of(args)
    if change is not None:
        v = shard.evolve(change)
        entry = sch.current(v.header)
        if args.json:
            print(json.dumps(entry_json(entry), indent=2))
        else:
            print(f"{change.describe()}: schema {entry.id} committed at seqno {v.seqno}")
        return 0
    hist = shard.schema_history()
    if args.json:
        print(json.dumps([entry_json(e) for e in hist], indent=2))
        return 0
    for e in hist:
        when = f"seqno {e.seqno}" + (f" at {e.at}" if e.at else "") + (f", upper {e.upper}" if e.upper is not None
                                                                        else "")
        print(f"schema {e.id} ({when})")
        for f in e.fields:
            print(f"  {f.id:>4}  {f.name}: {f.type}{'' if f.nullable else ' not null'}")
    return 0
