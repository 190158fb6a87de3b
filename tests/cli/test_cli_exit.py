"""The ``shardsink`` executable exits with its documented code, whatever pyarrow's threads do at exit.

Issue 17 item 8: ``shardsink gc --json`` once died with SIGABRT (``terminate called without
an active exception``) after reading a part that had no manifest: pyarrow's C++ thread
pools torn down by static destructors while a pool thread was still joinable
(apache/arrow#34314). The executable now ends with ``os._exit`` after flushing
(:func:`shardsink.cli.run`); these tests loop the sequence that failed and check every
exit code and every output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from shardsink import Shard

_SCRIPT = Path(sys.executable).with_name("shardsink")
SHARDSINK = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "shardsink"]
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.float64())])


def _rows(i: int) -> pa.Table:
    return pa.table({"k": [f"k{i}", f"k{i}b"], "v": [float(i), 0.5], "_time": [10 * i, 10 * i + 1]})


def test_gc_json_after_reading_a_part_without_manifest_exits_0_every_time(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA)
    for i in range(3):
        shard.append(_rows(i), lower=10 * i, upper=10 * (i + 1), desc_id=f"d{i}")
    for n in range(8):
        # A writer that staged a part and died before its manifest: GC reads the part's
        # _time column (pyarrow) to learn the description's lower, then deletes it.
        shard.stage(_rows(1), lower=10, upper=20, desc_id=f"crashed-{n}")
        out = subprocess.run([*SHARDSINK, "gc", url, "--grace", "0", "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (n, out.returncode, out.stderr[-2000:])
        assert "terminate called" not in out.stderr
        report = json.loads(out.stdout)
        assert report["parts_deleted"] == 1, report
    assert not list(shard._machine.blob.list("parts/crashed-"))


def test_every_exit_code_survives_the_hard_exit(tmp_path: Path) -> None:
    """0 with output flushed to a pipe, 2 for bad input (argparse and library), 1 for other failures."""
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA)
    shard.append(_rows(0), lower=0, upper=10, desc_id="d0")
    ok = subprocess.run([*SHARDSINK, "snapshot", url, "--format", "jsonl"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and len(ok.stdout.splitlines()) == 2, ok
    usage = subprocess.run([*SHARDSINK, "snapshot"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "usage:" in usage.stderr
    bad = subprocess.run([*SHARDSINK, "snapshot", url, "--as-of", "99"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "shardsink: error:" in bad.stderr and "99" in bad.stderr
    missing = subprocess.run([*SHARDSINK, "inspect", f"file://{tmp_path}/none"], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2, missing
    helped = subprocess.run([sys.executable, "-m", "shardsink", "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "usage:" in helped.stdout


def test_an_empty_or_bad_aws_endpoint_url_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    """Issue 35: ``AWS_ENDPOINT_URL=`` (set, but empty) used to end in botocore's bare
    ``ValueError: Invalid endpoint:`` traceback. It is a configuration error naming the
    variable (exit 2), as is a URL without a scheme; the service's own variable is named
    when it is the one used (botocore's order)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
    schema_file = tmp_path / "schema.jsonl"
    schema_file.write_text('{"k": "a"}\n')
    for var, value in (("AWS_ENDPOINT_URL", ""), ("AWS_ENDPOINT_URL_S3", "minio:9000")):
        out = subprocess.run([*SHARDSINK, "create", "s3://bucket/shards/x", "--schema-from", str(schema_file)],
                             capture_output=True, text=True, timeout=120, env={**env, var: value})
        assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
        assert out.stderr.startswith(f"shardsink: error: {var}={value!r} is not an S3 endpoint URL (http(s)://"), \
            out.stderr[-2000:]
        assert "Traceback" not in out.stderr and "unset it to use AWS S3" in out.stderr
