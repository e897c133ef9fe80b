# FlowForge — `make run` (the main job), `make demo` (the same, to the end of one run),
# `make test` (the whole suite). Each installs what it needs.

SHELL := /bin/bash
PYTHON ?= $(shell scripts/find-python)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Tests get their own database (test_<name>), Redis db and broker namespace, so a
# running `make run` and the suite never consume each other's messages.
TEST_ENV := DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/flowforge_ci} \
	REDIS_URL=$${TEST_REDIS_URL:-redis://127.0.0.1:6379/15} \
	BROKER_URL=$${TEST_BROKER_URL:-$${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}} \
	BROKER_NAMESPACE=$${TEST_BROKER_NAMESPACE:-flowforge-test}

# The SDK's tests (sdk/python/tests) need neither Django nor services: their own pytest
# configuration (sdk/python/pyproject.toml) and the Django plugin off. `make sdk-test` runs only them.
SDK_TEST := $(VENV)/bin/pytest -p no:django -p no:cacheprovider -c sdk/python/pyproject.toml --timeout 120 sdk/python/tests

.PHONY: help install sdk-test services migrate bootstrap run demo test lint check-migrations clean browser browser-large faults fuzz bench soak fairness

help:
	@echo "make run    set up, start web + 2 workers + clock, start the example run, serve until Ctrl-C"
	@echo "make demo   set up, run the example to its end with real workers, print a summary"
	@echo "make test   lint, import contracts, migration check and the whole test suite"
	@echo "make sdk-test   only the Python SDK's tests (sdk/python/tests: no database needed)"
	@echo "make browser-large   the browser tests at sizes that take minutes (the 5,000-task DAG)"
	@echo "make soak   1,000,000 tasks with a retention of a minute, then a purge of 1,000,000 old runs (SOAK_TASKS, SOAK_PURGE_RUNS)"

# The project and, in the same .venv, the Python SDK (sdk/python, a package of its own,
# editable): its worker runs the SDK's examples and `make test` runs its tests.
$(STAMP): pyproject.toml sdk/python/pyproject.toml
	@test -n "$(PYTHON)" || { echo "no Python >= 3.12 found (see above)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet -e sdk/python
	@touch $(STAMP)

# The browser's DAG drawing (frontend/graph/graph.js with ELK from npm) bundled by esbuild
# into frontend/static/frontend/dist/ (not committed): `npm ci` when package-lock.json
# changed, the build when a source did. Node.js and npm are Debian's (or the machine's).
NPM_STAMP := node_modules/.installed
GRAPH_BUNDLE := frontend/static/frontend/dist/graph.js

$(NPM_STAMP): package.json package-lock.json
	@command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's nodejs and npm for the front-end build"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm) >/dev/null; \
	  else \
	    echo "the front-end build needs Node.js and npm: sudo apt-get install nodejs npm"; exit 1; \
	  fi; }
	npm ci --no-audit --no-fund --loglevel=error
	@touch $(NPM_STAMP)

$(GRAPH_BUNDLE): $(NPM_STAMP) frontend/graph/graph.js
	npm run --silent build

install: $(STAMP) $(GRAPH_BUNDLE)

services: install
	@$(PY) -m flowforge.services_check --create-database

migrate: services
	$(PY) manage.py migrate --noinput

bootstrap: migrate
	$(PY) manage.py bootstrap_demo

run: bootstrap
	$(PY) -m flowforge.devstack run

demo: bootstrap
	$(PY) -m flowforge.devstack demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

check-migrations: install
	$(PY) manage.py makemigrations --check --dry-run

# Browser tests drive Debian's Chromium (never a downloaded browser).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's chromium for the browser tests"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core) >/dev/null; \
	  else \
	    echo "browser tests need Debian's chromium: sudo apt-get install chromium"; exit 1; \
	  fi; }

test: install browser
	@$(TEST_ENV) $(PY) -m flowforge.services_check --server-only
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(TEST_ENV) $(PY) manage.py makemigrations --check --dry-run
	$(SDK_TEST)
	PYTEST=$(VENV)/bin/pytest scripts/run-suite

sdk-test: install
	$(SDK_TEST)

# Benchmarks: the engine against raw Dramatiq and the database, in one run (own database,
# Redis db and workers); prints a table and writes bench/results.json.
bench: install
	@$(PY) -m flowforge.services_check --server-only
	$(PY) -m bench.run

# The soak (issue 21): SOAK_TASKS no-op tasks (1,000,000) through workers and clock with a retention
# of a minute, sizes and hot queries after the first 100,000 and at the end, then a purge of
# SOAK_PURGE_RUNS (1,000,000) old runs beside live traffic; own database ff_soak, Redis db 9.
# Prints a table, writes bench/soak_results.json, fails when a target is missed.
soak: install
	@$(PY) -m flowforge.services_check --server-only
	$(PY) -m bench.soak --tasks $${SOAK_TASKS:-1000000} --purge-runs $${SOAK_PURGE_RUNS:-1000000}

# The fairness scenario of tests/integration/test_scheduling.py at the issue's size: A starts
# 2,000 tasks of 50 ms (make test runs it with 400), B one; prints the figures.
fairness: install
	@$(TEST_ENV) $(PY) -m flowforge.services_check --server-only
	$(TEST_ENV) FF_FAIRNESS_TASKS=$${FAIRNESS_TASKS:-2000} $(VENV)/bin/pytest -s \
		tests/integration/test_scheduling.py::test_one_organizations_burst_does_not_starve_another_and_costs_no_throughput

# The browser tests at sizes that take minutes (the 5,000-task DAG's pages): not in `make test`.
browser-large: install browser
	@$(TEST_ENV) $(PY) -m flowforge.services_check --server-only
	$(TEST_ENV) $(VENV)/bin/pytest -m large tests/e2e

# Fault injection, every scenario with a bigger load (make test runs a subset of three, 200 runs each).
faults: install
	$(PY) -m tests.faults.run --runs $${FAULT_RUNS:-500}

# The API fuzzed harder than make test does (30 examples per operation and phase there).
fuzz: install
	@$(TEST_ENV) $(PY) -m flowforge.services_check --server-only
	$(TEST_ENV) SCHEMATHESIS_EXAMPLES=$${SCHEMATHESIS_EXAMPLES:-300} $(VENV)/bin/pytest -s \
		tests/integration/test_schemathesis.py

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache *.egg-info node_modules frontend/static/frontend/dist
