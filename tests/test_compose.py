"""The docker compose deployment (docker-compose.yaml) validates and keeps its promises.

Needs only the Docker *client* with the compose plugin (``docker compose``) or a v2+
``docker-compose`` binary: ``docker compose config`` resolves the file without an
engine. Those tests are skipped, saying why, when neither is installed; the static
check for literal secrets always runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yaml"

AIRFLOW_SERVICES = ["airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer", "airflow-worker"]
SPARK_SERVICES = ["spark-master", "spark-worker"]
OTHER_SERVICES = ["postgres", "redis", "minio", "minio-init"]
#: The services that grow with ``docker compose up --scale <service>=N`` (docs/deployment.md).
SCALABLE = ["airflow-worker", "spark-worker"]

#: The variables that carry credentials, with their documented dev defaults (.env.example).
DEV_SECRETS = {
    "MINIO_ROOT_USER": "minioadmin",
    "MINIO_ROOT_PASSWORD": "minioadmin",
    "POSTGRES_PASSWORD": "airflow",
    "AIRFLOW_ADMIN_PASSWORD": "admin",
    "AIRFLOW_JWT_SECRET": "shardsink-dev-jwt-secret",
    "AIRFLOW_API_SECRET_KEY": "shardsink-dev-api-secret",
    "AIRFLOW_FERNET_KEY": "",
    "REDIS_PASSWORD": "shardsink-dev-redis",
}
#: Where the shared services are, for hosts that run only workers (docs/deployment.md).
HOST_VARS = ("POSTGRES_HOST", "REDIS_HOST", "S3_ENDPOINT_URL", "SPARK_MASTER_HOST", "AIRFLOW_API_URL")
SECRET_KEY = re.compile(r"PASSWORD|SECRET|ACCESS_KEY|FERNET|TOKEN|CREDENTIAL", re.I)
INTERPOLATION = re.compile(r"^\$\{(?P<var>[A-Z0-9_]+)(:-(?P<default>[^}]*))?\}$")


def _compose_command() -> tuple[list[str] | None, str]:
    """The compose command, or None and why there is none."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"], ""
    for candidate in (shutil.which("docker-compose"), str(Path(sys.executable).parent / "docker-compose")):
        if candidate and os.access(candidate, os.X_OK):
            out = subprocess.run([candidate, "version", "--short"], capture_output=True, text=True)
            if out.returncode == 0 and re.match(r"v?([2-9]|\d{2,})\.", out.stdout.strip()):
                return [candidate], ""
    why = ("the Docker client has no compose plugin (`docker compose version` failed)" if docker
           else "the Docker client is not installed (no `docker` on PATH)")
    return None, (f"{why} and no v2+ `docker-compose` binary was found; install the compose plugin to run "
                  "`docker compose config` (no Docker engine is needed)")


COMPOSE, NO_COMPOSE_REASON = _compose_command()
needs_compose = pytest.mark.skipif(COMPOSE is None, reason=NO_COMPOSE_REASON)


