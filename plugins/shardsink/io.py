"""Reading and writing update files (Parquet, CSV, JSON Lines) for the CLI and sources."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shardsink.errors import InvalidUsageError

Format = Literal["jsonl", "csv", "parquet"]
_SUFFIXES: dict[str, Format] = {
    ".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
}


def format_of(path: str | Path) -> Format:
    fmt = _SUFFIXES.get(Path(path).suffix.lower())
    if fmt is None:
        raise InvalidUsageError(f"cannot tell the format of {str(path)!r}; expected a .parquet, .csv or .jsonl file")
    return fmt


def read_file(path: str | Path, *, types: pa.Schema | None = None) -> pa.Table:
    """Read a Parquet, CSV or JSONL file; ``types`` pins the types of the columns it names.

    Columns of ``types`` that the file does not have stay absent (never null-filled). Only
    the types are pinned, not nullability: a null where ``types`` says not-null is read as
    a null, for the caller's validation to refuse naming the column and the count
    (:func:`shardsink.core.updates.validate_updates`), not as the reader's bare parse error.
    Unreadable or missing files raise InvalidUsageError naming the file.
    """
    if types is not None:
        types = pa.schema([f.with_nullable(True) for f in types])
    p = Path(path)
    fmt = format_of(p)
    if not p.is_file():
        raise InvalidUsageError(f"input file {str(p)!r} does not exist")
    try:
        if fmt == "parquet":
            return pq.read_table(p)
        if fmt == "csv":
            opts = pacsv.ConvertOptions(column_types={f.name: f.type for f in types} if types else None)
            return pacsv.read_csv(p, convert_options=opts)
        parse = pajson.ParseOptions(explicit_schema=types, unexpected_field_behavior="infer") if types else None
        table = pajson.read_json(p, parse_options=parse)
        # SUBTLE: an explicit schema adds its fields as all-null columns when no line has
        # them; a column the file lacks must stay absent (``_diff`` then defaults to 1).
        n = table.num_rows
        suspects = [c for c in (types.names if types else []) if n and table.column(c).null_count == n]
        if suspects:
            present = set(pajson.read_json(p).column_names)
            table = table.drop_columns([c for c in suspects if c not in present])
        return table
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as e:
        raise InvalidUsageError(f"cannot read {str(p)!r} as {fmt}: {e}") from e


def write_table(table: pa.Table, *, fmt: Format, output: str | None) -> None:
    """Write to ``output`` or stdout. JSONL writes one JSON object per row.

    An ``output`` that cannot be written (missing folder, no permission) raises
    InvalidUsageError naming it.
    """
    try:
        _write_table(table, fmt=fmt, output=output)
    except OSError as e:
        if output is None:
            raise  # stdout: the CLI handles a closed pipe
        raise InvalidUsageError(f"cannot write {output!r}: {e}") from e


def _write_table(table: pa.Table, *, fmt: Format, output: str | None) -> None:
    binary = {"parquet": pq.write_table, "csv": pacsv.write_csv}.get(fmt)
    if binary is not None:
        if output is None:
            sink = pa.BufferOutputStream()
            binary(table, sink)
            sys.stdout.buffer.write(sink.getvalue().to_pybytes())
        else:
            binary(table, output)
        return
    lines = "".join(json.dumps(r, default=str) + "\n" for r in table.to_pylist())
    if output is None:
        sys.stdout.write(lines)
    else:
        Path(output).write_text(lines)
