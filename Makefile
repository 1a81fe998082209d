# `make help` lists the targets. Every target installs what it needs into .venv first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Delta's jars for Spark, fetched once from Maven Central by `make install` (never at run time).
DELTA_JARS := $(VENV)/delta-jars
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export ROLLUPS_WAREHOUSE ?= $(CURDIR)/warehouse
export DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS ?= 1
export DAGSTER_EVENT_BATCH_SIZE ?= 1000
SIZE ?= default
# uv installs .venv's packages: a fresh .venv in about a minute, where pip took three.
UV_VERSION := 0.13.9
# Test worker processes for `make test`, each with its own Spark session (0: run in this process).
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help install demo dev test test-fast lint fmt typecheck check-defs bench soak check-java clean

help: ## Show the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || \
		{ echo "error: Python 3.11 is required (found $$($(PYTHON) --version 2>&1))" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[dev]"
	@touch $@

# The jars pinned in rollup_assets/resources/delta_jars.py, checked against their pinned SHA-256.
$(DELTA_JARS)/.installed: $(VENV)/.installed rollup_assets/resources/delta_jars.py
	$(BIN)/python -m rollup_assets.resources.delta_jars $(DELTA_JARS)
	@touch $@

install: $(VENV)/.installed $(DELTA_JARS)/.installed ## Create .venv, install the project with its dev tools and Delta's jars

check-java:
	@command -v java >/dev/null 2>&1 || [ -x "$$JAVA_HOME/bin/java" ] || \
		{ echo "error: Java 17 is required for Spark, but no java is on PATH (install OpenJDK 17 or set JAVA_HOME)" >&2; exit 1; }

demo: install check-java ## Run the end-to-end demo on the embedded defaults (local Spark, ./warehouse)
	$(BIN)/rollups demo

dev: install check-java ## Start the Dagster UI + daemon (./.dagster_home) and a warm Spark server; Ctrl-C stops all
	$(BIN)/rollups dev

test: install check-java lint typecheck check-defs ## Run the whole suite (lint, types, unit, spark, integration, system)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --durations=30 --junitxml=test-artifacts/junit.xml

test-fast: install ## Unit tests only (no JVM)
	$(BIN)/pytest tests/unit

lint: install ## ruff format --check, ruff check, and the layer contract (lint-imports)
	$(BIN)/ruff format --check rollup_assets tests bench
	$(BIN)/ruff check rollup_assets tests bench
	$(BIN)/lint-imports

fmt: install ## Format the code
	$(BIN)/ruff format rollup_assets tests bench
	$(BIN)/ruff check --fix rollup_assets tests bench

typecheck: install ## mypy on the packages
	$(BIN)/mypy

check-defs: install ## dagster definitions validate, and dg check defs (the [tool.dg] project)
	DAGSTER_HOME= $(BIN)/dagster definitions validate -w workspace.yaml
	DAGSTER_HOME= VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/dg check defs

bench: install check-java ## Benchmarks (SIZE=small|default), writes bench/results.json and a plot
	$(BIN)/python -m bench --size $(SIZE)

soak: install check-java ## Long-running reliability variants
	$(BIN)/pytest -m soak -p no:cacheprovider tests

clean: ## Remove the venv, the local warehouse and the Dagster home
	rm -rf $(VENV) warehouse .dagster_home demo_output
