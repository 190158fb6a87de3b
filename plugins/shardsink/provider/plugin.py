"""The Airflow plugin: the Shards page (FastAPI sub-app + a nav entry) and the extra link.

Loaded through the ``airflow.plugins`` entry point (and provider info ``plugins:``), so
``pip install shardsink[airflow]`` is all a deployment needs.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from shardsink.provider.api import URL_PREFIX, create_app
from shardsink.provider.links import ShardPageLink, page_path


class ShardsinkPlugin(AirflowPlugin):
    name = "shardsink"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "shardsink"}]  # noqa: RUF012
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
