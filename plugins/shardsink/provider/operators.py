"""What every shardsink task adds to its operator: lineage, the Shard page link, metrics.

:class:`ShardTaskMixin` goes first in the bases of an operator that writes a shard and
has ``shard_url`` and ``source_spec`` attributes (the write operators); :func:`shard_task`
is ``@task`` for the TaskFlow tasks of a sink (mint, append) with the mixin applied.

* OpenLineage: ``get_openlineage_facets_on_start`` / ``_on_complete`` (the methods the
  OpenLineage provider's default extractor calls) report the source's datasets → the
  shard, every shard with its current schema (read when the event is built) and, for
  append, the rows and bytes committed; a maintenance task (role ``maintain``) reads and
  rewrites its shard: the shard → the shard, with the rows and bytes of its live batches
  after maintenance (:mod:`shardsink.provider.lineage`).
* "Shard page" extra link (:class:`shardsink.provider.links.ShardPageLink`).
* Derived views current before the task reports its state (:func:`drained`).
* Metrics (:mod:`shardsink.provider.metrics`): the task's duration; for append, commits,
  lost races and the committed batch's rows and bytes; for maintain, objects and part
  bytes deleted, batches before and after.

None of this can fail a task: lineage and metrics errors are logged and ignored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from airflow.providers.standard.decorators.python import _PythonDecoratedOperator
from airflow.sdk import BaseOperatorLink
from airflow.sdk.bases.decorator import task_decorator_factory

from shardsink.provider import lineage, metrics
from shardsink.provider.links import ShardPageLink

log = logging.getLogger(__name__)


def _pushed(context: Any, task_id: str) -> Any:
    """This try's pushed result, or None (metrics never fail a task)."""
    try:
        return context["ti"].xcom_pull(task_ids=task_id, key="return_value")
    except Exception:
        return None


def _lost_race(e: BaseException) -> bool:
    from shardsink.sinks.append import LostRaceError

    return isinstance(e.__cause__, LostRaceError)


def _committed_bytes(shard_url: str, seqno: int) -> int | None:
    """Bytes of the batch committed at ``seqno`` (one state read), None if unknown."""
    from shardsink.core.shard import Shard

    try:
        v = Shard.open(shard_url).reader().version(seqno)
        return sum(b.bytes for b in v.added) if v is not None else None
    except Exception:
        log.debug("could not read the committed batch's size", exc_info=True)
        return None


@contextmanager
def drained() -> Iterator[None]:
    """Run the block, then wait (:func:`shardsink.core.after_commit.drain`) until the after-commit
    work its commits queued is done (the Iceberg view's upkeep, on its background worker), however
    the block ends. SUBTLE: the task must not report success with its view still queued: Airflow's
    task runner reports the state before the process exits (its exit flush comes after), and a
    downstream reader of the view expects it current once the append succeeded. Never raises: a
    drain past ``after_commit.DRAIN_TIMEOUT`` is logged and the view catches up at the next commit or sync."""
    from shardsink.core.after_commit import DRAIN_TIMEOUT, drain

    try:
        yield
    finally:
        drain(DRAIN_TIMEOUT)


