"""Reclocked runs in separate OS processes (``multiprocessing`` spawn), for the fault matrix.

Each entry point runs the library steps of a reclocked ingest run (mint with its binding,
the write job of every slot with its own local Spark, append) exactly as the Airflow
tasks and the spark-submit job make them, and reports to the parent through a queue:

* :func:`racer`: several rounds, each released by a barrier shared with a rival racer and
  the parent; both racers mint and stage before either appends (a second barrier), so
  exactly one of them wins each round; the loser starts a fresh run (new description).
* :func:`stage_and_hang` / :func:`mint_and_hang`: stage a description (or only mint it,
  which binds) and report it, then block until the parent SIGKILLs the process.

Errors in a child are sent to the parent as ``("error", traceback)`` and break the
barrier, so the parent never waits for a dead child.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from rc_helpers import mint_desc, write_slots

from shardsink import Shard
from shardsink.sinks.append import LostRaceError, append_from_manifests
from shardsink.sinks.description import Description, NoOp
from shardsink.sources.base import source_from_spec
from shardsink.sources.publish import after_commit

RETRIES = 4  # fresh runs a loser may start in one round (one is enough with two racers)


def _reporting(out: Any, barrier: Any | None, body: Callable[[], None]) -> None:
    try:
        body()
    except BaseException:
        out.put(("error", traceback.format_exc()))
        if barrier is not None:
            barrier.abort()
        raise


def racer(name: str, shard_url: str, spec: dict[str, Any], ends: Sequence[int], slots: int, barrier: Any,
          out: Any) -> None:
    """Round ``r``: wait for the parent, mint up to ``ends[r]`` and stage, wait for the rival,
    append; on a lost race run again with a fresh description. Reports every outcome as
    ``("round", name, r, [(event, desc_id, lower, upper, detail), ...])``."""

    def body() -> None:
        from shardsink_dev.testing import local_spark

        src = source_from_spec(spec)
        with local_spark(f"racer-{name}") as spark:
            for r, end in enumerate(ends):
                barrier.wait(timeout=900)  # the parent landed this round's files
                d = mint_desc(shard_url, src, interval_end=end, run_id=f"{name}-{r}")
                if isinstance(d, Description):
                    write_slots(spark, Shard.open(shard_url), src, d, slots=slots)
                barrier.wait(timeout=900)  # both staged: append now, racing
                events: list[tuple[str, str, int, int, int | str]] = []
                for attempt in range(2, RETRIES + 2):
                    if isinstance(d, NoOp):
                        events.append(("noop", "", 0, 0, d.reason))
                        break
                    try:
                        res = append_from_manifests(Shard.open(shard_url), d, slots)
                        after_commit(src.spec(), shard_url)
                        events.append((res.status, d.desc_id, d.lower, d.upper, res.seqno))
                        break
                    except LostRaceError as e:
                        events.append(("lost", d.desc_id, d.lower, d.upper, e.deleted))
                    d = mint_desc(shard_url, src, interval_end=end, run_id=f"{name}-{r}", attempt=attempt)
                    if isinstance(d, Description):
                        write_slots(spark, Shard.open(shard_url), src, d, slots=slots)
                else:
                    raise AssertionError(f"{name} round {r}: still losing after {RETRIES} fresh runs: {events}")
                out.put(("round", name, r, events))
                barrier.wait(timeout=900)  # round over: the parent may land files again

    _reporting(out, barrier, body)


def stage_and_hang(shard_url: str, spec: dict[str, Any], end: int, slots: int, out: Any) -> None:
    """Mint (binding) and stage every slot of one description, report it, then hang until killed."""

    def body() -> None:
        from shardsink_dev.testing import local_spark

        src = source_from_spec(spec)
        with local_spark("stage-and-hang") as spark:
            d = mint_desc(shard_url, src, interval_end=end, run_id="killed")
            assert isinstance(d, Description), d
            write_slots(spark, Shard.open(shard_url), src, d, slots=slots)
            out.put(("staged", d.to_dict()))
            time.sleep(3600)  # not ordering: hangs until the test kills this process

    _reporting(out, None, body)


def mint_and_hang(shard_url: str, spec: dict[str, Any], end: int, out: Any) -> None:
    """Mint one description (which binds the source's progress), report it, hang until killed."""

    def body() -> None:
        d = mint_desc(shard_url, source_from_spec(spec), interval_end=end, run_id="killed")
        assert isinstance(d, Description), d
        out.put(("minted", d.to_dict()))
        time.sleep(3600)  # not ordering: hangs until the test kills this process

    _reporting(out, None, body)
