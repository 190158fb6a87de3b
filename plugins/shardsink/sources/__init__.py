"""Sources for the ingest sink: a watermark plus a per-slot read in Spark (see base.py)."""

from shardsink.sources.base import Seal, Source, register_kind, source_from_spec, source_spec
from shardsink.sources.landing import LandingSource, LateDataError, MalformedInputError
from shardsink.specs import CustomSpec, FilesSpec, KafkaSpec, LandingSpec, SourceSpec

__all__ = ["CustomSpec", "FilesSpec", "KafkaSpec", "LandingSource", "LandingSpec", "LateDataError",
           "MalformedInputError", "Seal", "Source", "SourceSpec", "register_kind", "source_from_spec", "source_spec"]
