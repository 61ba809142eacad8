# Quick start: `make demo` and `make test`. Both build the virtualenv from scratch.
# `make check` is the fast tier for iterating (no end-to-end tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --quiet --disable-pip-version-check

.PHONY: venv runtime test check lint typecheck demo chaos bench bench-quick clean postgres-binaries netns-tools
.PHONY: soak soak-workers demo-postgres browser screenshots promtool
.PHONY: docs docs-serve docs-reference

# One virtualenv in two steps. `runtime`: the package and its runtime dependencies
# (`pip install -e .`, which also installs the outbox-publisher and outbox-sink
# commands), all that the services, the chaos runner and so the demos need. `venv`:
# the test, lint and type-check tools on top (the `test` extra, hundreds of MB with
# the browser driver and the fuzzer) and the documentation site's (the `docs` extra:
# MkDocs, and the plugin that runs the docs' Python examples as tests), only for the
# targets that run them.
runtime: $(VENV)/.runtime
venv: $(VENV)/.installed

$(VENV)/.runtime: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	$(PIP) -e '.[test,docs]'
	touch $@

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

# Two test processes (pytest-xdist): the tests mostly wait on processes, sockets and
# fsync, and each process has its own throwaway PostgreSQL server. A process that runs
# out of tests takes some of the other's (worksteal): the end-to-end tests are few and
# long, and with a fixed share one process would run them all while the other idles.
PYTEST := $(BIN)/pytest -n 2 --dist worksteal

# Everything, as CI runs it. The suite includes tests/docs: the site builds with
# --strict (a broken link or anchor fails), every page is in its navigation, and each
# generated reference page is what `python -m docsgen` writes from the code now (the
# check of `python -m docsgen --check`). Then every Python block of the docs and the README
# runs as a test of its own (pytest-markdown-docs; a block tagged `python notest` is an
# illustration). That run is given the Markdown files alone: with --markdown-docs the
# plugin would also import every .py file it collects and run the blocks in docstrings.
test: lint typecheck postgres-binaries browser promtool
	$(PYTEST)
	$(PYTEST) --markdown-docs --ignore-glob='*.py' README.md docs

# The fast tier, for iterating: lint, types, and the unit, behaviour (both backends)
# and integration tests; no end-to-end test (they start real processes and a browser)
# and no documentation check (`make docs` builds the site alone).
check: lint typecheck postgres-binaries
	$(PYTEST) tests/unit tests/behaviour tests/integration

# The tests start throwaway PostgreSQL servers of their own: they need the server
# programs (initdb, pg_ctl), from Debian's package when they are missing. No cluster
# is created or started by the package; as root the tests run the server as the
# `postgres` user the package creates.
# $(call debian-package,CHECK,PACKAGE,WHEN MISSING[,FIRST]): nothing when the shell
# test CHECK passes; as root, Debian's PACKAGE is installed (after the commands FIRST,
# each ending in &&); otherwise the command WHEN MISSING runs.
define debian-package
	@if $(1); then \
		exit 0; \
	elif [ "$$(id -u)" = 0 ]; then \
		$(4) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(2) >/dev/null; \
	else \
		$(3); \
	fi
endef

postgres-binaries: netns-tools
	$(call debian-package,command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1,postgresql,\
		echo "PostgreSQL's server programs are missing: install Debian's postgresql package" >&2; exit 1,\
		mkdir -p /etc/postgresql-common && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf &&)

# The console's browser tests drive Debian's Chromium through Playwright (its own
# browser downloads are never used): the package is installed when it is missing.
browser:
	$(call debian-package,command -v chromium >/dev/null 2>&1,chromium,\
		echo "chromium is missing: install Debian's chromium package (the browser tests will be skipped)" >&2)

# The README's pictures of the console, taken by its browser test against real services.
screenshots: venv browser
	CONSOLE_SCREENSHOTS=docs/console $(BIN)/pytest -q tests/e2e/test_console_browser.py -k sqlite

