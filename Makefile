# Each target creates or reuses .venv/ and installs what it needs, so on a fresh machine any one of
# them alone does the whole set-up. pip (not uv/poetry) so torch comes from this machine's disk.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.mmlake-installed
# The editable install is setuptools' strict mode: a tree of links under build/ that maps the
# top-level folders to mmlake.<package> (mypy and IDEs follow it). A module added or removed changes
# its folder, and the tree is rebuilt.
EDITABLE := --config-settings editable_mode=strict
PACKAGE_DIRS := mmlake ingest preprocessing preprocessing/drift lineage cache flows flows/cli

.PHONY: demo test test-fast check bench install clean

install: $(STAMP)

$(STAMP): pyproject.toml $(PACKAGE_DIRS) ingest/_native.c
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]' $(EDITABLE)
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mmlake demo
	$(PY) -m examples.vlm_server

# The checks CI runs before the tests: ruff's linter and formatter, mypy over the installed library (from
# build/, so the repository's top-level folders do not shadow the mmlake package mypy follows).
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	cd build && ../$(VENV)/bin/mypy --config-file ../pyproject.toml -p mmlake

test: check
	$(PY) -m pytest

# The inner loop: everything but the tests that start the broker, Prefect, the S3 server or a server process.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not services"

BENCH_STAMP := $(VENV)/.mmlake-bench-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[dev,bench]' $(EDITABLE)
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) build lake .mmlake-demo bench/results/*.json