class ShardTaskMixin:
    """Lineage, the Shard page link and metrics for a task that writes the shard ``self.shard_url``."""

    shard_role: ClassVar[str] = "task"
    operator_extra_links: Collection[BaseOperatorLink] = (ShardPageLink(),)
    shard_url: str
    source_spec: Mapping[str, Any]
    dag_id: str

    def execute(self, context: Any) -> Any:
        from airflow.sdk.exceptions import DownstreamTasksSkipped

        try:
            with self.timed(), drained():
                result = super().execute(context)  # type: ignore[misc]
        except DownstreamTasksSkipped:
            # SUBTLE: append succeeds by raising this (it skips the later attempts) after pushing
            # its result as XCom; read it back so the metrics and lineage still see the commit.
            self._record(context["ti"].xcom_pull(task_ids=self.task_id, key="return_value"))  # type: ignore[attr-defined]
            raise
        except BaseException as e:
            if self.shard_role == "append":
                if _lost_race(e):
                    metrics.lost_race(dag_id=self.dag_id, shard=self.shard_url)
                else:  # e.g. every description of the attempt lost: skipped after pushing its result
                    self._record(_pushed(context, self.task_id))  # type: ignore[attr-defined]
            raise
        self._record(result)
        return result

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Send ``task.<shard_role>.duration`` for the block, however it ends: :meth:`execute` wraps
        the operator's own work in it, and a subclass whose work bypasses that (a Spark Connect
        write slot, which starts no spark-submit) wraps its own."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            metrics.timing(f"task.{self.shard_role}.duration", (time.monotonic() - t0) * 1000, dag_id=self.dag_id,
                           shard=self.shard_url)

    def _record(self, result: Any) -> None:
        """Keep the task's result for lineage; count an append's commits and settled lost races,
        or a maintenance pass's deletions and batches.

        An append's result lists the attempt's commits (``committed``: desc_id, lower, upper,
        seqno, rows, status) and the descriptions it found lost (``lost``); see
        :func:`shardsink.airflow.tasks.append_task`. A maintenance task's result is the
        summary of :func:`shardsink.airflow.maintenance.maintain_task`.
        """
        self._shard_result = result
        self._shard_result_rows: int | None = None
        self._shard_result_bytes: int | None = None
        if self.shard_role == "maintain" and isinstance(result, Mapping):
            self._record_maintenance(result)
            return
        if self.shard_role != "append" or not isinstance(result, Mapping):
            return
        for _ in result.get("lost") or ():
            metrics.lost_race(dag_id=self.dag_id, shard=self.shard_url)
        landed = [c for c in result.get("committed") or () if c.get("status") == "committed"]
        if not landed:
            return
        rows, total = 0, 0
        for c in landed:
            size = _committed_bytes(self.shard_url, int(c["seqno"]))
            rows += int(c.get("rows", 0))
            total += size or 0
            metrics.committed(dag_id=self.dag_id, shard=self.shard_url, rows=int(c.get("rows", 0)), size=size)
        self._shard_result_rows, self._shard_result_bytes = rows, total

    def _record_maintenance(self, summary: Mapping[str, Any]) -> None:
        try:
            before, after = summary["before"], summary["after"]
            gc = summary.get("gc") or {}
            self._shard_result_rows, self._shard_result_bytes = int(after["rows"]), int(after["bytes"])
        except (KeyError, TypeError, ValueError):
            log.warning("unexpected maintenance summary; no metrics sent", exc_info=True)
            return
        metrics.maintained(dag_id=self.dag_id, shard=self.shard_url, batches_before=int(before["batches"]),
                           batches_after=int(after["batches"]), objects_deleted=int(summary["objects_deleted"]),
                           part_bytes_deleted=int(gc.get("part_bytes_deleted", 0)))

    def _lineage(self, *, complete: bool) -> Any:
        """Inputs → the shard, every shard with its CURRENT schema, read now (on COMPLETE: after
        any schema change the run committed; see :mod:`shardsink.provider.lineage`)."""
        columns = lineage.shard_columns(self.shard_url)
        if columns is None:  # the first mint or write creates the shard: the source's schema
            source = self._source_schema()
            columns = lineage.arrow_columns(source) if source is not None else None
        output = lineage.ReportedDataset(lineage.shard_dataset(self.shard_url), columns)
        # Maintenance reads the shard and rewrites it in place.
        inputs = [output] if self.shard_role == "maintain" else lineage.input_datasets(self.source_spec)
        rows = size = None
        if complete:
            rows, size = getattr(self, "_shard_result_rows", None), getattr(self, "_shard_result_bytes", None)
        return lineage.operator_lineage(output=output, inputs=inputs, rows=rows, size=size)

    def _source_schema(self) -> Any:
        """The schema the shard will be created with: the ingest source's (a view's is only known to Spark)."""
        if not self.source_spec or "inputs" in self.source_spec:
            return None
        from shardsink.sources.base import source_from_spec

        try:
            return source_from_spec(dict(self.source_spec)).schema()
        except Exception:
            log.debug("could not read the source's schema for lineage", exc_info=True)
            return None

    def get_openlineage_facets_on_start(self) -> Any:
        return self._lineage(complete=False)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self._lineage(complete=True)


class ShardTaskOperator(ShardTaskMixin, _PythonDecoratedOperator):
    """A sink's TaskFlow task (``@shard_task``) with :class:`ShardTaskMixin`.

    The shard is ``shard_url``, or, for a task mapped over shards, the value of its
    function's argument named ``shard_url_arg`` (the map index's shard: read from the
    expanded arguments, which Airflow renders before the OpenLineage listener asks for
    lineage and before ``execute``).
    """

    custom_operator_name = "@task"

    def __init__(self, *, shard_role: str, shard_url: str | None = None, shard_url_arg: str | None = None,
                 source_spec: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        from shardsink.errors import InvalidUsageError

        if (shard_url is None) == (shard_url_arg is None):
            raise InvalidUsageError(f"shard task {kwargs.get('task_id')!r}: pass exactly one of shard_url "
                                    f"({shard_url!r}) and shard_url_arg ({shard_url_arg!r})")
        super().__init__(**kwargs)
        self.shard_role = shard_role  # type: ignore[misc]
        self.shard_url_arg = shard_url_arg
        self._fixed_shard_url = shard_url
        self.source_spec = dict(source_spec or {})

    @property
    def shard_url(self) -> str:
        if self.shard_url_arg is None:
            return str(self._fixed_shard_url)
        return str((self.op_kwargs or {}).get(self.shard_url_arg, ""))

    @shard_url.setter
    def shard_url(self, url: str) -> None:
        self._fixed_shard_url, self.shard_url_arg = url, None

    def resume_after_wait(self, context: Any, event: Any = None) -> Any:
        """Where a deferred task resumes (:func:`shardsink.airflow.gates.defer`): its body runs again
        from the top and decides from its own reads; ``event`` (the trigger's payload) is kept as
        :attr:`resumed_event` for the gates (a ``catch_up`` decided on the triggerer's clock is not
        re-judged on this worker's, which may be skewed). The same try: never counted as a retry."""
        log.info("resumed after a deferred wait (%s); running %s again from the top", event, self.task_id)
        self.resumed_event = event if isinstance(event, dict) else {"status": "time_reached", "moment": str(event)}
        return self.execute(context)


def shard_task(python_callable: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """``@task`` for a sink's task: ``@shard_task(task_id=..., shard_role="append", shard_url=..., source_spec=...)``,
    or ``shard_url_arg="url"`` for a task mapped over shard URLs (see the module docstring)."""
    return task_decorator_factory(python_callable=python_callable, decorated_operator_class=ShardTaskOperator,
                                  **kwargs)
