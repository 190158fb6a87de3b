"""Sinks: the steps of a persistence job as library calls (Airflow-independent)."""

from shardsink.sinks.ingest import (
    Description,
    LostRaceError,
    NoOp,
    append_from_manifests,
    cleanup,
    committed,
    mint,
    open_or_create,
    read_manifests,
    write_manifest,
)

__all__ = ["Description", "LostRaceError", "NoOp", "append_from_manifests", "cleanup", "committed", "mint",
           "open_or_create", "read_manifests", "write_manifest"]
