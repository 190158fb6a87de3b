"""What one view write task costs: a spark-submit application vs a Spark Connect session (issue 45).

N view runs of one day each, of the example view's query (events per user per UTC day over the
input's updates: an aggregation, so it compares in full on either engine), over an input shard of
N days (``--rows`` updates a day, appended with pyarrow) in a local folder. Each run mints its
description, runs its write task as a fresh Python process standing for the Airflow task process,
and appends, in order, so every run reads the output the run before committed. The accounting is
bench/write_cost.py's (submit: the task's whole process tree; connect: the task process plus the
server tree's CPU over the arm / N, the server's start and one warm-up run not charged). After each
arm the view must equal the query computed here from the input's updates. Ends with
``FIGURE view-cost connect <CPU-s per task> submit <CPU-s per task>``; ``--record`` appends the
table to bench/RESULTS.md.

    python bench/view_cost.py [--tasks 8] [--rows 300] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import _path  # noqa: F401  (repo root on sys.path)
import pyarrow as pa
from proc_cpu import tree_cpu
from write_cost import DAY, START, Arm, append_results, children_cpu, section_head, table, task_env, task_file

from shardsink import Shard
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sinks.materialize import View, ViewInput, mint_view, view
from shardsink.spark.request import ViewWriteRequest, encode_request
from shardsink_dev.connect import connect_server

#: The example view's query (dags/example_view.py).
SQL = """SELECT user, to_date(timestamp_millis(_time)) AS day, sum(_diff) AS events FROM events
         GROUP BY user, to_date(timestamp_millis(_time)) HAVING sum(_diff) <> 0"""

SUBMIT_TASK = """
import json, os, subprocess, sys, tempfile
from shardsink.spark import build_pyfiles_zip, view_job_path
from shardsink.spark.request import ViewWriteRequest, decode_request, job_argv
req = decode_request(sys.stdin.read(), ViewWriteRequest)
out = os.path.join(tempfile.mkdtemp(), "outcome.json")
bin_dir = os.path.dirname(sys.executable)
r = subprocess.run([os.path.join(bin_dir, "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                    "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.sql.session.timeZone=UTC",
                    "--py-files", build_pyfiles_zip(), view_job_path(), *job_argv(req), "--result-path", out],
                   capture_output=True, text=True)
assert r.returncode == 0, r.stderr[-3000:]
print(json.dumps(json.load(open(out))["summary"]))
"""

CONNECT_TASK = """
import json, sys
import pyspark.sql.connect.session  # what the task's session needs
from shardsink.spark.connect import run_over_connect
from shardsink.spark.request import ViewWriteRequest, decode_request
print(json.dumps(run_over_connect(decode_request(sys.stdin.read(), ViewWriteRequest), url=sys.argv[1])))
"""


def input_shard(folder: Path, days: int, rows: int) -> str:
    """The input: ``days`` batches of ``rows`` updates (50 users, a few retractions)."""
    url = (folder / "events").as_uri()
    schema = pa.schema([("user", pa.string()), ("amount", pa.int64())])
    shard = Shard.create(url, schema, upper=START)
    rng = random.Random(7)
    for d in range(days):
        lo = START + d * DAY
        users = [f"u{rng.randrange(50)}" for _ in range(rows)]
        shard.append(pa.table({"user": users, "amount": [rng.randrange(100) for _ in users],
                               "_time": [lo + rng.randrange(DAY) for _ in users],
                               "_diff": [-1 if i % 17 == 16 else 1 for i in range(rows)]}), lower=lo, upper=lo + DAY)
    return url


def the_view(inp: str) -> View:
    return view(inputs={"events": ViewInput(inp, mode="updates")}, sql=SQL)


def run_view(script: str, args: list[str], v: View, out_url: str, day: int, env: dict[str, str]) -> tuple[float, float]:
    """Day ``day``'s run: mint, the write task as a fresh process, append. (wall, staged seconds)."""
    desc = mint_view(v, output_url=out_url, initial_upper=START, interval_end=START + (day + 1) * DAY, max_span=DAY,
                     dag_id="bench", run_id=f"r{day}", attempt=1)
    assert isinstance(desc, Description), desc
    req = ViewWriteRequest(shard_url=out_url, desc=desc, view=v.spec())
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, task_file(Path(tempfile.gettempdir()), script), *args],
                       input=encode_request(req), text=True, capture_output=True, env=env)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"a view task failed:\n{r.stderr[-4000:]}")
    res = append_from_manifests(Shard(out_url), desc, 1)
    assert res.status == "committed", res
    return wall, float(json.loads(r.stdout.strip().splitlines()[-1])["seconds"])


def check(inp: str, out_url: str, days: int) -> None:
    """The view as of its upper equals the query over the input's updates, computed here."""
    per: Counter[tuple[str, object]] = Counter()
    for r in Shard(inp).changes(START, START + days * DAY).to_pylist():
        per[(r["user"], datetime.fromtimestamp(r["_time"] / 1000, tz=UTC).date())] += r["_diff"]
    want = Counter({(u, d, n): 1 for (u, d), n in per.items() if n})
    got = Counter({(r["user"], r["day"], r["events"]): r["_count"] for r in Shard(out_url).snapshot().to_pylist()})
    assert got == want, (len(got), len(want))


def arm(name: str, folder: Path, inp: str, days: int, env: dict[str, str]) -> Arm:
    v, out_url = the_view(inp), (folder / f"view-{name}").as_uri()
    walls, staged = [], []
    if name == "submit":
        before = children_cpu()
        for d in range(days):
            w, s = run_view(SUBMIT_TASK, [], v, out_url, d, env)
            walls.append(w)
            staged.append(s)
        result = Arm(name, walls, staged, children_cpu() - before, 0.0)
    else:
        with connect_server(folder=folder / "server", env=env) as server:
            assert server.proc is not None
            run_view(CONNECT_TASK, [server.url], v, (folder / "warm").as_uri(), 0, env)  # not charged
            s0, before = tree_cpu(server.proc.pid), children_cpu()
            for d in range(days):
                w, s = run_view(CONNECT_TASK, [server.url], v, out_url, d, env)
                walls.append(w)
                staged.append(s)
            result = Arm(name, walls, staged, children_cpu() - before, tree_cpu(server.proc.pid) - s0)
            time.sleep(1)
            left = server.open_sessions()
        assert not left, left
    check(inp, out_url, days)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--rows", type=int, default=300)
    p.add_argument("--record", action="store_true", help="append the figures to bench/RESULTS.md")
    a = p.parse_args()
    load = os.getloadavg()
    env = task_env()
    with tempfile.TemporaryDirectory(prefix="shardsink-view-cost-") as tmp:
        folder = Path(tmp)
        inp = input_shard(folder, a.tasks, a.rows)
        arms = [arm("connect", folder, inp, a.tasks, env)]
        print(table(arms, a.tasks, a.rows), flush=True)
        arms.append(arm("submit", folder, inp, a.tasks, env))
    after = os.getloadavg()
    out = table(arms, a.tasks, a.rows).replace("engine (tasks of", "view write, engine (days of")
    print(out)
    head = section_head("view_cost", load, after)
    figure = f"FIGURE view-cost connect {arms[0].cpu_per_task:.2f} submit {arms[1].cpu_per_task:.2f}"
    if a.record:
        append_results(head, out, f"`{figure}`")
    print(figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
