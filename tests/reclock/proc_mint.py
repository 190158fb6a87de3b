"""A separate OS process that runs one mint (binding included), prints its description, and
optionally dies right after (SIGKILL-like ``os._exit``), before any data is written.

    python proc_mint.py SHARD_URL SOURCE_SPEC_JSON INTERVAL_END [--die] [--go]

``--go``: print ``ready``, then wait for a line on stdin before minting (to line several
processes up).
"""

from __future__ import annotations

import json
import os
import sys

from shardsink.sinks.description import Description, NoOp, to_builtins
from shardsink.sinks.ingest import mint_chain, open_or_create
from shardsink.sources.base import source_from_spec

START = 1_704_067_200_000


def main() -> None:
    url, spec, end = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    if "--go" in sys.argv:  # a barrier: say so, then wait for the test's line on stdin
        print("ready", flush=True)
        sys.stdin.readline()
    src = source_from_spec(spec)
    shard = open_or_create(url, src, initial_upper=START)
    out = mint_chain(shard, src, interval_end=end, max_span=None, max_chain=1, dag_id="proc",
                     run_id=f"p{os.getpid()}", attempt=1)
    d = out if isinstance(out, NoOp) else out[0]
    print(json.dumps(to_builtins(d) if isinstance(d, Description) else {"noop": d.reason}), flush=True)
    if "--die" in sys.argv:
        os._exit(137)


if __name__ == "__main__":
    main()
