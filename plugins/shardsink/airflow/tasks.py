"""The task bodies of a sink DAG's run: ``mint`` (ingest), ``append`` and ``report``
(shared with the view DAG), and the dry-run report that ends a dry run.

Tasks talk to the shard store and the source only; they never touch Airflow's metadata
database. XCom carries descriptions (id, bounds, attempt) and small results
(:mod:`shardsink.airflow.results`), as plain JSON values of msgspec structs, never data,
paths of staged parts, or secrets. Each task reads each fact once: the shard's head at most
once (its facts are handed down to the gates and steps), a description's fate at most once
before its commit attempt, the source's watermark once per mint. The gates they pass (wait, back off, end the
run) are in :mod:`shardsink.airflow.gates`; the write operator is
:mod:`shardsink.airflow.write_operator`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from shardsink.airflow.append_wait import defer_turn, turn_of
from shardsink.airflow.failures import for_airflow
from shardsink.airflow.gates import (
    ahead_from,
    covered,
    defer_until,
    far_behind,
    nothing_to_do,
    retry_gate,
    skip_rest,
    wait_for_earlier_intervals,
)
from shardsink.airflow.results import AppendReport, CommittedRange, RunReport, TurnCommit
from shardsink.airflow.run_context import (
    earlier_appends,
    push_target,
    run_options,
    run_started,
    run_writer,
    target_of,
    targets,
)
from shardsink.airflow.settings import IngestSettings
from shardsink.core.shard import Shard
from shardsink.errors import (
    InvalidUsageError,
    ShardNotFoundError,
    ShardsinkError,
)
from shardsink.reclock.source import Reclocked
from shardsink.sinks.append import Appended, Failed, Landed, Lost, Waiting, append_run
from shardsink.sinks.description import Description, NoOp, descriptions, to_builtins
from shardsink.sinks.ingest import Seen, open_with_info, read_watermark
from shardsink.sinks.reprocess import check_range
from shardsink.sources.base import source_from_spec
from shardsink.sources.evolution import SchemaMode
from shardsink.sources.publish import after_commit

log = logging.getLogger("shardsink.airflow")


def mint_task(settings: IngestSettings, attempt: int, context: dict[str, Any], *,
              schema_mode: SchemaMode = "strict") -> list[dict[str, Any]]:
    """Mint attempt ``attempt``'s descriptions (a chain up to the run's target), or skip the rest.

    The run's **target** is ``min(interval end, watermark)``: the run is green only once the
    shard's upper reaches it (the ``report`` task checks). A covered target is a quick no-op.
    A run behind an uncovered earlier interval waits (deferred to the triggerer) for it, then catches up;
    a NEW shard far behind the run's interval is warned about first, naming the fix (log and
    XCom ``warning``, :func:`shardsink.airflow.gates.far_behind`).
    Re-processing (``reprocess_from``/``reprocess_to`` or ``reprocess``) puts the correction
    into the first description; ``dry_run`` computes and reports, then ends the run. Reads the
    shard's head once and the source's watermark once; the gates and the chain decide from them.
    ``schema_mode``: how a dry run reads the files (``"add_columns"``: onto the schema the
    evolution would make, reported, not committed; :func:`shardsink.spark.dryrun.dry_run_ingest`).
    """
    from shardsink.airflow.results import MintTarget
    from shardsink.sinks.ingest import mint_chain

    try:
        opts = run_options(context)  # also a partition key that names no partition: not retried
    except InvalidUsageError as e:
        raise AirflowFailException(f"{type(e).__name__}: {e}") from e
    start, interval_end = opts.interval
    corrected = retry_gate(settings, attempt, context)
    run_id = context["dag_run"].run_id
    source = source_from_spec(settings.source_spec)
    try:
        shard, info = open_with_info(settings.shard_url, source, initial_upper=settings.initial_upper)
    except ShardsinkError as e:  # a store that cannot be made safe (UnsafeStoreError) is not retried
        failure = for_airflow(e)
        if failure is e:
            raise
        raise failure from e
    if (warning := far_behind(settings, info, opts.interval)) is not None:
        log.warning("%s", warning)
        context["ti"].xcom_push(key="warning", value=warning)
    corrects = None if corrected else opts.corrects
    if corrects is not None:
        try:
            check_range(shard, *corrects, info=info)
        except ShardsinkError as e:
            raise AirflowFailException(f"{type(e).__name__}: {e}") from e
    wm = read_watermark(source)
    target = None if wm is None else min(b for b in (wm, interval_end) if b is not None)
    ahead = ahead_from(info, opts.interval, watermark=wm, attempt=attempt, corrects=corrects, dry_run=opts.dry_run,
                       reclocked=isinstance(source, Reclocked), catch_up_after=settings.catch_up_after)
    if ahead is None and corrects is None and not opts.dry_run and start is not None and wm is not None:
        # Only the part of the earlier intervals the source can fill is worth waiting for: a
        # run whose target is covered already (or whose interval lies past the watermark
        # and the shard reached it) ends at once.
        wait_for_earlier_intervals(settings, info, min(start, wm), context)
    out = mint_chain(shard, source, interval_end=interval_end, max_span=settings.max_span, max_chain=settings.max_chain,
                     dag_id=settings.dag_id, run_id=run_id, attempt=attempt, corrects=corrects, seen=Seen(info, wm),
                     prepare=not opts.dry_run, ahead_from=ahead)
    push_target(context, MintTarget(target=target, watermark=wm, interval_end=interval_end, corrects=corrects,
                            dry_run=opts.dry_run))
    if isinstance(out, NoOp):
        if corrects is not None:
            waited = time.time() - run_started(context)
            if waited < settings.catch_up_after and not opts.dry_run:
                defer_until(context, f"{out.reason}; waiting for the source's watermark to pass the upper",
                            at=time.time() + settings.poke_interval)
            raise AirflowFailException(f"cannot re-process [{corrects[0]}, {corrects[1]}): {out.reason}")
        nothing_to_do(context, out.reason, settings.writers)
    if opts.dry_run:
        dry_run_report(context, settings, lambda spark: _dry_ingest(spark, source, shard, out, settings,
                                                                    schema_mode=schema_mode))
    context["ti"].xcom_push(key="minted_at", value=time.time())
    for d in out:
        log.info("minted description %s [%d, %d)%s for %d writer slots (attempt %d of %d)%s", d.desc_id, d.lower,
                 d.upper, f" correcting [{d.corrects[0]}, {d.corrects[1]})" if d.corrects else "", settings.writers,
                 attempt, settings.max_attempts,
                 f"; minted ahead of the shard's upper {info.upper}: it stages now and commits in its turn"
                 if ahead is not None else "")
    return list(to_builtins(out))


def _dry_ingest(spark: Any, source: Any, shard: Shard, descs: list[Description],
                settings: IngestSettings, *, schema_mode: SchemaMode) -> list[dict[str, Any]]:
    from shardsink.spark.dryrun import dry_run_ingest

    return dry_run_ingest(spark, source, shard, descs, slots=settings.writers, sample=settings.sample_rows,
                          schema_mode=schema_mode)


def dry_run_report(context: dict[str, Any], settings: IngestSettings,
                   compute: Callable[[Any], list[dict[str, Any]]]) -> NoReturn:
    """Compute what the run would write, report it (log + XCom ``dry_run``), and end the run's
    work: nothing is written to the shard. Spark: a session of the DAG's Connect server when its
    jobs run over Connect (``settings.connect_conn_id``), else a local session in this task."""
    from shardsink.spark.dryrun import dry_run_session, log_line, totals

    connect = None
    if settings.connect_conn_id is not None:
        from shardsink.airflow.connect_write import connect_url

        connect = connect_url(settings.connect_conn_id)
    log.info("dry run: computing what the run would write %s", "on a local Spark session" if connect is None
             else f"over Spark Connect (connection {settings.connect_conn_id!r})")
    with dry_run_session(f"shardsink-dry-run-{settings.dag_id}", connect=connect) as spark:
        report = totals(compute(spark))
    context["ti"].xcom_push(key="dry_run", value=report)
    log.info("%s", log_line(report))
    skip_rest(context, settings.writers)
    raise AssertionError("unreachable")  # pragma: no cover - skip_rest always raises


def _record(landed: Landed) -> CommittedRange:
    """A commit as the append reports and logs it: ``committed`` when this run's writer made it
    (this try, an earlier one, or its turn trigger on the triggerer: the shard log says who)."""
    d, r = landed.desc, landed.result
    status = "committed" if landed.mine else r.status
    log.info("%s: description %s [%d, %d) at seqno %d, %d rows%s%s", status.replace("_", " "), r.desc_id,
             r.lower, r.upper, r.seqno, r.rows,
             f" (with the correction of [{d.corrects[0]}, {d.corrects[1]}))" if d.corrects else "",
             " (by this run before this try: its turn trigger on the triggerer, or an earlier try)"
             if landed.mine and r.status != "committed" else "")
    return CommittedRange(desc_id=r.desc_id, lower=r.lower, upper=r.upper, seqno=r.seqno, rows=r.rows, status=status,
                        corrects=d.corrects)


def given_up(context: dict[str, Any], attempt: int) -> list[Description]:
    """The descriptions of this run's earlier attempts whose appends gave their turn up (XCom)."""
    out: list[Description] = []
    for k, rep in enumerate(earlier_appends(context, attempt), start=1):
        if rep.gave_up:
            got = context["ti"].xcom_pull(task_ids=f"attempt_{k}.mint")
            out += descriptions(got or [], what=f"XCom descriptions of attempt_{k}.mint")
    return out


