"""docs/reference/configuration.md: every flag and its OUTBOX_* variable (from the
parsers), the variables that are not flags (the *_ENV constants of the code), and the
PostgreSQL URI parameters of the project's own (pg_tx.settings)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from types import ModuleType
from typing import Final

from docsgen.cli_model import MACHINE_DEFAULTS, Option, Program, programs
from docsgen.markdown import GENERATED_NOTE, code, page, table, text
from pg_tx import settings as pg_settings
from pg_tx.names import SCHEMA_RULE

# The packages whose modules may name an environment variable (a constant *_ENV).
PACKAGES: Final = ("plumbing", "shared", "publisher", "sink", "pg_tx", "sqlite_tx")

# What each variable that is not a flag holds (a test checks that every *_ENV
# constant of the code is here, and nothing else).
TOKEN_VARIABLES: Final[dict[str, str]] = {
    "OUTBOX_TOKEN": "The bearer token shared by the relay and the sink: `outbox-sink` requires"
    " it on every route but `/healthz`, `/readyz` and `/metrics`; `outbox-publisher"
    " dispatch`, `serve` and `trace` send it. Read when `--token-file` is not given.",
    "OUTBOX_INTAKE_TOKEN": "The bearer token `outbox-publisher serve` requires on its intake"
    " routes (`POST /orders`, `/orders/batch`, `/events`, `/events/batch`). Read when"
    " `--intake-token-file` is not given.",
    "OUTBOX_CONSOLE_TOKEN": "The operator token that signs in to the console of"
    " `outbox-publisher serve`; without one the console is read-only. Read when"
    " `--console-token-file` is not given.",
}

OTHER_VARIABLES: Final = """
Other variables the programs read:

- `PGPASSWORD`, `PGPASSFILE` (default `~/.pgpass`) and libpq's other variables: read by
  libpq itself for a PostgreSQL `--db`. Give the password this way, never in the URI,
  where the process list shows it to every user of the machine.
- `USER`: the default of `--by` (who an operator's `quarantine` or `redrive` is
  recorded as), or `operator` when it is unset or not a name a record may carry.

The relay ignores the proxy variables (`HTTP_PROXY` and the like): it sends only to
the sink URLs it was given.
"""

INTRO: Final = """
# Configuration

