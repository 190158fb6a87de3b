"""Shard maintenance on top of core: compaction, since advancement, GC and verify."""