def append_task(settings: IngestSettings, attempt: int, descs: list[dict[str, Any]], context: dict[str, Any],
                asset: Any) -> dict[str, Any]:
    """Commit the attempt's descriptions in order through :func:`shardsink.sinks.append.append_run`
    and map its one outcome: Waiting defers to the turn trigger, Failed fails the task, Lost
    skips (attempt k+1 retries fresh after a backoff) or, on the last attempt, fails; Appended
    succeeds. UnknownOutcomeError propagates so that Airflow retries this task, which re-reads.

    Result (XCom and log, :class:`AppendReport`): the committed ranges ``[{desc_id, lower, upper,
    seqno, rows, status, corrects}]``, the losses, the upper as last seen, and the timeline:
    ``minted_at``, ``staged_at`` (the writes done), ``waited_for`` and ``committed_at`` (the latest
    commit's time, as the shard log records it). If anything committed, the shard's asset event
    carries the same (``lower``/``upper`` the span of this attempt's commits). Covered target: the
    rest of the run is skipped.
    """
    if not descs:
        raise AirflowSkipException("no description was minted for this attempt; nothing to append")
    chain = descriptions(descs, what=f"XCom descriptions of attempt_{attempt}.mint")
    shard = Shard(settings.shard_url)
    writer = run_writer(context, dag_id=settings.dag_id)
    turn = turn_of(settings, context, chain[0])
    out = append_run(shard, chain, settings.writers, writer=writer, turn=turn, superseded=given_up(context, attempt))
    if isinstance(out, Waiting):
        defer_turn(settings, context, out, TurnCommit(chain=tuple(chain), slots=settings.writers, writer=writer))
    if isinstance(out, Failed):
        raise AirflowFailException(out.why)
    minted_at = context["ti"].xcom_pull(task_ids=f"attempt_{attempt}.mint", key="minted_at")
    done = tuple(_record(x) for x in out.landed) if isinstance(out, Appended) else ()
    gave_up = isinstance(out, Lost) and out.gave_up  # the next attempt catches up at once, no backoff
    lost = (out.why,) if isinstance(out, Lost) and out.gave_up else tuple(m.line() for m in out.missed)
    result = AppendReport(shard=shard.url, committed=done, lost=lost, upper=out.upper,
                          retry_at=time.time() + settings.backoff(attempt + 1) if lost and not gave_up else None,
                          minted_at=minted_at if isinstance(minted_at, int | float) else None,
                          staged_at=turn.since, waited_for=turn.behind,
                          committed_at=max(x.at for x in out.landed) if isinstance(out, Appended) else None,
                          gave_up=gave_up)
    log.info("timeline: minted at %s, staged at %s, waited for %s, committed at %s", result.minted_at,
             result.staged_at, result.waited_for or "nothing", result.committed_at)
    pushed: dict[str, Any] = to_builtins(result)
    context["ti"].xcom_push(key="return_value", value=pushed)
    if isinstance(out, Lost):
        if attempt < settings.max_attempts:
            then = "catches up from the upper" if out.gave_up else "retries with a fresh description"
            raise AirflowSkipException(f"{out.why}; attempt {attempt + 1} {then}")
        end = ("no attempt left to catch up (clear the run to continue)" if out.gave_up
               else f"all {settings.max_attempts} attempts lost their races, giving up")
        raise AirflowFailException(f"{out.why}; {end}")
    _after_commit(settings, shard, writer)
    context["outlet_events"][asset].extra = {
        "shard": shard.url, "lower": done[0].lower, "upper": done[-1].upper, "seqno": done[-1].seqno,
        "rows": sum(c.rows for c in done), "desc_id": done[-1].desc_id, "commits": pushed["committed"]}
    aim = target_of(context, attempt)
    if aim is not None and covered(settings, context, aim.target, upper=out.upper) and not (
            aim.corrects and not any(c.corrects for c in done)):
        skip_rest(context, settings.writers)
    return pushed


