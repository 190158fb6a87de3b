"""Core shard machinery: pure state transitions, the commit machine, parts and reads."""
