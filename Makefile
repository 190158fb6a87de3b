# The two commands of the README:
#   make run   - the example persistence job end to end on the embedded default
#   make test  - the whole test suite
# Both create .venv, install the pinned requirements and check Java; safe to re-run.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
REQ_HASH := $(shell cat requirements.txt pyproject.toml 2>/dev/null | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(REQ_HASH)

.PHONY: run ui dev-env test venv java chromium services jq lint bench clean

venv: $(STAMP)

$(STAMP):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required, found " + sys.version' 
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing pinned requirements into $(VENV) (first time: about two minutes)"
	@$(PY) -m pip install -q --upgrade pip
	@# No byte-compiling here: pip compiles every installed module one at a time (77 s in all
	@# here, 34 s without). Python compiles what it imports; `make test` compiles everything on
	@# both cores while it builds the JVM archives.
	@$(PY) -m pip install -q --no-compile -r requirements.txt
	@$(PY) -m pip install -q --no-compile --no-deps -e .
	@# The editable install leaves plugins/shardsink.egg-info on sys.path: a second copy of the
	@# entry points, and Airflow would load the shardsink plugin twice. The venv's dist-info is enough.
	@rm -rf plugins/*.egg-info
	@rm -f $(VENV)/.installed-* && touch $@

java:
	@if ! command -v java >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Java not found: installing openjdk-17-jre-headless (Spark needs a JVM)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	  else \
	    echo "ERROR: Java 17+ is required by Spark and was not found on PATH."; \
	    echo "Install it (Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless; macOS: brew install openjdk@17) and re-run."; \
	    exit 1; \
	  fi; \
	fi

# The browser test (tests/airflow/test_shards_page.py) drives Debian's headless Chromium.
chromium:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Chromium not found: installing chromium and chromium-driver (the Shards page browser test)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "ERROR: chromium and chromedriver are required by the browser test and were not found on PATH."; \
	    echo "Install them (Debian/Ubuntu: sudo apt-get install chromium chromium-driver) and re-run."; \
	    exit 1; \
	  fi; \
	fi

# The production-shape test (tests/topology) runs Airflow on Debian's PostgreSQL with Redis as the
# Celery broker; neither is started as a service: the test's fixture runs its own, in a temporary folder.
services:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ! command -v redis-server >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "PostgreSQL or Redis not found: installing postgresql and redis-server (the production-shape test)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql redis-server >/dev/null; \
	  else \
	    echo "ERROR: PostgreSQL (initdb) and redis-server are required by tests/topology and were not found."; \
	    echo "Install them (Debian/Ubuntu: sudo apt-get install postgresql redis-server) and re-run."; \
	    exit 1; \
	  fi; \
	fi

# The runbook test (tests/test_runbooks.py) runs the runbooks' commands as written; they use jq.
jq:
	@if ! command -v jq >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "jq not found: installing jq (the runbooks use it)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null; \
	  else \
	    echo "ERROR: jq is required by the runbooks (tests/test_runbooks.py) and was not found on PATH."; \
	    echo "Install it (Debian/Ubuntu: sudo apt-get install jq; macOS: brew install jq) and re-run."; \
	    exit 1; \
	  fi; \
	fi

run: venv java
	@PYTHONPATH=. $(PY) -m shardsink_dev.demo

# The demo stack: the Airflow home and DAG folder of `make run` (shardsink_dev/demo.py), the UI
# and your own DAGs (README, "Your own dataset"). DEV_HOME= / DEV_DAGS= choose others.
DEV_HOME ?= $(CURDIR)/.airflow
DEV_DAGS ?= $(CURDIR)/dags

# The demo stack's environment as `export` lines: eval "$$(make -s dev-env)". Without the Spark
# connection the Spark provider falls back to --master yarn.
dev-env:
	@echo "export AIRFLOW_HOME='$(DEV_HOME)'"
	@echo "export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN='sqlite:///$(DEV_HOME)/airflow.db'"
	@echo "export AIRFLOW__CORE__DAGS_FOLDER='$(DEV_DAGS)'"
	@echo "export AIRFLOW__CORE__LOAD_EXAMPLES=False"
	@echo "export AIRFLOW_CONN_SPARK_DEFAULT='{\"conn_type\":\"spark\",\"host\":\"local[2]\"}'"
	@echo "export PATH='$(CURDIR)/$(VENV)/bin':\"\$$PATH\""

# The Airflow UI on the demo's Airflow home (after `make run`): Browse → Shards. Every user
# is an admin (simple auth manager's all-admins mode): for a local demo only.
ui: venv
	@test -f $(DEV_HOME)/airflow.db || { echo "run 'make run' first (it creates the demo's Airflow home)"; exit 1; }
	@echo "Airflow UI: http://127.0.0.1:$${PORT:-8080}/plugin/shards  (Ctrl+C stops it)"
	@AIRFLOW_HOME=$(DEV_HOME) AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=sqlite:///$(DEV_HOME)/airflow.db \
	  AIRFLOW__CORE__DAGS_FOLDER=$(DEV_DAGS) AIRFLOW__CORE__LOAD_EXAMPLES=False \
	  AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True PYTHONWARNINGS=ignore \
	  $(VENV)/bin/airflow api-server --port $${PORT:-8080} --workers 1

# Three pytest processes side by side on two cores: the real-Airflow tests (tests/airflow)
# mostly wait (Airflow parses and schedules, spark-submit starts JVMs) while the rest mostly
# computes. The Airflow tests run as two groups balanced on measured durations. Group 1 is the
# production-topology tests (tests/topology: PostgreSQL, Redis, Celery workers, Spark
# standalone, moto, a 5-day backfill; they replace the SQLite real-scheduler backfill test)
# with the AWS-connection, reclock DAG and schema-evolution DAG tests (tests/reclock, Kafka broker
# and crash replays, moved to the rest on 11-25: the rest ended 2-3 min before group 1); group 2
# is the other DAG tests, whose `airflow dags test` runs go to a warm
# process per test (shardsink_dev/dagrunner.py). Fresh clone, 2026-11-25 09:55: the rest
# 20:37, group 1 19:51, group 2 20:22, 21:56 in all with the venv; 10:19: 21:44, 21:04, 21:25,
# 23:02 (before the Celery preload
# and the production shape's late view: 22:27, 23:46 and 24:53 on one code, 06:57-07:45).
# Their logs follow the first process's. First, the class-data archives of Spark's classes
# that every test JVM maps (shardsink_dev/jvm.py).
# The runbook and README tests (a warm Airflow CLI, doc blocks run as written) join group 1: on
# 2026-11-27 the rest ran 28:03 while group 1 ended at 23:19 (28:25 in all, 39.8 CPU-minutes).
# The rest is one process's wall more than CPU: 25:04 for 11 CPU-minutes on 2026-11-27 (its tests
# wait on moto, subprocesses and JVMs), the suite's long pole (group 1 ended at 21:01, group 2 at
# 22:02). Niced Airflow groups did not shorten it; two processes for the rest made all four slower
# (17 minutes in, the Spark half had done a fifth of its tests).
DOC_TESTS := tests/test_runbooks.py tests/test_readme.py
AIRFLOW_GROUP := tests/topology tests/airflow/test_aws_connection.py tests/airflow/test_reclock_dag.py \
	tests/airflow/test_evolving.py $(DOC_TESTS)
test: venv java chromium services jq
	@( $(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true ) & \
	$(PY) -m shardsink_dev.jvm; rc=$$?; wait; exit $$rc
	@rm -f .test-*.log .test-*.rc; \
	( $(PY) -m pytest -q -p no:cacheprovider $(AIRFLOW_GROUP) >.test-airflow-1.log 2>&1; \
	  echo $$? >.test-airflow-1.rc ) & \
	( $(PY) -m pytest -q -p no:cacheprovider tests/airflow $(addprefix --ignore=,$(AIRFLOW_GROUP)) \
	  >.test-airflow-2.log 2>&1; echo $$? >.test-airflow-2.rc ) & \
	$(PY) -m pytest -q -p no:cacheprovider tests --ignore=tests/airflow --ignore=tests/topology \
	  $(addprefix --ignore=,$(DOC_TESTS)); \
	rc=$$?; wait; \
	for g in 1 2; do echo "== tests/airflow, group $$g (ran alongside the above)"; cat .test-airflow-$$g.log; done; \
	a1=$$(cat .test-airflow-1.rc); a2=$$(cat .test-airflow-2.rc); \
	echo "== make test: exit codes: the rest $$rc, tests/airflow group 1 $$a1, group 2 $$a2"; \
	[ "$$rc" -eq 0 ] && [ "$$a1" -eq 0 ] && [ "$$a2" -eq 0 ]

lint: venv
	@$(VENV)/bin/ruff check plugins tests bench dags spark_jobs shardsink_dev
	@$(VENV)/bin/mypy

bench: venv java
	@for b in bench/[!_]*.py; do case "$$b" in bench/summary.py|bench/proc_cpu.py) continue;; esac; echo "== $$b"; $(PY) $$b || exit 1; done
	@echo "== summary (bench/results/*.json)"; $(PY) bench/summary.py

clean:
	rm -rf .airflow .demo .pytest_cache
