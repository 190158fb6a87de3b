"""``aws_conn_id`` end to end: the S3 store's credentials exist ONLY in an Airflow ``aws``
connection (resolved by the amazon provider's hook), and the secret leaks nowhere.

The Airflow process gets no ``AWS_*`` variable, no shared config/credentials file and no
instance metadata; the connection (``AIRFLOW_CONN_...`` JSON) holds the keys, region and
the moto endpoint. A control run without the connection cannot reach the store; the run
with it ingests exactly once, and the secret appears in no task log or output, XCom,
rendered template (the whole Airflow DB is searched), spark-submit command line (recorded
by a wrapper), staged manifest (copied by a test hook before the commit) or store object.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import textwrap
import uuid
from pathlib import Path

from af_helpers import DAY, START, VENV_BIN, Env, assert_exactly_once, assert_no_leaks, ok
from support.inject.faultpoints import fault_env

from shardsink import Shard
from shardsink_dev.synthetic import generate
from shardsink_dev.testing import MotoServer

CONN_ID = "shardsink_s3"


def _grep(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in sorted(root.rglob("*")) if p.is_file() and needle in p.read_bytes()]


def test_credentials_only_in_the_connection_reach_tasks_and_spark_and_leak_nowhere(
        af: Env, moto: MotoServer, tmp_path: Path, airflow_template: Path) -> None:
    import boto3

    secret = f"SsConnSecret{uuid.uuid4().hex}"
    access_key = f"AKIASS{uuid.uuid4().hex[:14].upper()}"
    bucket = "e2e-aws-conn"
    moto.make_bucket(bucket)
    landing, shard_url = f"s3://{bucket}/landing", f"s3://{bucket}/shards/events"
    generate(landing, start=START, days=1, files_per_day=2, rows_per_file=60)  # this process has moto's env

    real = shutil.which("spark-submit", path=af.env["PATH"])
    assert real is not None
    wrapper_dir, argv_log = tmp_path / "wrapper", tmp_path / "spark-submit-argv.txt"
    wrapper_dir.mkdir()
    (wrapper_dir / "spark-submit").write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" >> {argv_log}\nexec {real} "$@"\n')
    (wrapper_dir / "spark-submit").chmod(0o755)
    nowhere = str(tmp_path / "no-aws-config")
    env = {k: v for k, v in af.env.items() if not k.startswith("AWS_")}
    env.update({
        "PATH": f"{wrapper_dir}:{af.env['PATH']}",
        "AWS_CONFIG_FILE": nowhere, "AWS_SHARED_CREDENTIALS_FILE": nowhere, "AWS_EC2_METADATA_DISABLED": "true",
        "SHARDSINK_LANDING": landing, "SHARDSINK_SHARD": shard_url, "SHARDSINK_WRITERS": "1",
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps({
            "conn_type": "aws", "login": access_key, "password": secret,
            "extra": {"endpoint_url": moto.endpoint, "region_name": "us-east-1"}}),
    })
    af.env = env

    # Control: the same run without aws_conn_id has no way to reach the store.
    home_b = tmp_path / "ah-control"
    home_b.mkdir()
    shutil.copy(airflow_template, home_b / "airflow.db")
    r = af.dags_test("2024-01-02", home=home_b, extra={"SHARDSINK_AWS_CONN_ID": "", "SHARDSINK_TASK_RETRIES": "0"})
    assert r.returncode != 0 and "Unable to locate credentials" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]

    staged = tmp_path / "staged"
    out = ok(af.dags_test("2024-01-02", extra={"SHARDSINK_AWS_CONN_ID": CONN_ID,
                                               **fault_env({"copy_staged": {"to": str(staged)}}, env)}))
    assert Shard.open(shard_url).info().upper == START + DAY
    assert_exactly_once(shard_url, landing, START, START + DAY)
    assert_no_leaks(shard_url)

    needle = secret.encode()
    assert secret not in out, "the secret is in the dags test output (task logs)"
    assert _grep(af.home, needle) == [], "the secret is in the Airflow home (logs, DB: XCom, rendered fields)"
    with sqlite3.connect(af.home / "airflow.db") as db:
        xcoms = db.execute("SELECT value FROM xcom").fetchall()
        rendered = db.execute("SELECT rendered_fields FROM rendered_task_instance_fields").fetchall()
    assert xcoms and rendered, "nothing was searched: no XCom or rendered fields were recorded"
    assert all(secret not in str(v) for v in [*xcoms, *rendered])
    argv = argv_log.read_text()
    assert "ingest_write.py" in argv and "--result-path" in argv, argv
    assert secret not in argv and access_key not in argv, "credentials on the spark-submit command line"
    manifests = _grep(staged, b'"desc_id"')
    assert manifests and _grep(staged, needle) == [], "no manifest copied, or the secret is in one"
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, **{k: v for k, v in [
        ("aws_access_key_id", "testing"), ("aws_secret_access_key", "testing"), ("region_name", "us-east-1")]})
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert any(k.startswith("shards/events/state/") for k in keys)
    leaked = [k for k in keys if needle in s3.get_object(Bucket=bucket, Key=k)["Body"].read()]
    assert leaked == [], f"the secret is in store objects {leaked}"


def test_store_access_uses_the_hooks_session_and_leaves_os_environ_alone(af: Env) -> None:
    """In a task process: clients built inside ``store_access`` carry the connection's keys,
    region and endpoint; ``os.environ`` is byte-for-byte unchanged; no repr shows the secret."""
    script = textwrap.dedent("""
        import os
        before = dict(os.environ)
        from shardsink.airflow.credentials import store_access
        from shardsink.storage.s3 import make_client
        with store_access("conn_unit") as access:
            c = make_client()
            creds = c._request_signer._credentials
            assert (creds.access_key, creds.secret_key) == ("AKIAUNIT", "UnitSecret42"), creds.access_key
            assert c.meta.endpoint_url == "http://127.0.0.1:9" and c.meta.region_name == "eu-west-1"
            assert "UnitSecret42" not in repr(access) + repr(access.s3())
            assert access.spark_env()["AWS_SECRET_ACCESS_KEY"] == "UnitSecret42"
        outside = make_client()._request_signer._credentials
        assert outside is None or outside.access_key != "AKIAUNIT"
        assert dict(os.environ) == before, "os.environ changed"
        print("STORE_ACCESS_OK")
    """)
    env = {k: v for k, v in af.env.items() if not k.startswith("AWS_")}
    env["AIRFLOW_CONN_CONN_UNIT"] = json.dumps({"conn_type": "aws", "login": "AKIAUNIT", "password": "UnitSecret42",
                                                "extra": {"endpoint_url": "http://127.0.0.1:9",
                                                          "region_name": "eu-west-1"}})
    out = ok(subprocess.run([str(VENV_BIN / "python"), "-c", script], env=env, capture_output=True, text=True,
                            timeout=120))
    assert "STORE_ACCESS_OK" in out
