"""The Shards page, the provider, lineage and metrics, against real Airflow processes.

ONE module-scoped stack serves every test here: an Airflow home where ``airflow dags
test example_ingest`` committed a day of landing files (with the OpenLineage file
transport and StatsD on a real UDP listener), then a real ``airflow api-server`` with
the shardsink plugin loaded from its entry point and the simple auth manager (users
``viewer``, ``admin`` and ``noassets`` with passwords from a file), extended by the
test-only tests/support/auth/shardsink_test_auth.py to deny ``noassets`` (an admin) access
to assets. ``[shardsink] shard_urls`` also names a shard not created yet and one evolved
with ``shardsink schema --add/--rename`` (its schema history). The DAG's shard also holds a
later day staged ahead of its upper (a backfill's run waiting its turn to append), and the
evolved one the parts a compaction replaced (awaiting GC). The browser test drives Debian's
headless Chromium (``make test`` installs it, as it does Java).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from af_helpers import DAY, REPO, START, VENV_BIN, Env, UdpListener, lineage_env, make_env, ok, read_lineage

from shardsink import Shard
from shardsink.cli import main
from shardsink.provider.inventory import shard_id
from shardsink.sinks.description import Description
from shardsink.sinks.staging import write_manifest
from shardsink_dev.synthetic import generate
from shardsink_dev.testing import free_port

PASSWORDS = {"viewer": "viewer-pw-3141", "admin": "admin-pw-2718", "noassets": "noassets-pw-1618"}
AUTH_DIR = REPO / "tests" / "support" / "auth"  # the test-only auth manager (shardsink_test_auth)
#: Planted in the api-server's and the DAG run's environment: must never appear in any response.
SECRET = "AKIAFAKE/not-a-real-secret-shardsink-9f8e7d"
#: A backfill's later day (2024-01-03), staged ahead of the shard's upper (2024-01-02), waiting its turn.
AHEAD = Description("backfill-2024-01-03", START + 2 * DAY, START + 3 * DAY, 1)
SCREENSHOT = os.environ.get("SHARDSINK_SCREENSHOT")  # e.g. docs/img/shards-page.png to refresh the README's


@dataclass
class Stack:
    af: Env
    base: str
    run_id: str
    shard_url: str
    lineage: list[dict[str, Any]]
    statsd: list[str]
    dags_test_output: str
    evolved_url: str
    tokens: dict[str, str] = field(default_factory=dict)

    def token(self, user: str) -> str:
        if user not in self.tokens:
            req = urllib.request.Request(f"{self.base}/auth/token", method="POST",
                                         data=json.dumps({"username": user, "password": PASSWORDS[user]}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                self.tokens[user] = json.loads(r.read())["access_token"]
        return self.tokens[user]

    def get(self, path: str, *, token: str | None = None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(self.base + path, headers=headers), timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, airflow_template: Path,
          connect_engine: dict[str, str]) -> Iterator[Stack]:
    """The demo shard written by one run of the example DAG (its write slot a Spark Connect session:
    the page reads shards, whichever engine wrote them), then the api-server on its Airflow home."""
    tmp = tmp_path_factory.mktemp("shards-page")
    af = make_env(tmp, airflow_template)
    af.env.update(connect_engine)
    generate(af.landing, start=START, days=1, files_per_day=2, rows_per_file=60)
    (af.home / "passwords.json").write_text(json.dumps(PASSWORDS))
    listener = UdpListener()
    port = free_port()
    af.env.update({
        "SHARDSINK_WRITERS": "1",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "viewer:viewer,admin:admin,noassets:admin",
        "AIRFLOW__CORE__AUTH_MANAGER": "shardsink_test_auth.NoAssetsAuthManager",
        "PYTHONPATH": os.pathsep.join(p for p in (str(AUTH_DIR), os.environ.get("PYTHONPATH", "")) if p),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(af.home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": "shardsink-test-jwt-secret-not-for-production",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        **lineage_env(tmp / "lineage.jsonl"),
        "AIRFLOW__SHARDSINK__SHARD_URLS": f"{(tmp / 'configured').as_uri()}, relative/path s3://Bad_Bucket/x "
                                          f"{(tmp / 'evolved').as_uri()}",
        **listener.env(),
    })
    try:
        out = ok(af.dags_test("2024-01-02"))
    finally:
        listener.close()
    lineage = read_lineage(tmp / "lineage.jsonl")
    shard = Shard.open(af.shard_url)
    writer = shard.log(limit=1)[0][1].writer
    assert writer.startswith("airflow:example_ingest/"), writer
    evolved = _evolved_shard((tmp / "evolved").as_uri())
    staged = shard.stage(pa.table({"user": ["u001"], "action": ["view"], "amount": [1], "_time": [AHEAD.lower]}),
                         lower=AHEAD.lower, upper=AHEAD.upper, desc_id=AHEAD.desc_id)
    write_manifest(shard, AHEAD, slot=0, slots=2, parts=staged.parts)  # one of its two slots staged
    log = open(af.home / "api-server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(VENV_BIN / "airflow"), "api-server", "--port", str(port), "--workers", "1"],
                            env=af.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    log.flush()
                    raise AssertionError("api-server did not start:\n" +
                                         (af.home / "api-server.log").read_text()[-4000:]) from None
                time.sleep(0.5)  # not ordering: the api-server's readiness, bounded by the deadline
        yield Stack(af, base, writer.split("/", 1)[1], shard.url, lineage, listener.lines, out, evolved)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _evolved_shard(url: str) -> str:
    """A shard with one batch, then ``shardsink schema --add score:double`` and ``--rename user:who``,
    a second batch and ``shardsink compact``: the two batches' parts await GC (versions 1 to 4 read them)."""
    shard = Shard.create(url, pa.schema([("user", pa.string()), ("n", pa.int64())]), upper=0)
    shard.append(pa.table({"user": ["a"], "n": [1], "_time": [0]}), lower=0, upper=1000)
    assert main(["schema", url, "--add", "score:double"]) == 0
    assert main(["schema", url, "--rename", "user:who"]) == 0
    Shard.open(url).append(pa.table({"who": ["b"], "n": [2], "score": [0.5], "_time": [1000]}), lower=1000,
                           upper=2000)
    assert main(["compact", url]) == 0
    return shard.url