def _after_commit(settings: IngestSettings, shard: Shard, writer: str) -> None:
    """The run's bookkeeping once it committed: the DAG's retention, a reclocked source's frontier."""
    ensure_retention(shard, settings.retention, writer=writer)
    if settings.iceberg:
        ensure_iceberg(shard, writer=writer)
    after_commit(settings.source_spec, shard.url)  # reclocked sources publish their resumption frontier


def report_task(settings: IngestSettings, context: dict[str, Any]) -> dict[str, Any]:
    """The run's account (:class:`RunReport`): every range it committed (in order), and the check
    that makes a green run mean "covered": the shard's upper is at least the run's target
    (``min(interval end, watermark)`` as its mints saw it). A dry run reports what it would have
    written instead. One head read."""
    commits = tuple(c for r in earlier_appends(context, settings.max_attempts + 1) for c in r.committed)
    seen = targets(context, settings.max_attempts)
    dry = context["ti"].xcom_pull(task_ids="attempt_1.mint", key="dry_run")
    aims = [p.target for p in seen if p.target is not None]
    target = max(aims) if aims else None
    try:
        upper = Shard(settings.shard_url).info().upper
    except ShardNotFoundError:
        upper = None
    run_id = context["dag_run"].run_id
    out = RunReport(shard=settings.shard_url, run_id=run_id, writer=run_writer(context, dag_id=settings.dag_id),
                    committed=commits, target=target, upper=upper, dry_run=dry)
    if dry is not None:
        log.info("dry run: would write %d updates, %d bytes in %d descriptions; nothing was written",
                 dry["updates"], dry["bytes"], dry["descriptions"])
        return dict(to_builtins(out))
    for c in commits:
        log.info("committed [%d, %d) as %s at seqno %d (%d rows)%s", c.lower, c.upper, c.desc_id, c.seqno,
                 c.rows, f", correcting [{c.corrects[0]}, {c.corrects[1]})" if c.corrects else "")
    if not commits:
        log.info("this run committed nothing")
    wanted = [p.corrects for p in seen if p.corrects]
    if wanted and not any(c.corrects for c in commits):
        raise AirflowFailException(f"the correction of {list(wanted[0])} was not committed")
    if target is not None and (upper is None or upper < target):
        raise AirflowFailException(
            f"the run's interval is not covered: shard upper {upper} < target {target} (min of interval end and "
            f"watermark) after {settings.max_attempts} attempts; clear the run to continue")
    log.info("covered: shard upper %s >= target %s", upper, target)
    return dict(to_builtins(out))


