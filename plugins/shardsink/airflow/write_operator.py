"""The write operator of every sink DAG: :class:`ShardWriteOperator`, a spark-submit of the
write job for one writer slot of a minted description.

Its contract: skip the JVM when the description is already committed, ship the library
with ``--py-files``, and decide a failed job's outcome from the typed record the job
wrote (:mod:`shardsink.outcome`, :mod:`shardsink.airflow.failures`). The job gets one
typed request (:mod:`shardsink.spark.request`, ``--request``) and answers with one outcome
record (``--result-path``). Subclasses change the job and its request through
:meth:`ShardWriteOperator.committed_already` and :meth:`ShardWriteOperator.job_request`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from shardsink.core.shard import Shard
from shardsink.core.state import PartOrder
from shardsink.errors import InvalidConfigurationError
from shardsink.provider.operators import ShardTaskMixin
from shardsink.sinks.cancel import POLL_S, SlotCancels, SlotFailure, cancelled_message
from shardsink.sinks.description import Description
from shardsink.sinks.ingest import Committed, committed
from shardsink.spark.request import IngestWriteRequest, JobRequest, job_argv
from shardsink.specs import SourceSpec, spec_from_builtins, spec_to_builtins


class ShardWriteOperator(ShardTaskMixin, SparkSubmitOperator):
    """spark-submit of the write job for one writer slot of a minted description.

    Mapped over the slots; ``desc`` is the mint task's XCom (templated, resolved at run
    time). Ships the library with ``--py-files`` (a zip built by shardsink) and skips
    the JVM entirely when the description is already committed (a retry after success).

    Failures: the job writes a typed outcome record to a per-try result file
    (``--result-path``, :mod:`shardsink.outcome`); after spark-submit fails the operator
    rebuilds the shardsink error from it and applies :func:`shardsink.airflow.failures.for_airflow`
    (invalid input and corruption fail at once; storage errors are retried). No record
    (the JVM or driver died first): the spark-submit failure is raised as is (retried).
    The result file is local to the worker, so the driver must run there (client deploy
    mode); in cluster deploy mode no record arrives and every failure is retried.
    Configuration errors (no Spark connection, ``yarn`` without its Hadoop configuration)
    fail before spark-submit starts, without retries (:func:`spark_config_error`).

    Sibling slots (``slots`` > 1) stop together: a slot whose failure is final records it
    (:mod:`shardsink.sinks.cancel`); a slot that finds it before starting fails at once, and
    one that finds it while running (looking every ``cancel_poll`` seconds) kills its
    spark-submit and Spark application; both fail without retries, naming the cause.

    Credentials: ``aws_conn_id`` is resolved by the amazon provider's hook
    (:mod:`shardsink.airflow.credentials`); the committed check uses a client built from
    it, and spark-submit gets it in its process environment only (not ``self.env_vars``,
    which is a rendered template field). YARN and Kubernetes modes would put environment
    variables on the spark-submit command line, so they are refused with credentials.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "desc")
    shard_role = "write"
    #: Whether this operator stages descriptions that carry a re-processing correction.
    stages_corrections = False

    def __init__(self, *, shard_url: str, source_spec: Mapping[str, Any] | SourceSpec, slots: int, desc: Any,
                 slot: int, aws_conn_id: str | None = None, part_order: PartOrder = "sorted",
                 cancel_poll: float = POLL_S, engine: str = "submit", connect_conn_id: str = "spark_connect_default",
                 **kwargs: Any) -> None:
        from shardsink.spark import job_path

        if "application" not in kwargs:
            kwargs["application"] = job_path()
        super().__init__(**kwargs)
        # Plain values only: mapped operators' partial arguments are serialized.
        self.shard_url = shard_url
        self.source_spec = dict(source_spec) if isinstance(source_spec, Mapping) else spec_to_builtins(source_spec)
        self.slots = slots
        self.desc = desc
        self.slot = slot
        self.aws_conn_id = aws_conn_id
        self.part_order: PartOrder = part_order  # how ingest slots stage parts (the request carries it)
        self._secret_env: dict[str, str] = {}
        #: How often a running slot looks for a sibling's final failure (:mod:`shardsink.sinks.cancel`).
        self.cancel_poll = cancel_poll
        self._cancelled_by: SlotFailure | None = None
        #: The state version :meth:`committed_already` decided at (passed to the job: one read per task).
        self._decided_at: int | None = None
        #: ``"submit"`` (a spark-submit per slot) or ``"connect"`` (a session of the Connect server
        #: ``connect_conn_id``; :mod:`shardsink.airflow.connect_write`).
        self.engine = engine
        self.connect_conn_id = connect_conn_id
        self._connect_spark: Any = None  # the live Connect session (interrupted by _cancel / on_kill)

    def committed_already(self, d: Description) -> Committed | None:
        """The commit of ``d`` if it landed (then the JVM is skipped). Hook for subclasses.

        The task's one head read: the fate is decided from it, and its seqno goes to the job
        (``decided_at``), which reads that immutable version instead of the head."""
        shard = Shard(self.shard_url)
        head = shard.reader().head()
        self._decided_at = head.seqno
        return committed(shard, d, head=head)

    def job_request(self, d: Description) -> JobRequest:
        """The job's request for description ``d`` (:mod:`shardsink.spark.request`). Hook for subclasses."""
        return IngestWriteRequest(shard_url=self.shard_url, source=spec_from_builtins(self.source_spec), desc=d,
                                  slot=self.slot, slots=self.slots, part_order=self.part_order,
                                  decided_at=self._decided_at)

    def job_args(self, d: Description) -> list[str]:
        """The application's arguments for description ``d``: its encoded request (``execute`` adds
        ``--result-path``)."""
        return job_argv(self.job_request(d))

    def _get_hook(self) -> Any:
        """The provider's hook, with the connection's credentials added to spark-submit's environment
        and, on a local master, shardsink's worker daemon (:func:`shardsink.spark.daemon.daemon_conf`).

        Configuration errors fail the task here, before spark-submit starts and without retries
        (:class:`InvalidConfigurationError` naming the setting): see :func:`spark_config_error`."""
        from airflow.providers.common.compat.sdk import AirflowNotFoundException

        from shardsink.airflow.failures import for_airflow
        from shardsink.spark.daemon import daemon_conf

        hook = super()._get_hook()
        try:
            hook.get_connection(self._conn_id)
            found = True
        except AirflowNotFoundException:
            found = False
        master = str(hook._connection.get("master"))
        err = spark_config_error(self._conn_id, found=found, master=master, env={**os.environ, **(self.env_vars or {})})
        if err is None and self._secret_env and (
                hook._is_yarn or hook._is_kubernetes or hook._connection.get("deploy_mode") == "cluster"):
            err = InvalidConfigurationError(
                f"aws_conn_id {self.aws_conn_id!r} with Spark master {master!r}: credentials can only reach a local "
                "or standalone client-mode spark-submit through its environment (YARN/Kubernetes would put them on "
                "the command line); use instance roles there")
        if err is not None:
            raise for_airflow(err) from err
        hook._conf = daemon_conf(hook._conf or {}, master=master,
                                 worker_python=(self.env_vars or {}).get("PYSPARK_PYTHON"))
        if self._secret_env:
            # The hook hands _env_vars to Popen(env=...) in local/standalone client mode only.
            hook._env_vars = {**(hook._env_vars or {}), **self._secret_env}
        return hook

    def execute(self, context: Any) -> None:
        import tempfile

        from shardsink.airflow.credentials import store_access
        from shardsink.spark import build_pyfiles_zip

        if not self.desc:
            raise AirflowSkipException("no description was minted for this attempt; nothing to write")
        d = Description.decode(self.desc)
        if d.corrects is not None and not self.stages_corrections:
            raise AirflowSkipException("this description carries a correction: its correction job stages it")
        with store_access(self.aws_conn_id) as access:
            done = self.committed_already(d)
            if done is not None:
                self.log.info("description %s is already committed (seqno %d); slot %d has nothing to write",
                              d.desc_id, done.seqno, self.slot)
                return
            # The slots of d stop together (sinks.cancel); built here, it keeps the store access.
            cancels = None if self.slots < 2 else SlotCancels(self.shard_url, d.desc_id,
                                                              generation=_generation(context))
            if cancels is not None and (failed := cancels.failure()) is not None:  # one failed before this started
                raise AirflowFailException(cancelled_message(failed, self.slot))
            self._secret_env = access.spark_env(explicit=self.env_vars or {}) if access is not None else {}
        if self.engine == "connect":  # which jobs run over Connect: shardsink.spark.connect.run_over_connect
            self._secret_env = {}
            with self.timed():  # no spark-submit: the mixin's execute, which times it, is not called
                self._execute_connect(d, context, cancels)
            return
        env = dict(self.env_vars or {})
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        self.env_vars = env
        self.py_files = ",".join(p for p in [self.py_files, build_pyfiles_zip()] if p)
        self.name = f"shardsink-{self.dag_id}-slot{self.slot}"
        self.log.info("writing slot %d of %d for description %s [%d, %d)", self.slot, self.slots, d.desc_id,
                      d.lower, d.upper)
        with tempfile.TemporaryDirectory(prefix="shardsink-outcome-") as tmp:
            result = os.path.join(tmp, "outcome.json")  # per try: a fresh folder each execute
            self.application_args = [*self.job_args(d), "--result-path", result]  # one request, one record
            try:
                with cancels.watching(self._cancel, every=self.cancel_poll) if cancels else nullcontext():
                    super().execute(context)
            except Exception as e:
                if self._cancelled_by is not None:
                    raise AirflowFailException(cancelled_message(self._cancelled_by, self.slot)) from e
                err = self._failure(result, e)
                if cancels is not None and _final(err, context):
                    cancels.record(self.slot, f"{type(err).__name__}: {err}")
                raise err from e
            finally:
                self._secret_env = {}
            self._report(result)

    def _execute_connect(self, d: Description, context: Any, cancels: SlotCancels | None) -> None:
        """The slot as a session of the Connect server (:mod:`shardsink.airflow.connect_write`)."""
        from shardsink.airflow.connect_write import run_connect_write

        self.log.info("writing slot %d of %d for description %s [%d, %d) over Spark Connect (connection %r)",
                      self.slot, self.slots, d.desc_id, d.lower, d.upper, self.connect_conn_id)
        summary = run_connect_write(
            request=self.job_request(d), conn_id=self.connect_conn_id, aws_conn_id=self.aws_conn_id, cancels=cancels,
            cancel_poll=self.cancel_poll, on_session=self._on_session, on_cancel=self._cancel,
            cancelled=lambda: None if self._cancelled_by is None else AirflowFailException(
                cancelled_message(self._cancelled_by, self.slot)),
            final=lambda err: _final(err, context))
        self.log.info("write job outcome: %s", summary)

    def _on_session(self, spark: Any) -> None:
        self._connect_spark = spark

    def on_kill(self) -> None:
        """Kill the slot's work: its spark-submit (the provider's), or its Connect session's operations."""
        spark = self._connect_spark
        if spark is not None:
            from shardsink.airflow.connect_write import interrupt

            interrupt(spark)
            return
        super().on_kill()

    def _cancel(self, failed: SlotFailure) -> None:
        """(The watching thread.) A sibling slot failed for good: kill this slot's spark-submit, and
        with it its Spark application (the provider's ``on_kill``: the client-mode driver is that
        process; YARN, Kubernetes and standalone cluster drivers are killed through their masters).
        Called again at every look until the submit returns, in case it had not started yet."""
        proc = getattr(getattr(self, "_hook", None), "_submit_sp", None)
        if self._cancelled_by is None:
            self.log.warning("%s", cancelled_message(failed, self.slot))
        self._cancelled_by = failed
        if self._connect_spark is not None or (proc is not None and proc.poll() is None):
            self.on_kill()

    def _failure(self, result: str, spark_error: BaseException) -> BaseException:
        """What to raise after spark-submit failed: decided by the job's outcome record."""
        from shardsink.airflow.failures import for_airflow
        from shardsink.outcome import error_from_record, read_outcome

        if isinstance(spark_error, AirflowFailException):  # decided before spark-submit started (_get_hook)
            return spark_error
        outcome = read_outcome(result)
        if outcome is None or outcome.error is None:
            self.log.warning("the write job left no outcome record (it died before reporting); retrying if allowed")
            return spark_error
        rec = outcome.error
        err = error_from_record(rec)
        self.log.error("write job failed: %s (%s): %s%s", rec.error_class, rec.raised, rec.message,
                       f" [value: {rec.value}]" if rec.value is not None else "")
        if err is None:
            return spark_error
        return for_airflow(err)

    def _report(self, result: str) -> None:
        from shardsink.outcome import read_outcome

        outcome = read_outcome(result)
        if outcome is not None and outcome.ok:
            self.log.info("write job outcome: %s", outcome.summary)


