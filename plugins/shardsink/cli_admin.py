"""The ``shardsink`` commands that delete on an operator's word: ``gc --desc`` and ``drop``.

``shardsink gc URL --desc DESC_ID [--dry-run] [--json]`` deletes what one description staged,
as its fate allows (:mod:`shardsink.maintenance.gc_desc`): exit 0 when done (also when nothing
was staged), 2 when it may still commit (nothing deleted), 5 when its fate is unknown
(nothing deleted; check the data by hand).

``shardsink drop URL --yes [--force] [--json]`` deletes a whole shard
(:mod:`shardsink.maintenance.drop`): without ``--yes`` it prints what it would delete and
exits 2 having written nothing (``--dry-run`` does the same with exit 0); in use (a live
lease, a writer in flight) it refuses with exit 2 unless ``--force``; a URL that holds no
shard exits 2. It names every kind of object it deleted and what it left.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError


def add_parsers(sub: Any) -> None:
    """Register ``drop`` on ``sub`` (argparse sub-parsers); ``gc --desc`` is an option of ``gc``."""
    d = sub.add_parser("drop", help="delete a whole shard (needs --yes); says what it deleted")
    d.add_argument("url")
    d.add_argument("--yes", action="store_true", help="really delete it (without: show what would go, exit 2)")
    d.add_argument("--dry-run", action="store_true", help="show what would be deleted and exit 0")
    d.add_argument("--force", action="store_true",
                   help="drop even while a read lease is live or a writer may be in flight (they will fail)")
    d.add_argument("--json", action="store_true")


def gc_desc(shard: Shard, args: argparse.Namespace) -> int:
    """``gc --desc``: one description through the fate primitive."""
    from shardsink.maintenance.gc_desc import collect_description

    done = collect_description(shard, args.desc, dry_run=args.dry_run)
    print(json.dumps(done.to_dict(), indent=2) if args.json else done.render())
    return 0


def drop(shard: Shard, args: argparse.Namespace) -> int:
    """``drop``: the plan without ``--yes`` (exit 2) or with ``--dry-run`` (exit 0), else the drop."""
    from shardsink.maintenance.drop import drop as drop_shard

    if args.yes and args.dry_run:
        raise InvalidUsageError("--yes and --dry-run contradict each other; pass one")
    if not args.yes:
        plan = drop_shard(shard, dry_run=True, force=True)  # blockers are reported, not raised, in a plan
        print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.render())
        if args.dry_run:
            return 0
        raise InvalidUsageError(f"refusing to drop {shard.url} without --yes; nothing was deleted")
    done = drop_shard(shard, force=args.force)
    print(json.dumps(done.to_dict(), indent=2) if args.json else done.render())
    return 0
