# Quick start: `make demo` and `make test`. Both build the virtualenv from scratch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv test lint typecheck unit demo clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

demo: venv
	$(BIN)/python scripts/demo.py

clean:
	rm -rf $(VENV) demo-data .pytest_cache .mypy_cache .ruff_cache
