# Quick start: `make demo` and `make test`. Both build the virtualenv from scratch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv test lint typecheck demo chaos bench bench-quick clean
.PHONY: soak

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

# SPEC's two checks as stories, with the evidence table before and after recovery.
demo: venv
	$(BIN)/python -m chaos scenario crash-after-ack drop-after-commit

# A longer run: 500 orders, 10 kills of either service at random moments.
chaos: venv
	$(BIN)/python -m chaos run --events 500 --kills 10 --seed 1

# Not part of `make test`: 1,000 kills over 5,000 orders, in global order with batch
# delivery, then per SKU with single delivery. Each run stops at its time limit.
soak: venv
	$(BIN)/python -m chaos run --events 5000 --kills 1000 --seed 1 --ordering global --delivery batch --time-limit 1800
	$(BIN)/python -m chaos run --events 5000 --kills 1000 --seed 2 --ordering sku --delivery single --time-limit 1800

# Figures measured side by side in one run, printed as ratios; also bench/results.json.
bench: venv
	$(BIN)/python -m bench --out bench/results.json

bench-quick: venv
	$(BIN)/python -m bench --quick --out bench/results.json

clean:
	rm -rf $(VENV) demo-data .pytest_cache .mypy_cache .ruff_cache
