"""An independent model of a shard whose schema evolves (issue 19), for the property tests
(tests/maintenance/test_property_schema.py, tests/read/test_engines_schema_property.py).

:class:`SchemaModel` keeps every update as ``field id → value`` and its own schema history
(field ids, names and type aliases, with the upper at which each change took effect); it
never consults the library's reads. A snapshot at ``t`` sums ``_diff`` over ``_time <= t``;
a change feed ``[lo, hi)`` sums per ``(row, max(_time, since))``; both project each update
onto a list of fields by field id (a column an update predates reads as null).

The ``draw_*`` methods generate steps from a hypothesis ``data`` object without changing the
model: an append (inserts, and retractions of rows alive in the current schema) and a schema
change (add a nullable column, drop, rename, widen int32 → int64 or string → large_string).
The caller applies the step to the shard, then records it (:meth:`appended`, :meth:`evolved`).
New names are ``c<n>`` (add) and ``r<n>`` (rename), or drawn from ``spellings`` (hostile names:
patterns, dots, spaces, other cases); a drawn name equal ignoring case to another current
column is one the shard must refuse (:meth:`twin`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from shardsink.core.schema import SchemaChange

TYPES = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(), "large_string": pa.large_string()}
Field = tuple[int, str, str]  # (field id, name, type alias)
Update = tuple[dict[int, Any], int, int]  # (values by field id, time, diff)
KINDS = ("add", "drop", "rename", "widen")
#: The schema a modelled shard is created with (field ids 1 and 2).
CREATE_SCHEMA = pa.schema([("a", pa.int32()), ("b", pa.string())])
WIDER = {"int32": "int64", "string": "large_string"}


def _initial_history() -> list[tuple[int, list[Field]]]:
    return [(-1, [(1, "a", "int32"), (2, "b", "string")])]


@dataclass
class SchemaModel:
    """The updates and schema history of one shard created with :data:`CREATE_SCHEMA`.

    ``history``: ``(upper at the change, fields)``, the first entry the create's;
    ``evolutions``: ``(upper, kind)`` of each schema change; ``log``: a readable line per
    recorded step (to report a failing history);
    ``int_values`` / ``int64_values``: what an int32 / int64 column's inserts draw from;
    ``spellings``: the names adds and renames draw from (empty: ``c<n>`` and ``r<n>``).
    """

    int_values: tuple[int | None, ...] = (0, 1, 2)
    int64_values: tuple[int | None, ...] = (0, 1, 2)
    spellings: tuple[str, ...] = ()
    history: list[tuple[int, list[Field]]] = field(default_factory=_initial_history)
    updates: list[Update] = field(default_factory=list)
    evolutions: list[tuple[int, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    upper: int = 0
    since: int = 0
    next_id: int = 3
    names: int = 0

    @property
    def fields(self) -> list[Field]:
        """The current schema."""
        return self.history[-1][1]

    def schema_at(self, t: int) -> list[Field]:
        """The schema current at time ``t`` (a change at upper ``u`` applies from ``u`` on)."""
        out = self.history[0][1]
        for upper, fields in self.history[1:]:
            if upper > t:
                break
            out = fields
        return out

    def change_uppers(self, kind: str | None = None) -> list[int]:
        """The upper of each schema change (of ``kind``, if given), in commit order."""
        return [u for u, k in self.evolutions if kind is None or k == kind]

    @staticmethod
    def key(values: dict[int, Any], fields: list[Field]) -> tuple[Any, ...]:
        return tuple(values.get(fid) for fid, _, _ in fields)

    def snapshot(self, t: int, fields: list[Field]) -> Counter[tuple[Any, ...]]:
        """Multiplicity per row (projected onto ``fields``) of the updates with time <= ``t``."""
        c: Counter[tuple[Any, ...]] = Counter()
        for values, ut, d in self.updates:
            if ut <= t:
                c[self.key(values, fields)] += d
        return Counter({k: v for k, v in c.items() if v})

    def changes(self, lo: int, hi: int, fields: list[Field]) -> Counter[tuple[Any, ...]]:
        """``_diff`` per ``(*row, time)`` of the updates whose time advanced by since is in ``[lo, hi)``."""
        c: Counter[tuple[Any, ...]] = Counter()
        for values, ut, d in self.updates:
            t = max(ut, self.since)
            if lo <= t < hi:
                c[(*self.key(values, fields), t)] += d
        return Counter({k: v for k, v in c.items() if v})

    def table(self, rows: list[Update]) -> pa.Table:
        """``rows`` as an append of the current schema (user columns + ``_time`` + ``_diff``)."""
        cols = {name: pa.array([r[0][fid] for r in rows], TYPES[ty]) for fid, name, ty in self.fields}
        return pa.table({**cols, "_time": pa.array([r[1] for r in rows], pa.int64()),
                         "_diff": pa.array([r[2] for r in rows], pa.int64())})

    # --- drawing steps (the model is unchanged until the step is recorded) ---------------

    def _value(self, data: st.DataObject, type_: str) -> Any:
        if type_.endswith("string"):
            return data.draw(st.sampled_from(["x", "y", None]))
        return data.draw(st.sampled_from(self.int64_values if type_ == "int64" else self.int_values))

    def draw_append(self, data: st.DataObject, span: int) -> list[Update]:
        """Up to 3 updates with times in ``[upper, upper + span)``: each a retraction of a row
        alive at ``upper`` (each alive row at most once) or an insert of random values."""
        rows: list[Update] = []
        alive = [k for k, n in self.snapshot(self.upper, self.fields).items() if n > 0]
        for _ in range(data.draw(st.integers(0, 3))):
            t = data.draw(st.integers(self.upper, self.upper + span - 1))
            if len(alive) > 0 and data.draw(st.booleans()):
                key = alive.pop(data.draw(st.integers(0, len(alive) - 1)))
                rows.append(({fid: v for (fid, _, _), v in zip(self.fields, key, strict=True)}, t, -1))
            else:
                rows.append(({fid: self._value(data, ty) for fid, _, ty in self.fields}, t, 1))
        return rows

    def appended(self, rows: list[Update], span: int) -> None:
        """Record an append of ``rows`` as the batch ``[upper, upper + span)``."""
        shown = [(self.key(v, self.fields), t, d) for v, t, d in rows]
        self.log.append(f"append [{self.upper}, {self.upper + span}): {shown}")
        self.updates.extend(rows)
        self.upper += span

    def draw_change(self, data: st.DataObject, kind: str) -> tuple[SchemaChange, list[Field]] | None:
        """A schema change of ``kind`` on a drawn column and the fields after it; None when the
        change does not apply (dropping the last column, widening a column already wide)."""
        fields = list(self.fields)
        i = data.draw(st.integers(0, len(fields) - 1))
        fid, name, ty = fields[i]
        if kind == "add":
            ty = data.draw(st.sampled_from(["int64", "string"]))
            new = self._new_name(data, "c")
            fields.append((self.next_id, new, ty))
            return SchemaChange(kind="add", name=new, type=ty), fields
        if kind == "drop":
            if len(fields) == 1:
                return None
            del fields[i]
            return SchemaChange(kind="drop", name=name), fields
        if kind == "rename":
            new = self._new_name(data, "r")
            fields[i] = (fid, new, ty)
            return SchemaChange(kind="rename", name=name, new_name=new), fields
        wider = WIDER.get(ty)
        if wider is None:
            return None
        fields[i] = (fid, name, wider)
        return SchemaChange(kind="widen", name=name, type=wider), fields

    def _new_name(self, data: st.DataObject, prefix: str) -> str:
        """A name no current column has exactly: drawn from ``spellings``, else ``<prefix><n>``."""
        taken = {n for _, n, _ in self.fields}
        pool = [n for n in self.spellings if n not in taken]
        return data.draw(st.sampled_from(pool), label="name") if pool else f"{prefix}{self.names + 1}"

    def twin(self, change: SchemaChange) -> str | None:
        """The current column whose name equals ``change``'s new name ignoring case (the shard
        refuses the change), the renamed column itself aside; None if there is none."""
        new = change.name if change.kind == "add" else change.new_name if change.kind == "rename" else None
        if new is None:
            return None
        return next((n for _, n, _ in self.fields
                     if n.casefold() == new.casefold() and not (change.kind == "rename" and n == change.name)), None)

    def evolved(self, change: SchemaChange, fields: list[Field]) -> None:
        """Record ``change`` (drawn by :meth:`draw_change`) as committed at the current upper."""
        if change.kind in ("add", "rename"):
            self.names += 1
        if change.kind == "add":
            self.next_id += 1
        self.log.append(f"evolve @{self.upper}: {change.describe()}")
        self.evolutions.append((self.upper, change.kind))
        self.history.append((self.upper, fields))

    def advanced(self, since: int) -> None:
        """Record a since advance (to ``since``, as the library reported it)."""
        self.log.append(f"since {since}")
        self.since = max(self.since, since)
