"""Ship the library to Spark executors: a ``--py-files`` zip of the ``shardsink`` package.

The zip is built from the package actually imported (so it always matches the driver),
named by a hash of its contents and cached, so repeated jobs reuse one file. Executors
still need pyarrow and boto3 installed (Spark's Arrow UDFs need pyarrow anyway).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

import shardsink


def _sources() -> list[tuple[str, bytes]]:
    pkg = Path(shardsink.__file__).resolve().parent
    out = []
    for path in sorted(pkg.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        out.append((f"shardsink/{path.relative_to(pkg).as_posix()}", path.read_bytes()))
    return out


def build_pyfiles_zip(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Path of a zip holding the shardsink package (built once per content hash)."""
    files = _sources()
    digest = hashlib.sha1()
    for name, data in files:
        digest.update(name.encode() + b"\0" + data + b"\0")
    folder = Path(cache_dir or Path(tempfile.gettempdir()) / "shardsink-pyfiles")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"shardsink-{digest.hexdigest()[:16]}.zip"
    if target.exists():
        return str(target)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            # Fixed timestamps: the same sources always give the same bytes.
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    tmp = folder / f".{target.name}.{os.getpid()}.tmp"
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, target)  # concurrent builders write identical bytes; last one wins
    return str(target)
