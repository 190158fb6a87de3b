"""The remap shard's reads: its parts are read through the schema id each batch was written with."""

from __future__ import annotations

from shardsink.core.schema import SchemaChange
from shardsink.reclock.remap import Proposal, RemapShard


def test_bindings_read_parts_written_under_an_older_schema_id_after_the_remap_evolved(tmp_path: object) -> None:
    """Issue 19: an operator may add a column to the remap shard; bindings minted before and
    after (still staged with the remap schema, an older schema id) all read back."""
    remap = RemapShard.open_or_create(f"file://{tmp_path}/remap", initial_upper=0)
    remap.bind_through(10, lambda _: Proposal({"0": 5}))
    remap.shard.evolve(SchemaChange(kind="add", name="note", type="string"))
    remap.bind_through(20, lambda _: Proposal({"0": 8}))
    assert [b.schema_id for b in remap.shard.batches()] == [0, 0]
    b = RemapShard.open(remap.url).bindings()
    assert (b.upper, b.frontier_at(9), b.frontier_at(19)) == (20, {"0": 5}, {"0": 8})
