"""The README's main command (``make run``): the example persistence DAG end to end.

On the embedded default (local folder store, Spark local[2], a SQLite Airflow home in
``.airflow/``), it lands three days of synthetic events in ``.demo/landing``, runs
``dags/example_ingest.py`` with ``airflow dags test`` once per day, shows the shard's
upper advancing (``shardsink inspect``), compares per-day row counts with the source,
shows that re-running a completed interval changes nothing, then runs the example view
(``dags/example_view.py``, events per user per day) before and after a new day of input,
and ends with a maintenance run (``dags/example_maintenance.py``: advance since, compact,
GC, verify) showing batches and stored objects before and after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shardsink.core.shard import Shard
from shardsink.sources.landing import LandingSource, read_landing_file
from shardsink_dev.synthetic import DAY, generate, land_file, landing_table, publish_watermark

DAYS = 3
START = datetime(2024, 1, 1, tzinfo=UTC)
_SHOW = ("minted description", "committed:", "nothing to do", "lost the race", "SHARDSINK_WRITE",
         "SHARDSINK_MAINTENANCE")


def _repo_root() -> Path:
    for base in (Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[1]):
        if (base / "dags" / "example_ingest.py").is_file():
            return base
    raise SystemExit("cannot find dags/example_ingest.py; run `make run` from the shardsink checkout")


def _env(repo: Path, home: Path, demo: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PYTHONWARNINGS": "ignore",
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "SHARDSINK_DEMO_ROOT": str(demo),
        "SHARDSINK_LANDING": str(demo / "landing"),
        "SHARDSINK_SHARD": (demo / "shards" / "events").as_uri(),
        "SHARDSINK_VIEW": (demo / "shards" / "events_per_user_day").as_uri(),
        "SHARDSINK_START": START.date().isoformat(),  # the example DAGs' start_date: the synthetic data's first day
        "SHARDSINK_ICEBERG": "1",  # both shards keep an Iceberg view (the demo ends by reading one)
    })
    env.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type":"spark","host":"local[2]"}')
    # ``SHARDSINK_ENGINE=connect make run``: the write slots go to ``make connect``'s server
    env.setdefault("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
                   '{"conn_type":"spark_connect","host":"127.0.0.1","port":15002}')
    return env


def _airflow(env: dict[str, str], log: Path, *args: str) -> tuple[int, list[str]]:
    airflow = str(Path(sys.executable).parent / "airflow")
    with open(log, "w") as f:
        rc = subprocess.run([airflow, *args], env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    lines = log.read_text(errors="replace").splitlines()
    return rc, [ln for ln in lines if any(s in ln for s in _SHOW)]


def _say(text: str) -> None:
    print(text, flush=True)


def _inspect(env: dict[str, str], url: str) -> None:
    _say(f"$ shardsink inspect {url}")
    out = subprocess.run([sys.executable, "-m", "shardsink", "inspect", url], env=env, capture_output=True,
                         text=True).stdout
    for ln in out.splitlines():
        key, _, value = ln.partition(" ")
        if key in ("seqno", "batches", "rows"):
            _say(f"    {ln}")
        elif key == "upper" and value.strip().isdigit():
            when = datetime.fromtimestamp(int(value) / 1000, UTC).isoformat(timespec="minutes")
            _say(f"    {ln}   ({when})")


def _short(line: str) -> str:
    # structlog lines: "<ts> [info     ] message [logger] k=v ..." -> the message
    msg = line.split("] ", 1)[-1]
    return msg.split(" [shardsink", 1)[0].split(" [airflow", 1)[0].strip()


def main() -> None:
    t0 = time.monotonic()
    repo = _repo_root()
    home, demo = repo / ".airflow", repo / ".demo"
    shutil.rmtree(demo, ignore_errors=True)
    home.mkdir(exist_ok=True)
    (home / "demo-logs").mkdir(exist_ok=True)
    env = _env(repo, home, demo)
    url = env["SHARDSINK_SHARD"]
    start_ms = int(START.timestamp() * 1000)

    _say(f"== landing {DAYS} days of synthetic events in {demo / 'landing'}")
    per_day = generate(env["SHARDSINK_LANDING"], start=start_ms, days=DAYS, files_per_day=3, rows_per_file=300)
    _say(f"   {sum(per_day.values())} rows in {DAYS * 3} files (Parquet, CSV, JSONL); watermark = end of day {DAYS}")

    _say(f"== airflow db migrate (SQLite in {home})")
    rc, _ = _airflow(env, home / "demo-logs" / "migrate.log", "db", "migrate")
    if rc:
        raise SystemExit(f"airflow db migrate failed; see {home / 'demo-logs' / 'migrate.log'}")

    for d in range(DAYS):
        logical = (START + timedelta(days=d + 1)).date().isoformat()
        _say(f"\n== run {d + 1}: airflow dags test example_ingest {logical}   "
             f"(interval [{(START + timedelta(days=d)).date()}, {logical}))")
        _run_dag(env, home, "example_ingest", logical, f"run-{d + 1}")
        _inspect(env, url)

    _say("\n== per-day row counts: source vs shard")
    shard = Shard.open(url)
    src = LandingSource(env["SHARDSINK_LANDING"])
    schema = shard.schema
    times = [read_landing_file(src.blob(), f, schema, "event_time")["_time"].to_pylist() for f in src.files()]
    _say(f"   {'day':<12}{'source':>8}{'shard':>8}")
    ok = True
    for d in range(DAYS):
        lo, hi = start_ms + d * DAY, start_ms + (d + 1) * DAY
        n_src = sum(1 for ts in times for x in ts if lo <= x < hi)
        n_shard = sum(shard.changes(lo, hi)["_diff"].to_pylist())
        ok &= n_src == n_shard
        flag = "" if n_src == n_shard else "  MISMATCH"
        _say(f"   {(START + timedelta(days=d)).date()!s:<12}{n_src:>8}{n_shard:>8}{flag}")
    if not ok:
        raise SystemExit("the shard does not match the source")

    seqno = shard.info().seqno
    last = (START + timedelta(days=DAYS)).date().isoformat()
    _say(f"\n== re-running the last interval: airflow dags test example_ingest {last}")
    rc, shown = _airflow(env, home / "demo-logs" / "rerun.log", "dags", "test", "example_ingest", last)
    for line in shown:
        _say("   " + _short(line))
    if rc or shard.info().seqno != seqno:
        raise SystemExit("the re-run was not a no-op")
    _say(f"   no-op: shard still at seqno {seqno}, no Spark job started")
    _view_demo(env, home, start_ms)
    _maintenance_demo(env, home, [url, env["SHARDSINK_VIEW"]])
    _iceberg_demo(env, url)
    _say(f"\ndone in {time.monotonic() - t0:.0f}s. Logs: {home / 'demo-logs'}; shard: {url}; "
         f"view: {env['SHARDSINK_VIEW']}")


def _iceberg_demo(env: dict[str, str], url: str) -> None:
    """The events shard as an Iceberg table, read by Polars (no copy: the view's manifests list the
    shard's parts): its rows up to the shard's upper (the sum of ``_diff``; null is 1) against the
    source's."""
    import warnings

    import polars as pl

    from shardsink import iceberg

    # Polars plans the scan with pyiceberg (installed) when its own planner plugin is not: say nothing of it.
    warnings.filterwarnings("ignore", message="Iceberg scan planning")

    shard = Shard.open(url)
    upper = shard.info().upper
    assert upper is not None
    location = iceberg.current_location(shard)
    _say(f"\n== the events shard as an Iceberg table: pl.scan_iceberg({location!r})")
    n_ice = pl.scan_iceberg(location).filter(pl.col("_time") < upper).select(
        pl.col("_diff").fill_null(1).sum()).collect().item()
    src = LandingSource(env["SHARDSINK_LANDING"])
    n_src = sum(1 for f in src.files() for x in read_landing_file(src.blob(), f, shard.schema, "event_time")["_time"]
                .to_pylist() if x < upper)
    _say(f"   rows: {n_ice} through Polars' Iceberg reader, {n_src} in the source")
    if n_ice != n_src:
        raise SystemExit("the Iceberg view does not match the source")


def _run_dag(env: dict[str, str], home: Path, dag_id: str, logical: str, name: str) -> None:
    """``airflow dags test DAG LOGICAL``, showing the lines that tell what the run did."""
    t = time.monotonic()
    log = home / "demo-logs" / f"{name}.log"
    rc, shown = _airflow(env, log, "dags", "test", dag_id, logical)
    for line in shown:
        _say("   " + _short(line))
    if rc:
        raise SystemExit(f"the {dag_id} run failed; see {log}")
    _say(f"   run took {time.monotonic() - t:.1f}s")


def _run_view(env: dict[str, str], home: Path, logical: str, name: str) -> None:
    _say(f"\n== airflow dags test example_view {logical}   (events per user per day, self-correcting)")
    _run_dag(env, home, "example_view", logical, name)


def _view_demo(env: dict[str, str], home: Path, start_ms: int) -> None:
    """The materialize sink: a view over the shard, updated incrementally after new input."""
    view_url = env["SHARDSINK_VIEW"]
    _run_view(env, home, "2024-02-01", "view-1")
    view = Shard.open(view_url)
    rows = view.snapshot()
    _say(f"   the view holds {rows.num_rows} (user, day) rows; a few of them:")
    for r in sorted(rows.to_pylist(), key=lambda r: (r["day"], r["user"]))[:5]:
        _say(f"     {r['day']}  {r['user']:<8} {r['events']:>4} events")

    _say("\n== someone appends a wrong row to the view with the CLI (it should never be there)")
    tampered = view.info().upper
    assert tampered is not None
    bogus = home / "demo-logs" / "bogus.parquet"
    pq.write_table(pa.table({"user": ["mallory"], "day": [START.date()], "events": [999], "_time": [tampered]},
                            schema=pa.schema([*view.schema, pa.field("_time", pa.int64())])), bogus)
    _cli(env, "append", view_url, "--lower", str(tampered), "--upper", str(tampered + 1), "--input", str(bogus))

    _say(f"\n== new input: landing day {DAYS + 1} and ingesting it")
    day = start_ms + DAYS * DAY
    for i in range(2):
        land_file(env["SHARDSINK_LANDING"], f"day={DAYS:03d}/events-{i}.parquet",
                  landing_table(day, day + DAY, 40, seed=900 + i))
    publish_watermark(env["SHARDSINK_LANDING"], day + DAY)
    _run_dag(env, home, "example_ingest", (START + timedelta(days=DAYS + 1)).date().isoformat(), "run-new")
    _run_view(env, home, "2024-02-02", "view-2")
    after = Shard.open(view_url).snapshot()
    healed = "mallory" not in after["user"].to_pylist()
    _say(f"   the view now holds {after.num_rows} rows; the wrong row is {'gone' if healed else 'STILL THERE'}. "
         "The log shows the second view run wrote only the changed aggregates (the new day's rows) "
         "plus one retraction of the wrong row:")
    _cli(env, "log", view_url, "--limit", "4")
    if not healed:
        raise SystemExit("the view did not correct the foreign append")


def _footprint(url: str) -> tuple[int, int, int]:
    shard = Shard.open(url)
    return shard.info().stats.batches, shard.info().stats.parts, len(shard.admin().list_objects())


def _maintenance_demo(env: dict[str, str], home: Path, urls: list[str]) -> None:
    """Maintenance: the leftovers of a crashed writer are collected and the shards verify clean."""
    events = Shard.open(urls[0])
    info = events.info()
    assert info.upper is not None
    first = events.changes(info.since, info.upper).slice(0, 1)
    t = first["_time"][0].as_py()
    _say("\n== a writer crashes after staging a part for a description that can never commit")
    events.stage(first, lower=t, upper=t + 1, desc_id="crashed-writer")
    _say(f"   staged parts/crashed-writer/… at [{t}, {t + 1}): the shard's upper is long past it")
    before = {u: _footprint(u) for u in urls}
    _cli(env, "verify", urls[0])
    extra = {"SHARDSINK_MAINTENANCE_SHARDS": ",".join(urls), "SHARDSINK_GC_GRACE_S": "0"}
    _say("\n== airflow dags test example_maintenance 2024-02-03   (advance since, compact, GC, verify; "
         "grace 0 s for the demo, 1 h by default)")
    _run_dag({**env, **extra}, home, "example_maintenance", "2024-02-03", "maintenance")
    _say(f"   {'shard':<24}{'batches':>16}{'parts':>14}{'objects':>14}")
    for u in urls:
        (b0, p0, o0), (b1, p1, o1) = before[u], _footprint(u)
        _say(f"   {u.rsplit('/', 1)[-1]:<24}{b0:>8} -> {b1:<5}{p0:>7} -> {p1:<4}{o0:>7} -> {o1:<4}")
    _cli(env, "verify", urls[0])


def _cli(env: dict[str, str], *args: str) -> None:
    _say(f"   $ shardsink {' '.join(args)}")
    r = subprocess.run([sys.executable, "-m", "shardsink", *args], env=env, capture_output=True, text=True)
    for ln in (r.stdout + r.stderr).splitlines():
        _say("     " + ln)
    if r.returncode:
        raise SystemExit(f"shardsink {args[0]} failed (exit {r.returncode})")


if __name__ == "__main__":
    main()
