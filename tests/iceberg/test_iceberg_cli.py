"""``shardsink iceberg`` and ``create --iceberg``: locations printed, catalogs registered, hostile
input refused (exit 2, nothing written)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pyiceberg.catalog
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import StaticTable
from pyiceberg.utils.config import Config

from shardsink.cli import main
from shardsink.core.shard import Shard

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


@pytest.fixture
def made(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> str:
    pq.write_table(SCHEMA.empty_table(), f"{tmp_path}/schema.parquet")
    url = f"file://{tmp_path}/s"
    assert main(["create", url, "--schema-from", f"{tmp_path}/schema.parquet", "--iceberg"]) == 0
    capsys.readouterr()
    return url


def test_create_with_iceberg_then_print_the_location_and_as_of(made: str, capsys: pytest.CaptureFixture[str]) -> None:
    shard = Shard.open(made)
    shard.append(pa.table({"k": ["a"], "v": [1], "_time": [3], "_diff": [1]}), lower=0, upper=10)
    assert main(["iceberg", made]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(f"v{shard.reader().head().seqno}.metadata.json") and first.startswith("file://")
    assert StaticTable.from_metadata(first).scan().to_arrow().num_rows == 1
    assert main(["iceberg", made, "--as-of", "5"]) == 0
    assert "upper 10" in capsys.readouterr().out.splitlines()[1]
    assert main(["iceberg", "sync", made]) == 0
    assert "0 version(s) written" in capsys.readouterr().out


def test_register_in_a_sql_catalog(made: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path}/catalog.db"
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", db)
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", f"file://{tmp_path}/wh")
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())  # pyiceberg reads its config at import
    Shard.open(made).append(pa.table({"k": ["a", "b"], "v": [1, 2], "_time": [3, 4], "_diff": [1, 1]}),
                            lower=0, upper=10)
    assert main(["iceberg", "register", made, "--catalog", "lake", "--table", "ns.events"]) == 0
    cat = SqlCatalog("lake", uri=db, warehouse=f"file://{tmp_path}/wh")
    assert cat.load_table("ns.events").scan().to_arrow().num_rows == 2
    capsys.readouterr()
    # hostile: an existing table, a missing catalog, a malformed name: exit 2, nothing written
    assert main(["iceberg", "register", made, "--catalog", "lake", "--table", "ns.events"]) == 2
    assert "already has a table" in capsys.readouterr().err
    assert main(["iceberg", "register", made, "--catalog", "nowhere", "--table", "ns.other"]) == 2
    assert "cannot be loaded" in capsys.readouterr().err
    assert main(["iceberg", "register", made, "--catalog", "lake", "--table", "no-dots"]) == 2
    assert cat.list_tables("ns") == [("ns", "events")]


def test_a_shard_without_the_view_is_refused(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/plain"
    Shard.create(url, SCHEMA)
    for argv in (["iceberg", url], ["iceberg", "sync", url],
                 ["iceberg", "register", url, "--catalog", "x", "--table", "a.b"]):
        assert main(argv) == 2
        assert "iceberg enable" in capsys.readouterr().err
    assert Shard.open(url).reader().head().seqno == 0
