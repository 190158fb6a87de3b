"""Sinks: the steps of a persistence job as library calls (Airflow-independent, Spark-free).

:mod:`~shardsink.sinks.ingest` (mint, append), :mod:`~shardsink.sinks.description` (what the
steps pass around), :mod:`~shardsink.sinks.staging` (per-slot manifests),
:mod:`~shardsink.sinks.seals` (late-data evidence), :mod:`~shardsink.sinks.reprocess`
(re-processing ranges), :mod:`~shardsink.sinks.materialize` (views). Import from those
modules; this package exports nothing itself.
"""
