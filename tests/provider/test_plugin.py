"""The plugin (shardsink.provider.plugin): a process that loads the plugins, as every Airflow
task process does, does not build the Shards page's app; the API server's read of
``fastapi_apps`` does, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# As a task process loads them (airflow.sdk.execution_time.task_runner: listeners, then macros),
# then as the API server reads the apps; prints what was imported at each step.
PROBE = """
import json, sys
from airflow.sdk.listener import get_listener_manager
from airflow.sdk.plugins_manager import _get_plugins, integrate_macros_plugins
get_listener_manager()
integrate_macros_plugins()
loaded = [type(p).__name__ for p in _get_plugins()[0]]
heavy = [m for m in ("fastapi", "airflow.api_fastapi.core_api.security", "shardsink.provider.api") if m in sys.modules]
from shardsink.provider.plugin import ShardsinkPlugin
apps = ShardsinkPlugin.fastapi_apps
print(json.dumps({"loaded": loaded, "heavy_after_load": heavy, "prefixes": [a["url_prefix"] for a in apps],
                  "app": type(apps[0]["app"]).__name__, "same": ShardsinkPlugin().fastapi_apps is apps,
                  "api_after_read": "shardsink.provider.api" in sys.modules}))
"""


def test_loading_the_plugins_as_a_task_does_not_build_the_page_app_and_the_api_servers_read_builds_it_once(
        tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(tmp_path / "no-plugins"), "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert "ShardsinkPlugin" in seen["loaded"], seen
    assert seen["heavy_after_load"] == [], seen
    assert seen["prefixes"] == ["/shardsink"] and seen["app"] == "FastAPI", seen
    assert seen["same"] and seen["api_after_read"], seen
