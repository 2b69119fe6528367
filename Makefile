# Every target creates/uses .venv itself: a fresh clone needs only python3.11 and make.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DURATION ?= 30

.PHONY: venv test lint typecheck pytest demo experiment experiment-quick bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(PY) -m pytest -q

test: lint typecheck pytest

demo: $(STAMP)
	$(PY) -m experiments.demo --duration $(DURATION)

experiment: $(STAMP)
	$(PY) -m experiments.run

experiment-quick: $(STAMP)
	$(PY) -m experiments.run --quick

bench: $(STAMP)
	$(PY) -m experiments.bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