def _config(**env: str) -> dict[str, Any]:
    """``docker compose config --format json``, with a clean environment plus ``env``."""
    assert COMPOSE is not None
    clean = {k: v for k, v in os.environ.items()
             if k not in DEV_SECRETS and k not in HOST_VARS and not k.startswith(("SHARDSINK_", "COMPOSE_"))}
    out = subprocess.run(
        [*COMPOSE, "--env-file", os.devnull, "-f", str(COMPOSE_FILE), "config", "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, env={**clean, **env}, timeout=120,
    )
    assert out.returncode == 0, f"docker compose config failed:\n{out.stderr}"
    return yaml.safe_load(out.stdout)


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return _config()


@needs_compose
def test_config_validates_quietly() -> None:
    assert COMPOSE is not None
    out = subprocess.run([*COMPOSE, "--env-file", os.devnull, "-f", str(COMPOSE_FILE), "config", "-q"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr


@needs_compose
def test_all_services_are_defined(config: dict[str, Any]) -> None:
    missing = set(AIRFLOW_SERVICES + SPARK_SERVICES + OTHER_SERVICES) - set(config["services"])
    assert not missing, f"services missing from docker-compose.yaml: {sorted(missing)}"


@needs_compose
def test_airflow_commands(config: dict[str, Any]) -> None:
    s = config["services"]
    assert "airflow db migrate" in " ".join(s["airflow-init"]["command"])
    assert "airflow api-server" in " ".join(s["airflow-apiserver"]["command"])
    assert s["airflow-scheduler"]["command"] == ["scheduler"]
    assert s["airflow-dag-processor"]["command"] == ["dag-processor"]
    assert s["airflow-triggerer"]["command"] == ["triggerer"]
    assert s["airflow-worker"]["command"] == ["celery", "worker"]


@needs_compose
def test_spark_runs_from_the_airflow_image(config: dict[str, Any]) -> None:
    """Driver (scheduler) and executors (worker) share Python, pyspark and shardsink by construction."""
    s = config["services"]
    image = s["airflow-scheduler"]["image"]
    build = s["airflow-scheduler"]["build"]
    for name in AIRFLOW_SERVICES + SPARK_SERVICES:
        assert s[name]["image"] == image, f"{name} uses {s[name]['image']}, not {image}"
        assert s[name]["build"] == build, f"{name} builds a different image than the scheduler"
    assert "org.apache.spark.deploy.master.Master" in s["spark-master"]["command"]
    worker = s["spark-worker"]["command"]
    assert "org.apache.spark.deploy.worker.Worker" in worker and "spark://spark-master:7077" in worker


@needs_compose
def test_image_pins_match_requirements(config: dict[str, Any]) -> None:
    dockerfile = config["services"]["airflow-scheduler"]["build"]["dockerfile_inline"]
    reqs = dict(line.split("==", 1) for line in (ROOT / "requirements.txt").read_text().split() if "==" in line)
    base = re.search(r"^FROM apache/airflow:(\S+)-python(\d+\.\d+)$", dockerfile, re.M)
    assert base, "the image must be built FROM apache/airflow:<version>-python<x.y>"
    assert base.group(1) == reqs["apache-airflow"], "base image and requirements.txt pin different Airflow versions"
    assert base.group(2) == "3.11"
    assert "pip install --no-cache-dir -r /opt/airflow/requirements.txt" in dockerfile
    assert reqs["pyspark"] == reqs["pyspark-client"], "pyspark and pyspark-client must be pinned to one version"


@needs_compose
def test_dependencies_wait_for_health(config: dict[str, Any]) -> None:
    s = config["services"]
    for name in AIRFLOW_SERVICES:
        assert s[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in AIRFLOW_SERVICES[1:]:
        assert s[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
        assert s[name]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
        assert "healthcheck" in s[name], f"{name} has no healthcheck"
    for name in AIRFLOW_SERVICES[1:]:
        assert s[name]["depends_on"]["redis"]["condition"] == "service_healthy", f"{name} starts before the broker"
    # The write tasks' Spark drivers run in the Celery workers (client mode).
    assert s["airflow-worker"]["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert s["spark-worker"]["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert s["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"
    for name in ("postgres", "redis", "minio", *SPARK_SERVICES):
        assert "healthcheck" in s[name], f"{name} has no healthcheck"


@needs_compose
def test_example_dag_is_wired_to_minio_and_spark(config: dict[str, Any]) -> None:
    s = config["services"]
    for name in ("airflow-scheduler", "airflow-dag-processor", "airflow-worker"):
        env = s[name]["environment"]
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert env["SHARDSINK_SHARD"].startswith("s3://shardsink/")
        assert env["SHARDSINK_LANDING"].startswith("s3://shardsink/landing/")
        conn = yaml.safe_load(env["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert (conn["conn_type"], conn["host"], conn["port"]) == ("spark", "spark://spark-master", 7077)
        mounts = {v["target"] for v in s[name]["volumes"]}
        assert {"/opt/airflow/dags", "/opt/airflow/plugins", "/opt/airflow/spark_jobs"} <= mounts
    # Executors write parts to MinIO: the worker gets the same endpoint and credentials.
    assert s["spark-worker"]["environment"]["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert "mc mb --ignore-existing" in " ".join(s["minio-init"]["command"])


@needs_compose
def test_compose_sets_only_settings_the_example_dags_read(config: dict[str, Any]) -> None:
    read = {v for f in sorted((ROOT / "dags").glob("example_*.py"))
            for v in re.findall(r"""["'](SHARDSINK_[A-Z0-9_]+)["']""", f.read_text())}
    env = config["services"]["airflow-scheduler"]["environment"]
    set_here = {k for k in env if k.startswith("SHARDSINK_")}
    assert set_here <= read, f"compose sets {sorted(set_here - read)}, which no dags/example_*.py reads"
    assert {"SHARDSINK_SHARD", "SHARDSINK_LANDING", "SHARDSINK_VIEW", "SHARDSINK_ARRIVALS_SHARD"} <= set_here


#: Run under compose's environment: every DAG of dags/ as parsed, and what each one writes, reads
#: and maintains (one JSON line). The shards a write task writes are its shard_url and, for a
#: reclocked source, its remap shard.
_DAG_SETTINGS = """
import json, os
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
out = {"errors": {k: str(v)[-2000:] for k, v in bag.import_errors.items()}, "dags": {}}
for dag_id, dag in sorted(bag.dags.items()):
    got = out["dags"][dag_id] = {"writes": [], "reads": [], "sources": [], "brokers": [], "maintains": []}
    if "maintain" in dag.task_dict:
        got["maintains"] = list(dag.get_task("maintain").op_kwargs_expand_input.value["url"])
    write = dag.task_dict.get("attempt_1.write")
    if write is None:
        continue
    kw = write.partial_kwargs
    got["writes"].append(kw["shard_url"])
    spec = kw.get("source_spec") or {}
    if spec.get("remap"):
        got["writes"].append(spec["remap"])
    got["sources"] += [spec["root"]] if spec.get("root") else []
    got["brokers"] += [spec["bootstrap"]] if spec.get("bootstrap") else []
    got["reads"] += [i["url"] for i in (kw.get("view_spec") or {}).get("inputs", {}).values()]
print("DAG_SETTINGS " + json.dumps(out))
"""


@needs_compose
def test_every_example_dag_points_at_the_stacks_own_services_and_no_two_writers_share_a_shard(
        config: dict[str, Any], tmp_path: Path) -> None:
    """Issue 35: each example DAG, parsed with the environment compose gives the DAG processor, writes
    and reads only shards in the stack's MinIO bucket and lands from it; no shard has two writers
    (example_arrivals once wrote the ingest shard); no DAG falls back to a container-local folder
    or to 127.0.0.1; example_kafka is left out (the stack runs no Kafka)."""
    s = config["services"]
    bucket = f"s3://{s['minio-init']['environment']['SHARDSINK_BUCKET']}/"
    compose_env = s["airflow-dag-processor"]["environment"]
    assert compose_env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    def settings(name: str) -> dict[str, str]:
        return {k: v for k, v in s[name]["environment"].items() if k.startswith("SHARDSINK_")}

    # The DAG files are parsed by the DAG processor and again by every task: one reading.
    assert settings("airflow-scheduler") == settings("airflow-worker") == settings("airflow-dag-processor")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SHARDSINK", "AWS_"))}
    env.update({k: str(v) for k, v in compose_env.items() if k.startswith("SHARDSINK_")})
    env.update({"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONWARNINGS": "ignore"})
    r = subprocess.run([sys.executable, "-c", _DAG_SETTINGS], capture_output=True, text=True, env=env, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("DAG_SETTINGS ")), None)
    assert r.returncode == 0 and line is not None, (r.stdout + r.stderr)[-4000:]
    got = json.loads(line.removeprefix("DAG_SETTINGS "))
    assert not got["errors"], got["errors"]
    dags = got["dags"]
    assert sorted(dags) == ["example_arrivals", "example_ingest", "example_maintenance", "example_view"]

    urls = [(d, what, u) for d, g in dags.items() for what in ("writes", "reads", "sources", "maintains")
            for u in g[what]]
    outside = [(d, what, u) for d, what, u in urls if not u.startswith(bucket)]
    assert not outside, f"settings outside the stack's bucket {bucket} (a local fallback?): {outside}"
    assert not [b for g in dags.values() for b in g["brokers"]], "a DAG reads a broker this stack does not run"

    writers: dict[str, list[str]] = {}
    for d, g in dags.items():
        for u in g["writes"]:
            writers.setdefault(u.rstrip("/"), []).append(d)
    shared = {u: ds for u, ds in writers.items() if len(ds) > 1}
    assert not shared, f"shards with more than one writer DAG: {shared}"
    ingest = dags["example_ingest"]["writes"][0]
    assert ingest == compose_env["SHARDSINK_SHARD"] and dags["example_ingest"]["sources"] == [
        compose_env["SHARDSINK_LANDING"]]
    assert dags["example_view"]["reads"] == [ingest]
    assert dags["example_view"]["writes"] == [compose_env["SHARDSINK_VIEW"]]
    assert dags["example_arrivals"]["writes"] == [compose_env["SHARDSINK_ARRIVALS_SHARD"],
                                                  compose_env["SHARDSINK_ARRIVALS_SHARD"] + "-remap"]
    assert sorted(dags["example_maintenance"]["maintains"]) == sorted([ingest, compose_env["SHARDSINK_VIEW"]])


@needs_compose
def test_every_airflow_component_uses_celery_on_redis_with_the_db_as_result_backend(config: dict[str, Any]) -> None:
    s = config["services"]
    db = s["airflow-scheduler"]["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    for name in AIRFLOW_SERVICES:
        env = s[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert re.fullmatch(r"redis://default:[^@]+@redis:6379/0", env["AIRFLOW__CELERY__BROKER_URL"]), name
        # Celery's result backend is the metadata DB (same host, user and database, SQLAlchemy's db+ form).
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+" + db.replace("postgresql+psycopg2", "postgresql"), name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == db, name
        # Workers preload shardsink before forking (tests/airflow/test_celery_config.py).
        assert env["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"] == "shardsink.airflow.celery_config.CELERY_CONFIG", name
    # The broker's password reaches redis-server through a config file, never its command line.
    redis = s["redis"]
    assert "requirepass" in " ".join(redis["command"]) and "$REDIS_PASSWORD" in " ".join(redis["command"])
    assert redis["environment"]["REDISCLI_AUTH"] == redis["environment"]["REDIS_PASSWORD"]


@needs_compose
def test_scalable_services_have_no_fixed_name_hostname_or_host_port(config: dict[str, Any]) -> None:
    """``--scale airflow-worker=N --scale spark-worker=N`` needs replicas that can coexist: a
    container_name or host port would collide, a fixed hostname would give every Celery worker
    the same node name (celery@<hostname>)."""
    s = config["services"]
    for name in SCALABLE:
        for key in ("container_name", "ports", "hostname"):
            assert not s[name].get(key), f"{name} sets {key}: {s[name].get(key)!r}; its replicas would collide"
        assert "healthcheck" in s[name], name
    assert s["airflow-worker"]["environment"]["DUMB_INIT_SETSID"] == "0"  # warm shutdown of Celery
    for name, svc in s.items():  # and nothing binds a host port beyond localhost
        for port in svc.get("ports") or ():
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond localhost"


@needs_compose
def test_a_worker_host_points_its_workers_at_the_central_services() -> None:
    """What a second machine's .env sets (docs/deployment.md): every URL a worker reads moves there."""
    central = {"POSTGRES_HOST": "10.0.0.5:5432", "REDIS_HOST": "10.0.0.5", "S3_ENDPOINT_URL": "http://10.0.0.6:9000",
               "SPARK_MASTER_HOST": "10.0.0.7", "AIRFLOW_API_URL": "http://10.0.0.5:8080"}
    s = _config(**central)["services"]
    for name in ("airflow-worker", "airflow-triggerer", "airflow-scheduler"):
        env = s[name]["environment"]
        assert "@10.0.0.5:5432/airflow" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert "@10.0.0.5:5432/airflow" in env["AIRFLOW__CELERY__RESULT_BACKEND"]
        assert "@10.0.0.5:6379/0" in env["AIRFLOW__CELERY__BROKER_URL"]
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://10.0.0.5:8080/execution/"
        assert env["AWS_ENDPOINT_URL"] == "http://10.0.0.6:9000"
        assert yaml.safe_load(env["AIRFLOW_CONN_SPARK_DEFAULT"])["host"] == "spark://10.0.0.7"
    assert "spark://10.0.0.7:7077" in s["spark-worker"]["command"]
    assert s["spark-worker"]["environment"]["AWS_ENDPOINT_URL"] == "http://10.0.0.6:9000"
    leftovers = [(n, k, v) for n in SCALABLE for k, v in s[n]["environment"].items()
                 if re.search(r"(@|//)(postgres|redis|minio|spark-master|airflow-apiserver)\b", str(v))]
    assert not leftovers, f"still pointing at this host's services: {leftovers}"


def _environments(raw: dict[str, Any]) -> list[tuple[str, str, Any]]:
    out = []
    for name, svc in raw["services"].items():
        env = svc.get("environment") or {}
        items = env.items() if isinstance(env, dict) else (e.split("=", 1) for e in env)
        out += [(name, k, v) for k, v in items]
    return out


def test_no_literal_secrets_in_the_file() -> None:
    """Every credential is ``${VAR:-dev default}`` (or ``${VAR}``) with a documented default."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    checked = 0
    for service, key, value in _environments(raw):
        for password in re.findall(r"://[^:/@\s]+:([^@\s]+)@", str(value)):
            m = INTERPOLATION.match(password)
            assert m and m["var"] in DEV_SECRETS, f"{service}: {key} embeds a literal password in a URL"
        if not SECRET_KEY.search(key) or key.endswith("_FILE"):
            continue
        checked += 1
        m = INTERPOLATION.match(str(value))
        assert m, f"{service}: {key} is a literal ({value!r}); use ${{VAR:-dev default}}"
        assert m["var"] in DEV_SECRETS, f"{service}: {key} reads ${m['var']}, which is not a documented secret"
        assert (m["default"] or "") == DEV_SECRETS[m["var"]], f"{service}: undocumented default for {m['var']}"
    assert checked >= 8
    documented = (ROOT / ".env.example").read_text()
    for var in DEV_SECRETS:
        assert re.search(rf"^{var}=", documented, re.M), f"{var} is not documented in .env.example"


@needs_compose
def test_overridden_secrets_leave_no_default_behind() -> None:
    overrides = {var: f"override-{var.lower()}-x9" for var in DEV_SECRETS}
    resolved = _config(**overrides)
    s = resolved["services"]
    for name in ("airflow-scheduler", "airflow-apiserver", "spark-worker", "spark-master"):
        env = s[name]["environment"]
        assert env["AWS_ACCESS_KEY_ID"] == overrides["MINIO_ROOT_USER"]
        assert env["AWS_SECRET_ACCESS_KEY"] == overrides["MINIO_ROOT_PASSWORD"]
    assert s["minio"]["environment"]["MINIO_ROOT_PASSWORD"] == overrides["MINIO_ROOT_PASSWORD"]
    assert overrides["POSTGRES_PASSWORD"] in s["airflow-scheduler"]["environment"][
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    for name in ("airflow-scheduler", "airflow-worker"):
        env = s[name]["environment"]
        assert f":{overrides['REDIS_PASSWORD']}@" in env["AIRFLOW__CELERY__BROKER_URL"]
        assert f":{overrides['POSTGRES_PASSWORD']}@" in env["AIRFLOW__CELERY__RESULT_BACKEND"]
    assert s["redis"]["environment"]["REDISCLI_AUTH"] == overrides["REDIS_PASSWORD"]
    for service, key, value in _environments(resolved):
        if SECRET_KEY.search(key) and not key.endswith("_FILE") and value:
            assert value not in DEV_SECRETS.values(), f"{service}: {key} kept a dev default after override"