# The monitoring guide's alert rules are loaded by `promtool check rules` in its test.
# Where promtool is on neither PATH nor under $(VENV)/promtool, it is taken from
# Debian's prometheus package: downloaded into a temporary directory, unpacked there
# with `dpkg -x` (nothing is installed, no service set up or started), and its promtool
# alone kept as $(VENV)/promtool/usr/bin/promtool; the temporary directory is removed.
# Without it, the test checks the rules against their JSON schema instead.
PROMTOOL := $(VENV)/promtool/usr/bin/promtool
promtool:
	@if command -v promtool >/dev/null 2>&1 || [ -x $(PROMTOOL) ]; then \
		exit 0; \
	fi; \
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	fetch() { (cd "$$tmp" && apt-get download -qq -o APT::Sandbox::User="$$(id -un)" prometheus) >/dev/null 2>&1; } && \
	{ fetch || { [ "$$(id -u)" = 0 ] && apt-get update -qq && fetch; }; } && \
	dpkg -x "$$tmp"/prometheus_*.deb "$$tmp/package" && \
	mkdir -p "$$tmp/promtool/usr/bin" $(VENV) && \
	mv "$$tmp/package/usr/bin/promtool" "$$tmp/promtool/usr/bin/" && \
	rm -rf $(VENV)/promtool && mv "$$tmp/promtool" $(VENV)/promtool || \
	echo "promtool is missing: install Debian's prometheus package (the alert rules are checked against their schema only)" >&2

# The documentation site (mkdocs.yml): built into site/ with --strict, as `make test`
# builds it; served on loopback while writing, rebuilt on each change.
docs: venv
	$(BIN)/mkdocs build --strict -d site

docs-serve: venv
	$(BIN)/mkdocs serve -a 127.0.0.1:8000

# Rewrites the generated reference pages (CLI, HTTP APIs, metrics, configuration) from
# the code; `make test` fails while one differs from what this would write.
docs-reference: venv
	$(BIN)/python -m docsgen

# The partition test makes test hosts in network namespaces with `ip` (iproute2).
netns-tools:
	$(call debian-package,command -v ip >/dev/null 2>&1,iproute2,\
		echo "iproute2 is missing: the partition test will be skipped" >&2)

# The two failures that matter most (the publisher killed right after an ACK, an ACK
# lost after the sink's commit) as stories, with the evidence table before and after.
demo: runtime
	$(BIN)/python -m chaos scenario crash-after-ack drop-after-commit

# The same on PostgreSQL: those two stories, then a short chaos run (kills of either
# service and two restarts of the server), each on a throwaway server of its own
# (initdb in a temp dir, loopback only, fsync on; removed at the end).
demo-postgres: runtime postgres-binaries
	$(BIN)/python -m chaos scenario crash-after-ack drop-after-commit --backend postgres
	$(BIN)/python -m chaos run --backend postgres --events 200 --kills 6 --pg-restarts 2 --seed 1

# A longer run: 500 events, orders and generic events mixed, 10 kills of either
# service at random moments.
chaos: runtime
	$(BIN)/python -m chaos run --events 500 --kills 10 --seed 1 --events-mix mixed

# Not part of `make test`: 1,000 kills over 5,000 events (orders and generic events
# mixed), in global order with batch delivery, then per key with single delivery.
# Each run stops at its time limit.
soak: runtime
	$(BIN)/python -m chaos run --events 5000 --kills 1000 --seed 1 --events-mix mixed --ordering global --delivery batch --time-limit 1800
	$(BIN)/python -m chaos run --events 5000 --kills 1000 --seed 2 --events-mix mixed --ordering key --delivery single --time-limit 1800

# Not part of `make test`: three relay workers and two sinks on a throwaway PostgreSQL
# server through 525 faults (kills, SIGSTOP/SIGCONT pauses, server restarts).
soak-workers: runtime postgres-binaries
	$(BIN)/python -m chaos run --backend postgres --workers 3 --sinks 2 --ordering sku --events 3000 --kills 180 --pauses 240 --pg-restarts 50 --seed 14

# Figures measured side by side in one run, printed as ratios; also bench/results.json.
bench: venv
	$(BIN)/python -m bench --out bench/results.json

bench-quick: venv
	$(BIN)/python -m bench --quick --out bench/results.json

clean:
	rm -rf $(VENV) demo-data site .pytest_cache .mypy_cache .ruff_cache
