"""The Airflow plugin: the Shards page (FastAPI sub-app + a nav entry) and the extra link.

Loaded through the ``airflow.plugins`` entry point (and provider info ``plugins:``), so
``pip install shardsink[airflow]`` is all a deployment needs.

Every Airflow process loads the plugins (a task process does, for their macros and
listeners), but only the API server mounts ``fastapi_apps``. Building the page's app imports
Airflow's API security module, and with it the whole FastAPI app and the ORM models: about
2 CPU-seconds. So the app is built on the first read of ``fastapi_apps``, not at import
(:class:`_PageApp`), and a task process never pays for it.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from shardsink.provider.links import URL_PREFIX, ShardPageLink, page_path


class _PageApp:
    """``fastapi_apps`` as a class attribute whose value is built once, on its first read (the
    API server's, or ``airflow plugins``'), from :func:`shardsink.provider.api.create_app`."""

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None

    def __get__(self, instance: object, owner: type | None = None) -> list[dict[str, Any]]:
        if self._apps is None:
            from shardsink.provider.api import create_app

            self._apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "shardsink"}]
        return self._apps


class ShardsinkPlugin(AirflowPlugin):
    name = "shardsink"
    fastapi_apps = _PageApp()  # type: ignore[assignment]
    external_views = [  # noqa: RUF012
        # Browse → Shards: the page, inside the Airflow UI (an iframe at /plugin/shards).
        {"name": "Shards", "href": page_path(), "url_route": "shards", "destination": "nav",
         "category": "browse"},
        # A tab on every DAG run: the shards this run committed to, with links to their pages.
        {"name": "Shards", "href": page_path() + "?dag_id={DAG_ID}&run_id={RUN_ID}", "url_route": "shards_run",
         "destination": "dag_run"},
    ]
    global_operator_extra_links = []  # noqa: RUF012
    operator_extra_links = [ShardPageLink()]  # noqa: RUF012
