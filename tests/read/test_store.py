"""Engine readers reach S3 exactly as the store does: the S3Access in effect (an Airflow
connection) wins over the environment, and no secret appears in a repr."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import duckdb
import pytest
from read_helpers import SCHEMA, Model, as_counter, write_history

import shardsink.read
from shardsink import Shard
from shardsink.read import store
from shardsink.storage.s3 import S3Access, using_s3_access
from shardsink_dev.testing import FAKE_ENV


def test_engines_use_the_s3_access_in_effect_over_the_environment(moto: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://shardsink-test/access-{uuid.uuid4().hex[:8]}"
    shard = Shard.create(url, SCHEMA)
    model = Model()
    write_history(shard, model, batches=2, seed=6)
    session = boto3.session.Session(aws_access_key_id=FAKE_ENV["AWS_ACCESS_KEY_ID"],
                                    aws_secret_access_key=FAKE_ENV["AWS_SECRET_ACCESS_KEY"],
                                    region_name=FAKE_ENV["AWS_DEFAULT_REGION"])
    access = S3Access(session=session, endpoint_url=moto.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")   # nothing listens there
    with using_s3_access(access):
        cfg = store.s3_config()
        assert cfg.endpoint == moto.endpoint and "testing" not in repr(cfg)
        with shardsink.read.duckdb(duckdb.connect(), url, as_of=19) as rel:
            assert as_counter(rel.fetchall()) == model.snapshot(19)
        with shardsink.read.polars(url, changes=(0, 20)) as lf:
            assert as_counter(lf.collect().rows()) == model.changes(0, 20)