Both programs take their settings from flags, from `OUTBOX_*` environment variables
(one per flag, named after it), from the variables that hold tokens, and, for
PostgreSQL, from parameters of the `--db` URI. A flag on the command line wins over
its variable; a repeatable flag adds to the list its variable gives (comma-separated).
The general rules are in [the publisher's CLI reference](cli-publisher.md#general-rules).

A variable is read by every command that has the flag: `OUTBOX_LIMIT` is the batch
size of `dispatch` and `serve` (1 to 16) and the page size of `list` (1 to 1000), so
one set for `list` makes `dispatch` refuse to start. The two programs share names too
(`OUTBOX_DB`, `OUTBOX_PORT`, ...): set each program's variables in its own
environment, not in a shell that starts both.
"""


def render() -> str:
    publisher, sink = programs()
    return page(
        GENERATED_NOTE,
        INTRO,
        _program_section(publisher),
        _program_section(sink),
        _tokens(),
        OTHER_VARIABLES,
        _uri_parameters(),
    )


def _program_section(program: Program) -> str:
    """One row per variable: the flag, the commands that take it, their defaults."""
    by_env: dict[str, list[tuple[str, Option]]] = {}
    for command in program.commands:
        for option in command.options:
            if option.env:
                by_env.setdefault(option.env, []).append((command.subcommand or "", option))
    rows = []
    for env in sorted(by_env):
        uses = by_env[env]
        flags = sorted({code(option.flag) for _, option in uses})
        commands = ", ".join(code(name) for name, _ in uses if name) or ""
        by_default: dict[str, list[str]] = {}
        for name, option in uses:
            by_default.setdefault(_default(option), []).append(name)
        if len(by_default) == 1:
            default = next(iter(by_default))
        else:
            default = "; ".join(
                f"{shown} ({', '.join(code(n) for n in names)})"
                for shown, names in by_default.items()
            )
        rows.append([code(env), ", ".join(flags), commands, default])
    header = ["Variable", "Flag", "Commands", "Default"]
    if program.commands[0].subcommand is None:
        header.remove("Commands")
        rows = [[r[0], r[1], r[3]] for r in rows]
    anchor = program.script.removeprefix("outbox-")
    return (
        f"## {code(program.script)}\n\n"
        f"Every flag of [{code(program.script)}](cli-{anchor}.md) and the variable it reads.\n\n"
        + table(header, rows)
    )


def _default(option: Option) -> str:
    if option.required:
        return "required"
    if option.flag in MACHINE_DEFAULTS:
        return MACHINE_DEFAULTS[option.flag]
    if option.default is not None:
        return code(option.default)
    return "off" if option.metavar is None else "none"


def token_variables() -> dict[str, str]:
    """Every constant named *_ENV in the services' packages: variable -> constant."""
    found: dict[str, str] = {}
    for module in _modules():
        for name, value in vars(module).items():
            if name.endswith("_ENV") and isinstance(value, str):
                found.setdefault(value, f"{module.__name__}.{name}")  # where it is defined
    return found


def _modules() -> Iterator[ModuleType]:
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        yield package
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if not info.name.endswith(".__main__"):  # which would run the program
                yield importlib.import_module(info.name)


def _tokens() -> str:
    rows = [
        [code(env), text(TOKEN_VARIABLES.get(env, "")), code(constant)]
        for env, constant in sorted(token_variables().items())
    ]
    return (
        "## Tokens\n\nTokens are never flags (every user of a machine can read a process's"
        " arguments): each comes from a file named by a flag, or from its variable. A token"
        " is at least 16 characters with no white space or control character.\n\n"
        + table(["Variable", "What it holds", "Named in the code as"], rows)
    )


# The URI parameters the project adds (pg_tx.settings takes them out before libpq sees
# the URI); a test checks these names against the code's.
URI_PARAMETERS: Final[dict[str, tuple[str, str, str]]] = {
    "deadline": (
        f"{pg_settings.DEFAULT_DEADLINE_S:g}",
        f"seconds, a decimal number above 0 and at most {pg_settings.MAX_DEADLINE_S:g}",
        "Every database call (waiting for a pooled connection or opening one, and its"
        " whole use) ends within this. When it passes the connection is shut and"
        " discarded, the request gets `503` with a JSON body whose `reason` says the"
        " deadline passed, and one line is logged; `/readyz` answers `503` within the"
        " deadline. Not bounded: migrations and a handler registry's schema statements"
        " at start, `LISTEN`, and dedicated connections.",
    ),
    "pool_max": (
        str(pg_settings.DEFAULT_POOL_MAX),
        "an integer from 1 to 100",
        "The most connections one process opens.",
    ),
    "prepare": (
        "on",
        "`on` or `off`",
        "`off` turns server-side prepared statements off, for PgBouncer in transaction"
        " mode (which cannot keep one for a client); the relay then polls instead of"
        " listening for wake-ups.",
    ),
    "schema": (
        "none (the `search_path` finds the tables)",
        SCHEMA_RULE,
        "The schema the side's tables are in, created if missing; every statement names"
        " its tables in it, whatever the connection's `search_path`. `--schema NAME`"
        " says the same.",
    ),
}


def _uri_parameters() -> str:
    rows = [
        [code(f"{name}="), default, text(limits), text(meaning)]
        for name, (default, limits, meaning) in sorted(URI_PARAMETERS.items())
    ]
    return (
        "## PostgreSQL URI parameters\n\n"
        "A PostgreSQL `--db` is a libpq URI, `postgresql://USER@HOST:PORT/DATABASE?...`"
        " (or `postgres://`). The parameters below are the project's own: they are taken"
        " out before libpq sees the URI. Every other parameter is libpq's, checked by"
        " libpq's own parser when the program starts (a URI it refuses is a usage"
        " error, exit status 2, with nothing opened). Messages and logs show a URI with"
        " its password replaced by `***`.\n\n"
        + table(["Parameter", "Default", "Values", "What it does"], rows)
    )
