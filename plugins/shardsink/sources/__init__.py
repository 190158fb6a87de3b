"""Sources for the ingest sink: a watermark plus a per-slot read in Spark (see base.py)."""

from shardsink.sources.base import Seal, Source, register_kind, source_from_spec
from shardsink.sources.landing import LandingSource, LateDataError, MalformedInputError

__all__ = ["LandingSource", "LateDataError", "MalformedInputError", "Seal", "Source", "register_kind",
           "source_from_spec"]
