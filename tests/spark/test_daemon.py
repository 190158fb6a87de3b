"""shardsink.spark.daemon: the worker daemon imports pyspark's installed copy (bytecode cached)
instead of Spark's ``pyspark.zip`` only when both are the same version."""

from __future__ import annotations

import zipfile
from pathlib import Path

from shardsink.spark.daemon import prefer_installed_pyspark


def _installed(root: Path, version: str) -> str:
    (root / "pyspark").mkdir(parents=True)
    (root / "pyspark" / "__init__.py").write_text("")
    (root / "pyspark" / "version.py").write_text(f"__version__: str = '{version}'\n")
    return str(root)


def _zip(root: Path, version: str) -> str:
    path = root / "lib" / "pyspark.zip"
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pyspark/__init__.py", "")
        z.writestr("pyspark/version.py", f'__version__ = "{version}"\n')
    return str(path)


def test_the_zip_is_dropped_for_an_installed_pyspark_of_its_version(tmp_path: Path) -> None:
    zipped, site = _zip(tmp_path / "spark", "4.2.0"), _installed(tmp_path / "site", "4.2.0")
    assert prefer_installed_pyspark([zipped, "/elsewhere", site]) == ["/elsewhere", site]


def test_the_zip_stays_for_another_version_or_no_installed_pyspark(tmp_path: Path) -> None:
    zipped, site = _zip(tmp_path / "spark", "4.2.0"), _installed(tmp_path / "site", "4.1.1")
    assert prefer_installed_pyspark([zipped, site]) == [zipped, site]
    assert prefer_installed_pyspark([zipped, str(tmp_path / "empty")]) == [zipped, str(tmp_path / "empty")]
    assert prefer_installed_pyspark([site]) == [site]


def test_an_unreadable_zip_leaves_the_path_alone(tmp_path: Path) -> None:
    bad = tmp_path / "pyspark.zip"
    bad.write_text("not a zip")
    site = _installed(tmp_path / "site", "4.2.0")
    assert prefer_installed_pyspark([str(bad), site]) == [str(bad), site]
