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

.PHONY: run test venv java lint bench clean

venv: $(STAMP)

$(STAMP):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required, found " + sys.version' 
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing pinned requirements into $(VENV) (first time: about two minutes)"
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -r requirements.txt
	@$(PY) -m pip install -q --no-deps -e .
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

run: venv java
	@$(PY) -m shardsink.demo

test: venv java
	@$(PY) -m pytest -q tests

lint: venv
	@$(VENV)/bin/ruff check plugins tests bench dags spark_jobs
	@$(VENV)/bin/mypy

bench: venv java
	@for b in bench/*.py; do [ "$$b" = bench/summary.py ] && continue; echo "== $$b"; $(PY) $$b || exit 1; done
	@echo "== summary (bench/results/*.json)"; $(PY) bench/summary.py

clean:
	rm -rf .airflow .demo .pytest_cache