def _routes(s: Stack) -> list[str]:
    sid = shard_id(s.shard_url)
    return ["/shardsink/ui/", "/shardsink/ui/shards.js", "/shardsink/api/shards", f"/shardsink/api/shards/{sid}",
            f"/shardsink/api/shards/{sid}/schema", f"/shardsink/api/shards/{sid}/snapshot"]


def test_every_plugin_route_refuses_missing_or_invalid_credentials(stack: Stack) -> None:
    for path in _routes(stack):
        assert stack.get(path)[0] == 401, path
        assert stack.get(path, token="not-a-jwt")[0] == 403, path
        status, body = stack.get(path, token=stack.token("viewer"))
        assert status == 200, (path, body[:300])
        assert SECRET not in body and PASSWORDS["viewer"] not in body
    # A shard that is not listed cannot be addressed (no probing of arbitrary paths).
    assert stack.get("/shardsink/api/shards/0123456789abcdef", token=stack.token("viewer"))[0] == 404


def test_a_user_the_auth_manager_denies_assets_gets_403_on_every_plugin_route(stack: Stack) -> None:
    token = stack.token("noassets")  # logged in: an admin, but the auth manager denies it assets
    assert stack.get("/api/v2/dags", token=token)[0] == 200  # a valid session everywhere else
    for path in _routes(stack):
        status, body = stack.get(path, token=token)
        assert status == 403, (path, status, body[:300])
        assert stack.get(path, token=stack.token("admin"))[0] == 200, path


