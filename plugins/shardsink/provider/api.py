"""The Shards page's FastAPI app, mounted by the api-server under :data:`shardsink.provider.links.URL_PREFIX`.

Routes (all GET)::

    /shardsink/ui/                        the page (list; ``?shard=<id>`` shows one shard)
    /shardsink/ui/shards.js               its script
    /shardsink/api/shards                 the list: every shard the DAGs declare or the config names
    /shardsink/api/shards/{id}            one shard: summary, commits, schema history, leases, objects by class
    /shardsink/api/shards/{id}/schema     its schema history (as ``shardsink schema URL --json``)
    /shardsink/api/shards/{id}/snapshot   the first rows as of ``?as_of=<ms>`` (default upper - 1)

Access control: Airflow does NOT protect plugin routes, so every route here depends on
Airflow's own ``requires_access_asset("GET")`` (:mod:`airflow.api_fastapi.core_api.security`):
the caller must present Airflow's JWT (``Authorization: Bearer`` or the UI's ``_token``
cookie), else 401 (no/expired token) or 403 (invalid token, or the auth manager denies
reading assets: shards are assets). Shards are addressed by id, never by URL: only the
listed shards can be read, so the API cannot be used to probe arbitrary paths or
buckets. Responses carry shard URLs (bucket/prefix or folder), never credentials.
"""

from __future__ import annotations

import importlib.resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

from shardsink.errors import InvalidUsageError, ReadFrontierError, ShardNotFoundError, ShardsinkError
from shardsink.provider import discovery, inventory


def _access() -> Any:
    from airflow.api_fastapi.core_api.security import requires_access_asset

    return Depends(requires_access_asset("GET"))


def _known() -> dict[str, tuple[str, bool]]:
    """id → (url, configured); configured URLs first (they are listed even if missing)."""
    out: dict[str, tuple[str, bool]] = {}
    for url in discovery.configured_urls():
        out.setdefault(inventory.shard_id(url), (url, True))
    for url in discovery.asset_urls():
        out.setdefault(inventory.shard_id(url), (url, False))
    return out


def _url(shard: str) -> str:
    known = _known()
    if shard not in known:
        raise HTTPException(404, f"no listed shard has id {shard!r}")
    return known[shard][0]


def _error(url: str, e: ShardsinkError) -> dict[str, Any]:
    return {"id": inventory.shard_id(url), "url": url, "exists": True, "error": f"{type(e).__name__}: {e}"}


def _static(name: str) -> str:
    return importlib.resources.files("shardsink.provider").joinpath("static", name).read_text()


def create_app() -> FastAPI:
    """The sub-application (a fresh one per call; the plugin mounts one)."""
    app = FastAPI(title="shardsink", description="Shards of shardsink, for the Airflow UI",
                  dependencies=[_access()], docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/ui/", response_class=HTMLResponse)
    def page() -> HTMLResponse:
        return HTMLResponse(_static("index.html"), headers={"Cache-Control": "no-store"})

    @app.get("/ui/shards.js")
    def script() -> Response:
        return Response(_static("shards.js"), media_type="text/javascript", headers={"Cache-Control": "no-store"})

    @app.get("/api/shards")
    def shards(dag_id: str | None = None, run_id: str | None = None) -> dict[str, Any]:
        """Every listed shard; with ``dag_id`` and ``run_id``: only those this DAG run committed to,
        each with ``run_commits`` (looked up among the last 50 commits)."""
        grace = discovery.leak_grace_seconds()
        writer = f"{inventory.WRITER_PREFIX}{dag_id}/{run_id}" if dag_id and run_id else None
        rows: list[dict[str, Any]] = []
        for url, configured in _known().values():
            try:
                if writer is not None:
                    mine = inventory.commits_by(url, writer)
                    if mine:
                        rows.append({**inventory.summary(url, grace_s=grace), "run_commits": mine})
                    continue
                rows.append(inventory.summary(url, grace_s=grace))
            except ShardNotFoundError:
                if configured and writer is None:
                    rows.append(inventory.missing(url))
            except ShardsinkError as e:
                rows.append(_error(url, e))
        return {"shards": rows, "airflow_root": _root()}

    @app.get("/api/shards/{shard}")
    def shard(shard: str, limit: Annotated[int, Query(ge=1, le=5000)] = inventory.DEFAULT_HISTORY) -> dict[str, Any]:
        url = _url(shard)
        try:
            return {**inventory.detail(url, limit=limit, grace_s=discovery.leak_grace_seconds()),
                    "airflow_root": _root()}
        except ShardNotFoundError:
            return {**inventory.missing(url), "airflow_root": _root()}
        except ShardsinkError as e:
            raise HTTPException(500, f"{type(e).__name__}: {e}") from e

    @app.get("/api/shards/{shard}/schema")
    def schema(shard: str) -> dict[str, Any]:
        """Every schema of the shard, oldest first: id, fields with their ids and types, and the
        seqno, time and upper of the change that made it current."""
        url = _url(shard)
        try:
            return inventory.schema_history(url)
        except ShardNotFoundError as e:
            raise HTTPException(404, str(e)) from e
        except ShardsinkError as e:
            raise HTTPException(500, f"{type(e).__name__}: {e}") from e

    @app.get("/api/shards/{shard}/snapshot")
    def snapshot(shard: str, as_of: int | None = None,
                 rows: Annotated[int, Query(ge=1, le=inventory.PREVIEW_ROWS)] = inventory.PREVIEW_ROWS,
                 ) -> dict[str, Any]:
        url = _url(shard)
        try:
            return inventory.preview(url, as_of=as_of, rows=rows)
        except (ReadFrontierError, InvalidUsageError) as e:
            raise HTTPException(400, str(e)) from e
        except ShardNotFoundError as e:
            raise HTTPException(404, str(e)) from e
        except ShardsinkError as e:
            raise HTTPException(500, f"{type(e).__name__}: {e}") from e

    return app


def _root() -> str:
    """The Airflow UI's root path (``[api] base_url``'s path, ending in /): links to DAG runs use it."""
    from airflow.api_fastapi.app import API_ROOT_PATH

    return API_ROOT_PATH