def _generation(context: Any) -> int:
    """The DAG run's clear number: clearing the run's tasks starts a new generation of its slots."""
    return int(getattr(context.get("dag_run"), "clear_number", 0) or 0)


def _final(err: BaseException, context: Any) -> bool:
    """Whether the task's failure with ``err`` is final: not retried (AirflowFailException) or its last try."""
    if isinstance(err, AirflowFailException):
        return True
    ti = context.get("ti")
    tries, most = getattr(ti, "try_number", None), getattr(ti, "max_tries", None)
    return isinstance(tries, int) and isinstance(most, int) and tries > most


def spark_config_error(conn_id: str, *, found: bool, master: str,
                       env: Mapping[str, str]) -> InvalidConfigurationError | None:
    """The configuration error that would make spark-submit fail for a setting, not a
    transient cause (so retrying cannot help), naming the setting; None if there is none.

    SUBTLE: the Spark provider silently falls back to ``--master yarn`` when the connection
    ``conn_id`` does not exist, and spark-submit then fails only after starting a JVM, on
    every retry. A ``yarn`` master needs ``HADOOP_CONF_DIR`` or ``YARN_CONF_DIR`` in
    spark-submit's environment (``env``: the worker's, plus ``SparkOptions(env=...)``).
    """
    if not found:
        return InvalidConfigurationError(
            f"Spark connection {conn_id!r} is not defined (SparkOptions(conn_id=...), default 'spark_default'): "
            "without it spark-submit falls back to --master yarn. Define it, e.g. "
            f"AIRFLOW_CONN_{conn_id.upper()}='{{\"conn_type\": \"spark\", \"host\": \"local[2]\"}}' for Spark "
            "on the worker itself, or host spark://HOST with port 7077 for a standalone cluster", value=conn_id)
    if master.startswith("yarn") and not (env.get("HADOOP_CONF_DIR") or env.get("YARN_CONF_DIR")):
        return InvalidConfigurationError(
            f"Spark connection {conn_id!r} has master {master!r}, but neither HADOOP_CONF_DIR nor YARN_CONF_DIR is "
            "set in the worker's environment or SparkOptions(env=...): spark-submit cannot find the YARN cluster. "
            "Set one of them, or point the connection at another master (e.g. host local[2])", value=master)
    return None
