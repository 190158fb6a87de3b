"""Property test (issue 36): every reader loads the same plan for the same read.

Hypothesis builds shard histories (:func:`test_engines_schema_property.build_history`: appends
of inserts and retractions over several batches, schema changes, since advances, compactions).
For a sample of reads (snapshots and change feeds, both schema choices, at both ends of the
readable range and either side of the first schema change) the plan each reader takes from the one
planner (:mod:`shardsink.core.plan`) is the same: the pyarrow reads (``ReadHandle.plan``),
DuckDB and Polars (the plan their leased read holds), the Spark data source as a user loads it
and as the read helpers load it (:func:`shardsink.spark.datasource.source_options` of their
lease), and Spark's native planning (:func:`shardsink.core.plan.plan_pinned` of the same lease).
Same parts, same projections, same time bounds and flags, same state version.

The plan is also checked against the parts' own files: a part left out holds no update the
read shows, and a part not flagged ``below``/``above`` holds no time outside the read.
No JVM: the Spark readers' plans are made in this process, as the source's worker makes them.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engines_schema_property import Read, build_history, sample_reads

import shardsink.read
from shardsink import Shard
from shardsink.core import plan as pl
from shardsink.core.leases import LeaseKeeper
from shardsink.core.updates import TIME
from shardsink.spark import datasource as ds

HISTORIES = 8


def _plans(shard: Shard, r: Read, con: duckdb.DuckDBPyConnection, keeper: LeaseKeeper) -> dict[str, pl.ReadPlan]:
    """The plan of ``r`` as each reader takes it."""
    kw: dict[str, Any] = {"as_of": r.lo} if r.mode == "snapshot" else {"changes": (r.lo, r.hi)}
    out = {"pyarrow": shard.reader().plan(schema=r.choice, **kw)}
    leased = shardsink.read.duckdb(con, shard.url, schema=r.choice, **kw)
    out["duckdb"] = leased.plan
    leased.close()
    leased_lf = shardsink.read.polars(shard.url, schema=r.choice, **kw)
    out["polars"] = leased_lf.plan
    leased_lf.close()
    bounds = {"as_of": str(r.lo)} if r.mode == "snapshot" else {"mode": "changes", "from": str(r.lo),
                                                                "to": str(r.hi)}
    out["spark source"] = ds.plan_read({"path": shard.url, "schema": r.choice, **bounds})
    pinned = pl.pin(shard, keeper, shard.reader().head(), holder="plan-property", schema=r.choice, **kw)
    out["spark helpers' source"] = ds.plan_read({"path": shard.url, **ds.source_options(pinned)})
    out["spark native"] = pl.plan_pinned(shard, pinned)
    return out


def _check_against_files(shard: Shard, plan: pl.ReadPlan) -> None:
    """Every update the read shows is in a planned part; flags agree with the parts' times."""
    planned = {r.part.key: r for r in plan.parts}
    lo = plan.lower if plan.lower is not None else -(2**63)
    for b in shard.batches():
        for p in b.parts:
            times = shard.reader().open_part(p).read(columns=[TIME])[TIME]
            shown = pc.max_element_wise(times, plan.since) if plan.mode == "changes" else times
            inside = pc.sum(pc.and_(pc.greater_equal(shown, lo), pc.less(shown, plan.upper))).as_py() or 0
            r = planned.get(p.key)
            if r is None:
                assert inside == 0, f"{plan.describe()}: part {p.key} left out holds {inside} updates of the read"
                continue
            outside = len(times) - (pc.sum(pc.and_(pc.greater_equal(times, lo), pc.less(times, plan.upper))).as_py()
                                    or 0)
            if not r.cut and not r.advance:
                assert outside == 0, f"{plan.describe()}: part {p.key} unflagged holds {outside} times outside"
            assert r.schema_id == b.schema_id and r.source.id == b.schema_id


def test_every_reader_plans_the_same_parts_projections_and_times(tmp_path: Path) -> None:
    con = duckdb.connect()
    names = iter(range(10**6))
    checked: list[int] = []

    @settings(max_examples=HISTORIES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def histories(data: st.DataObject) -> None:
        shard, model = build_history(data, (tmp_path / f"h{next(names)}").as_uri())
        keeper = LeaseKeeper()
        try:
            for r in sample_reads(model, few=True):
                plans = _plans(shard, r, con, keeper)
                want = plans["pyarrow"]
                for engine, got in plans.items():
                    assert got == want, f"{engine} plans {r} otherwise than pyarrow:\n{got}\n{want}\n{model.log}"
                _check_against_files(shard, want)
                assert pickle.loads(pickle.dumps(want)) == want, "the Spark source ships its plan pickled"
                checked.append(len(want.parts))
        finally:
            keeper.close()

    histories()
    assert len(checked) > 4 * HISTORIES and any(checked) and not all(checked), checked