def test_shards_api_lists_the_dag_shard_with_its_frontiers_and_last_dag_run(stack: Stack) -> None:
    status, body = stack.get("/shardsink/api/shards", token=stack.token("viewer"))
    assert status == 200
    rows = json.loads(body)["shards"]
    [row] = [r for r in rows if r["url"] == stack.shard_url]
    # [shardsink] shard_urls: listed before its shard exists; invalid entries are ignored.
    assert [(r["url"].rsplit("/", 1)[1], r["exists"]) for r in rows if r["url"] != stack.shard_url] == [
        ("configured", False), ("evolved", True)]
    info = Shard.open(stack.shard_url).info()
    assert (row["upper"], row["seqno"], row["rows"]) == (info.upper, info.seqno, 120)
    assert row["upper_time"] == "2024-01-02T00:00:00.000Z" and row["objects"]["counts"]["leaked"]["count"] == 0
    waiting = json.loads(stack.get(f"/shardsink/api/shards/{row['id']}", token=stack.token("viewer"))[1])[
        "staged_waiting"]
    assert [(w["desc_id"], w["lower_time"], w["upper_time"], w["staged_slots"], w["slots"], w["turn"])
            for w in waiting] == [(AHEAD.desc_id, "2024-01-03T00:00:00.000Z", "2024-01-04T00:00:00.000Z", 1, 2,
                                   "waiting")]
    assert (row["last_commit"]["dag_id"], row["last_commit"]["run_id"]) == ("example_ingest", stack.run_id)
    # The DAG run's "Shards" tab: the shards this run committed to.
    q = urllib.parse.urlencode({"dag_id": "example_ingest", "run_id": stack.run_id})
    [mine] = json.loads(stack.get(f"/shardsink/api/shards?{q}", token=stack.token("viewer"))[1])["shards"]
    assert mine["url"] == stack.shard_url and [c["seqno"] for c in mine["run_commits"]] == [1]
    q = urllib.parse.urlencode({"dag_id": "example_ingest", "run_id": "manual__other"})
    assert json.loads(stack.get(f"/shardsink/api/shards?{q}", token=stack.token("viewer"))[1])["shards"] == []
    status, body = stack.get(f"/shardsink/api/shards/{row['id']}/snapshot?as_of={info.upper - 1}",
                             token=stack.token("viewer"))
    snap = json.loads(body)
    assert status == 200 and snap["total_rows"] == 120 and len(snap["rows"]) == 100
    status, body = stack.get(f"/shardsink/api/shards/{row['id']}/snapshot?as_of={info.upper}",
                             token=stack.token("viewer"))
    assert status == 400 and "not readable" in body
    # The schema history: one implicit schema for the DAG's shard; the evolved one's as the CLI prints it.
    [only] = json.loads(stack.get(f"/shardsink/api/shards/{row['id']}/schema", token=stack.token("viewer"))[1])[
        "schemas"]
    assert (only["id"], only["seqno"], [f["name"] for f in only["fields"]]) == (0, 0, ["user", "action", "amount"])
    eid = shard_id(stack.evolved_url)
    hist = json.loads(stack.get(f"/shardsink/api/shards/{eid}/schema", token=stack.token("viewer"))[1])["schemas"]
    assert [(e["id"], e["seqno"]) for e in hist] == [(0, 0), (1, 2), (2, 3)] and all(e["at"] for e in hist[1:])
    assert [(f["id"], f["name"], f["type"]) for f in hist[-1]["fields"]] == [
        (1, "who", "string"), (2, "n", "int64"), (3, "score", "double")]
    detail = json.loads(stack.get(f"/shardsink/api/shards/{eid}", token=stack.token("viewer"))[1])
    assert detail["schema_history"] == hist and detail["schema_id"] == 2
    # The compacted-away parts await GC (not leaked), with what GC waits for: no retention is set.
    assert {c: n["count"] for c, n in detail["objects"]["counts"].items()} == {
        "live": 1, "retained": 2, "in_flight": 0, "leaked": 0}
    assert all(o["until"] == 4 and o["gc_after"] is None and "a retention on the shard" in o["why"]
               for o in detail["objects"]["objects"]), detail["objects"]
    assert stack.get(f"/shardsink/api/shards/{eid}/schema")[0] == 401


