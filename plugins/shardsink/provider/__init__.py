"""shardsink as an Airflow provider: what ``airflow providers list`` and ``airflow plugins`` show.

Installed with ``pip install shardsink[airflow]``; Airflow finds it through two entry
points declared in pyproject.toml (no files copied into ``plugins/``):

* ``apache_airflow_provider`` → :func:`get_provider_info` (operators, the plugin, the
  Shards page's extra link, and the ``[shardsink]`` configuration section);
* ``airflow.plugins`` → :class:`shardsink.provider.plugin.ShardsinkPlugin` (the Shards
  page and its JSON API), as the openlineage provider does: Airflow loads plugins
  declared in provider info only when ``[core] lazy_discover_providers`` is False, the
  entry point always.

The providers manager imports this module in every Airflow process (``airflow.configuration``
reads provider info), and with it shardsink's core (pyarrow) and pandas, which this module
imports itself: the package imports neither, so that a process outside Airflow (a ``shardsink``
command, a Spark worker daemon's launcher) starts without them, but tasks use the core, and
pyarrow imports pandas to convert Python values, which most tasks do. That is kept on purpose:
the Celery and local executors fork each task from a worker process that already holds them,
and a forked task that imports them itself starts about 1 CPU-second dearer
(``bench/task_start.py``, "forked"). What no task needs stays out: the Shards page's FastAPI
app is built only when the API server reads it (:mod:`shardsink.provider.plugin`).
"""

from __future__ import annotations

from typing import Any

import pandas  # noqa: F401  (module docstring: tasks forked from Airflow processes find it imported)

import shardsink.core.shard  # noqa: F401  (module docstring: the same)

PACKAGE = "shardsink"
PLUGIN_CLASS = "shardsink.provider.plugin.ShardsinkPlugin"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:  # running from a source tree
        return "0.0.0"


def get_provider_info() -> dict[str, Any]:
    """The provider info dict (schema: airflow/provider_info.schema.json)."""
    return {
        "package-name": PACKAGE,
        "name": "shardsink",
        "description": "Exactly-once batch persistence into shards on S3 or a local folder: ingest and "
                       "self-correcting view DAGs, a Shards page in the Airflow UI, OpenLineage and metrics.",
        "versions": [_version()],
        "integrations": [{"integration-name": "shardsink", "tags": ["software"],
                          "external-doc-url": "https://example.invalid/shardsink"}],
        "operators": [{"integration-name": "shardsink",
                       "python-modules": ["shardsink.airflow.write_operator", "shardsink.airflow.view",
                                          "shardsink.provider.operators"]}],
        "extra-links": ["shardsink.provider.links.ShardPageLink"],
        "plugins": [{"name": "shardsink", "plugin-class": PLUGIN_CLASS}],
        "config": {
            "shardsink": {
                "description": "Settings of the shardsink provider (the Shards page in the Airflow UI).",
                "options": {
                    "shard_urls": {
                        "description": "Shard URLs the Shards page lists besides the shard assets of the DAGs "
                                       "(comma or newline separated; file:///abs/path or s3://bucket/prefix).",
                        "version_added": "0.1.0", "type": "string", "example": "s3://lake/shards/events",
                        "default": "",
                    },
                    "leak_grace_seconds": {
                        "description": "The GC grace period the Shards page classifies objects by: an "
                                       "unreferenced object younger than this is in flight, not leaked (its "
                                       "writer may still commit or delete it). Keep it the maintenance DAG's.",
                        "version_added": "0.1.0", "type": "float", "example": "3600", "default": "3600",
                    },
                },
            },
        },
    }
