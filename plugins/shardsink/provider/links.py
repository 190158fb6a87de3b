"""Links into the Shards page: the operator extra link of shardsink tasks, and page addresses."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseOperatorLink

from shardsink.provider.inventory import shard_id

#: Where the API server mounts the Shards page's app (:mod:`shardsink.provider.api`).
URL_PREFIX = "/shardsink"


def airflow_root() -> str:
    """The path Airflow's UI and API are served under (``[api] base_url``), ending in ``/``."""
    from airflow.configuration import conf

    path = urlsplit(conf.get("api", "base_url", fallback="") or "").path
    return path if path.endswith("/") else path + "/"


def page_path(shard_url: str | None = None) -> str:
    """The Shards page (of one shard if ``shard_url`` is given), as a path on the Airflow host."""
    base = f"{airflow_root()}{URL_PREFIX.strip('/')}/ui/"
    return base if shard_url is None else f"{base}?shard={shard_id(shard_url)}"


class ShardPageLink(BaseOperatorLink):
    """"Shard page": from a task that writes a shard (``operator.shard_url``) to that shard's page.

    Computed on the worker when the task ends and kept in XCom (Airflow 3's extra links),
    so the api-server needs no access to the DAG file.
    """

    name = "Shard page"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        url = getattr(operator, "shard_url", None)
        return page_path(url) if url else ""
