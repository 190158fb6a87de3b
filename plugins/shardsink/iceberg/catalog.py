"""Registering a shard's view in an Iceberg catalog (pyiceberg's catalog configuration).

The catalog is named as pyiceberg names it (``~/.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__…``
variables); registering points a catalog table at the view's current metadata file
(``register_table``). The catalog's table does not follow later commits on its own: catalogs that
track a metadata location need ``register`` again (or their own refresh) to see newer snapshots.
"""

from __future__ import annotations

import contextlib
import re

from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError
from shardsink.iceberg.keeper import current_location

_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def register(shard: Shard, *, catalog: str, table: str) -> str:
    """Register the view as ``table`` (``namespace.name``) in pyiceberg catalog ``catalog``; returns
    the metadata location registered. InvalidUsageError (nothing written) for a malformed table name,
    a catalog pyiceberg cannot load, an existing table, or a shard without the view."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError

    if not isinstance(table, str) or not _TABLE.fullmatch(table):
        raise InvalidUsageError(f"table {table!r:.200} must be namespace.name (letters, digits, _)", value=str(table))
    location = current_location(shard)
    try:
        cat = load_catalog(catalog)
    except Exception as e:  # pyiceberg raises ValueError, KeyError, NotInstalledError, ...
        raise InvalidUsageError(f"catalog {catalog!r} cannot be loaded from pyiceberg's configuration "
                                f"({type(e).__name__}: {e})", value=catalog) from e
    namespace = table.rsplit(".", 1)[0]
    if cat.table_exists(table):
        raise InvalidUsageError(f"catalog {catalog!r} already has a table {table!r}; nothing registered",
                                value=table)
    with contextlib.suppress(NamespaceAlreadyExistsError):
        cat.create_namespace(namespace)
    try:
        cat.register_table(table, location)
    except TableAlreadyExistsError as e:
        raise InvalidUsageError(f"catalog {catalog!r} already has a table {table!r}; nothing registered",
                                value=table) from e
    return location