def ensure_iceberg(shard: Shard, *, writer: str = "airflow") -> None:
    """Turn the shard's Iceberg view on (``ShardOptions.iceberg``) when it is not yet; best effort
    after the append (every later commit keeps it current; a failure is logged, the next run retries)."""
    from shardsink import iceberg
    from shardsink.errors import ShardsinkError

    try:
        if shard.reader().head().header.option("iceberg") != "on":
            log.info("iceberg view of %s turned on at seqno %d", shard.url, iceberg.enable(shard, writer=writer))
    except ShardsinkError as e:
        log.warning("iceberg view of %s not turned on (the next run retries): %s", shard.url, e)


def ensure_retention(shard: Shard, retention: str | None, *, writer: str = "airflow") -> None:
    """Set the shard's retention to the DAG's ``retention=`` when it differs (a committed
    state transition; a no-op read otherwise), as ``writer`` (the DAG run's). Best effort
    after the append: a failure is logged and the next run sets it."""
    if retention is None:
        return
    from shardsink import maintenance
    from shardsink.errors import ShardsinkError

    try:
        if maintenance.set_retention(shard, retention, writer=writer):
            log.info("retention of %s set to %s", shard.url,
                     maintenance.format_duration(maintenance.parse_duration(retention)))
    except ShardsinkError as e:
        log.warning("retention of %s not set (the next run retries): %s", shard.url, e)