def _driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("chromium and chromedriver are required (make test installs them: apt-get install chromium "
                    "chromium-driver)")
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.binary_location = chromium
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_browser_logs_in_sees_the_shard_page_and_opens_the_commits_dag_run(stack: Stack, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    d = _driver()
    wait = WebDriverWait(d, 90)
    try:
        d.get(f"{stack.base}/auth/login")  # simple auth manager's login form
        wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys("viewer")
        d.find_element(By.NAME, "password").send_keys(PASSWORDS["viewer"])
        wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "button[type=submit]"))).click()
        wait.until(lambda d: "/auth/login" not in d.current_url)

        d.get(f"{stack.base}/plugin/shards")  # Browse → Shards: the page inside the Airflow UI
        wait.until(ec.frame_to_be_available_and_switch_to_it((By.CSS_SELECTOR, "iframe[src*='/shardsink/ui/']")))
        row = wait.until(ec.presence_of_element_located(
            (By.CSS_SELECTOR, f"tr[data-shard-row='{shard_id(stack.shard_url)}']")))
        assert row.find_element(By.CSS_SELECTOR, "td.upper").text == "2024-01-02 00:00:00"  # column: Upper (UTC)
        row.find_element(By.CSS_SELECTOR, "a[data-shard]").click()

        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#snapshot tbody tr")))
        assert "2024-01-02 00:00:00 UTC" in d.find_element(By.CSS_SELECTOR, ".card .upper").text
        up = d.find_element(By.CSS_SELECTOR, "#frontier-chart path.series-up").get_attribute("d")
        # The staged day: a band ahead of (above) the upper line, with its lower/upper, and its row.
        band = d.find_element(By.CSS_SELECTOR, f"#frontier-chart rect.staged-band[data-desc='{AHEAD.desc_id}']")
        assert (band.get_attribute("data-lower"), band.get_attribute("data-upper")) == (str(AHEAD.lower),
                                                                                      str(AHEAD.upper))
        bottom = float(band.get_attribute("y")) + float(band.get_attribute("height"))
        assert bottom < float(re.split(r"[V,]", up)[-1]), (band.get_attribute("y"), up)  # SVG y grows downwards
        waiting = d.find_element(By.CSS_SELECTOR, f"#staged-waiting tr.staged[data-desc='{AHEAD.desc_id}']").text
        assert "[2024-01-03 00:00:00 UTC, 2024-01-04 00:00:00 UTC)" in waiting and "1 / 2" in waiting, waiting
        commit = d.find_element(By.CSS_SELECTOR, "tr.commit[data-seqno='1']")
        assert "append" in commit.text and "120" in commit.text
        schema = d.find_element(By.CSS_SELECTOR, "#schema-history tr.schema[data-schema-id='0']").text
        assert "schema 0 (current)" in schema and "user: string" in schema and "amount: int64" in schema
        d.switch_to.default_content()
        shot = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "shards-page.png"
        d.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000

        d.switch_to.frame(d.find_element(By.CSS_SELECTOR, "iframe[src*='/shardsink/ui/']"))
        d.find_element(By.CSS_SELECTOR, "tr.commit[data-seqno='1'] a.dagrun").click()
        d.switch_to.default_content()
        wait.until(lambda d: "/dags/example_ingest/runs/" in d.current_url)
        assert urllib.parse.unquote(d.current_url).endswith(f"/dags/example_ingest/runs/{stack.run_id}")
        wait.until(lambda d: stack.run_id in d.find_element(By.TAG_NAME, "body").text)  # Airflow rendered the run
        assert SECRET not in d.page_source

        # An evolved shard's page shows its schema history, newest first.
        d.get(f"{stack.base}/shardsink/ui/?shard={shard_id(stack.evolved_url)}")
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#schema-history tr.schema")))
        found = d.find_elements(By.CSS_SELECTOR, "#schema-history tr.schema")
        rows = [r.text for r in found]
        assert [r.get_attribute("data-schema-id") for r in found] == ["2", "1", "0"], rows
        assert "schema 2 (current)" in rows[0] and "who: string (#1), n: int64 (#2), score: double (#3)" in rows[0]
        assert "user: string (#1), n: int64 (#2), score: double (#3)" in rows[1] and "UTC" in rows[1]
        assert "user: string (#1), n: int64 (#2)" in rows[2] and "creation" in rows[2]
        # Its compacted-away parts are labelled awaiting GC, not leaked: only leaks are red.
        retained = d.find_elements(By.CSS_SELECTOR, "#objects tr.object[data-class='retained']")
        assert len(retained) == 2 and not d.find_elements(By.CSS_SELECTOR, "#objects tr.object[data-class='leaked']")
        for r in retained:
            label = r.find_element(By.CSS_SELECTOR, "td")
            assert label.text == "awaiting GC" and "warn" not in (label.get_attribute("class") or ""), r.text
            assert "only state versions up to 4 reference it" in r.text and "not by time alone" in r.text, r.text
        card = d.find_element(By.CSS_SELECTOR, ".card[data-class='retained']").text.lower()
        assert "awaiting gc" in card and "2" in card, card
        assert "ok" in (d.find_element(By.CSS_SELECTOR, ".card[data-class='leaked'] .v").get_attribute("class") or "")
    finally:
        d.quit()


