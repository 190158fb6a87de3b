"""shardsink.airflow.celery_config: Airflow's Celery defaults plus a preload that a real Celery
worker's loader performs in the main process, before it forks its pool (the topology's workers
run with it: tests/topology)."""

from __future__ import annotations

import json
import subprocess
import sys

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

from shardsink.airflow.celery_config import CELERY_CONFIG, PRELOAD

_WORKER_INIT = '''
import json, sys
from celery import Celery
from shardsink.airflow.celery_config import CELERY_CONFIG, PRELOAD
app = Celery("airflow.providers.celery.executors.celery_executor", config_source=CELERY_CONFIG)
app.loader.init_worker()  # what celery.worker.WorkController.__init__ calls before the pool exists
print(json.dumps({"after": {m: m in sys.modules for m in PRELOAD}}))
'''


def test_the_config_is_airflows_default_plus_the_preload() -> None:
    assert {k: v for k, v in CELERY_CONFIG.items() if k != "imports"} == DEFAULT_CELERY_CONFIG
    assert CELERY_CONFIG["imports"] == PRELOAD
    assert "shardsink.airflow" in PRELOAD  # what every shardsink DAG file imports


def test_a_worker_loader_imports_every_preloaded_module_before_forking() -> None:
    r = subprocess.run([sys.executable, "-c", _WORKER_INIT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["after"] == {m: True for m in PRELOAD}, seen
