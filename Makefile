# Each target creates or reuses .venv/ and installs what it needs, so on a fresh machine any one of
# them alone does the whole set-up. pip (not uv/poetry) so torch comes from this machine's disk.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.mmlake-installed

.PHONY: demo test bench install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mmlake demo

test: $(STAMP)
	$(PY) -m pytest

BENCH_STAMP := $(VENV)/.mmlake-bench-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) lake .mmlake-demo bench/results/*.json