def _events(stack: Stack, task_id: str) -> list[dict[str, Any]]:
    return [e for e in stack.lineage if e.get("job", {}).get("name") == f"example_ingest.{task_id}"]


def test_dags_test_reports_lineage_from_the_landing_zone_to_the_shard(stack: Stack) -> None:
    landing = Path(stack.af.landing)
    shard_path = stack.shard_url.removeprefix("file://")
    for task_id in ("attempt_1.mint", "attempt_1.write", "attempt_1.append"):
        events = _events(stack, task_id)
        assert {e["eventType"] for e in events} >= {"START", "COMPLETE"}, (task_id, [e["eventType"] for e in events])
        for e in events:
            assert [(i["namespace"], i["name"]) for i in e["inputs"]] == [("file", str(landing))], task_id
            [out] = e["outputs"]
            assert (out["namespace"], out["name"]) == ("file", shard_path)
            assert [f["name"] for f in out["facets"]["schema"]["fields"]] == ["user", "action", "amount"]
    [done] = [e for e in _events(stack, "attempt_1.append") if e["eventType"] == "COMPLETE"]
    # The shard's current schema, with its field ids (no _time/_diff).
    assert [(f["name"], f.get("description")) for f in done["outputs"][0]["facets"]["schema"]["fields"]] == [
        ("user", "field id 1"), ("action", "field id 2"), ("amount", "field id 3")]
    stats = done["outputs"][0]["outputFacets"]["outputStatistics"]
    assert stats["rowCount"] == 120 and stats["size"] > 0


def test_dags_test_sends_commit_and_duration_metrics_to_statsd(stack: Stack) -> None:
    got = {ln.split(":", 1)[0]: ln.split(":", 1)[1] for ln in stack.statsd if ln.startswith("airflow.shardsink.")}
    assert got.get("airflow.shardsink.commits") == "1|c", got
    assert got.get("airflow.shardsink.staged_rows") == "120|c", got
    assert got.get("airflow.shardsink.staged_bytes", "").endswith("|c"), got
    size = int(got["airflow.shardsink.staged_bytes"].split("|")[0])
    assert size == sum(b.bytes for b in Shard.open(stack.shard_url).batches())
    for role in ("mint", "write", "append"):
        assert got.get(f"airflow.shardsink.task.{role}.duration", "").endswith("|ms"), (role, got)
    assert "airflow.shardsink.lost_races" not in got


def test_provider_and_plugin_are_discovered_from_the_package_entry_points(stack: Stack) -> None:
    env = {**stack.af.env, "AIRFLOW__CORE__PLUGINS_FOLDER": str(stack.af.home / "no-plugins-here")}
    r = ok(subprocess.run([str(VENV_BIN / "airflow"), "providers", "list", "-o", "json"], env=env,
                          capture_output=True, text=True, timeout=180))
    providers = {p["package_name"]: p for p in json.loads(r[r.index("["):r.rindex("]") + 1])}
    assert "shardsink" in providers and "apache-airflow-providers-openlineage" in providers
    r = subprocess.run([str(VENV_BIN / "airflow"), "plugins", "-o", "json"], env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    plugins = {p["name"]: p for p in json.loads(r.stdout[r.stdout.index("["):r.stdout.rindex("]") + 1])}
    mine = plugins["shardsink"]
    assert "EntryPoint(name='shardsink'" in mine["source"]
    assert [a["url_prefix"] for a in mine["fastapi_apps"]] == ["/shardsink"]
    assert {v["url_route"] for v in mine["external_views"]} == {"shards", "shards_run"}
    # Loaded once, not twice (a stale plugins/shardsink.egg-info from a source build would add a second copy
    # of the entry points: `make` removes it).
    assert "already registered" not in r.stdout + r.stderr
    assert (REPO / "plugins" / ".airflowignore").read_text().strip() == "shardsink/"
