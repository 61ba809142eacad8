"""docs/reference/cli-publisher.md and cli-sink.md: each subcommand and option from
the argument parsers, after the general rules written here by hand."""

from __future__ import annotations

import re
from typing import Final

from docsgen.cli_model import MACHINE_DEFAULTS, Command, Option, Program, synopsis
from docsgen.markdown import GENERATED_NOTE, code, page, slug, table, text
from plumbing.cli import CHAOS_EXIT_STATUS, EXIT_FAILED, EXIT_OK, EXIT_USAGE, TRUE_WORDS
from plumbing.net import MIN_TOKEN_CHARS
from publisher.store import MAX_ACCEPT
from shared import MAX_BODY_BYTES

_TRUE: Final = ", ".join(f"`{word}`" for word in sorted(TRUE_WORDS))

GENERAL: Final = f"""
## General rules

These hold for every command of both programs, `outbox-publisher` and `outbox-sink`.

**Names.** The package installs two console scripts, `outbox-publisher` and
`outbox-sink`. `python -m publisher` and `python -m sink` run the same programs, which
call themselves by the script names in `--help` and in error messages either way.

**Exit status.** `{EXIT_OK}` done; `{EXIT_FAILED}` failed (a delivery, a conflict, a
storage error, an unknown entry); `{EXIT_USAGE}` bad input or usage, with nothing
changed; `{CHAOS_EXIT_STATUS}` the process ended itself on purpose (a `--chaos` exit).

**Errors.** An error is one line on stderr, starting with the program's name (an
error in the options themselves ends with `(see --help)`). No command prints a
traceback for a mistake of its user. Text that comes from outside (a sink's reply, a
reason or a name kept in a record, an ID read from a database) is written with every
control or invisible character as a visible escape (`\\r`, `\\x1b`, `\\u202e`), in
answers, errors and logs alike.

**Values are checked before anything is opened.** Ports are 0 to 65535; integers are
plain ASCII digits (`1_000` and digits of other scripts are refused); seconds are
finite numbers above 0; `--retry-base` may not exceed `--retry-cap`. Each mistake is
a usage error (status `{EXIT_USAGE}`). Options cannot be abbreviated: `--token` is not
taken for `--token-file`.

**Environment variables.** Every option (a flag; not an argument such as an event
ID) can also be set by a variable named
`OUTBOX_` and the option's name in capitals with `-` as `_`: `--db` is `OUTBOX_DB`,
`--retry-cap` is `OUTBOX_RETRY_CAP`. `--help` names each option's variable and shows
its default. A value given on the command line wins over the variable; a variable
that is set but empty counts as unset; a required option is satisfied by its
variable. A switch (an option without a value) is on when its variable holds
{_TRUE} (in any case), off for any other value. A repeatable option takes a
comma-separated list from its variable, and the command line adds to that list. A
variable's value is checked like the option's: a bad one is a usage error under the
option's name (for an option with a fixed set of values, the message names the
variable too). The tokens are read from variables of their own, never from a flag: see
[Configuration](configuration.md).

**Databases.** `--db` says where the database is and which backend opens it: a file
path, `sqlite:PATH` or `sqlite:///ABSOLUTE/PATH` is a SQLite file, created with its
tables if missing, except by the publisher's commands that read or change an outbox
that is there (`dispatch`, `status`, `list`, `quarantine`, `redrive`, `trace`,
`prune`): they refuse a file that does not exist, in one line with status
`{EXIT_USAGE}`, rather than show a mistyped path as an empty outbox; a
`postgresql://` (or `postgres://`) URI is a PostgreSQL database, whose tables are
created or brought up to date when it is opened (by those same commands only brought
up to date: a database or schema without the outbox's tables is refused the same way,
and nothing is created in it). The password comes from
`PGPASSWORD` or a `.pgpass` file, never from the URI. A URI that libpq refuses,
or another scheme, is one line on stderr and status `{EXIT_USAGE}`, with nothing
created; a server that cannot be reached is one line and status `{EXIT_FAILED}`.
`--schema NAME`, on every command that takes `--db`, keeps that side's tables in the
PostgreSQL schema NAME, as `schema=NAME` in the URI does (a URI naming another schema
is refused); a SQLite file has no schemas, so there it is refused in one line. The
URI parameters of the project's own are listed in
[Configuration](configuration.md#postgresql-uri-parameters).

**Output and logs.** Results go to stdout, logs to stderr. `--log-format text` (the
default) writes one record per line, `TIME LEVEL LOGGER: message key=value ...`, the
time in ISO 8601 UTC with a `Z` to the millisecond (`2026-12-06T01:21:10.000Z`); a
traceback, when one is logged, follows on lines of its own, each indented by two
spaces. `--log-format json` writes one JSON object per line with `time` (Unix
seconds, a number), `level`, `logger`, `message`, the record's own fields and, with a
traceback, `exception`. Every time a command shows a person is ISO 8601 UTC with a
`Z`.

**Listening.** A service prints `<name> listening on http://HOST:PORT/PATH` on stdout
once it is bound; with `--port 0` the system picks a free port, and a script reads it
from that line. The `listening` log record names the event loop that runs
(`event_loop`), the connection cap and the timeouts.
"""

HTTP_SIDE: Final = f"""
## The HTTP side of a service

`outbox-sink` and `outbox-publisher serve` take the same options for their HTTP side.
The `Host` header is compared by name, with any port (so a port mapping or a tunnel
works): the service's own addresses and the loopback names are always answered, a
name added with `--allow-host-header NAME` (repeatable) too, and any other name gets
`421`. A request with an `Origin` header is refused (`403`) unless that exact origin
was given with `--allow-origin ORIGIN` (repeatable). `--idle-timeout` closes a
connection that sends nothing, headers included; `--body-timeout` answers `408` to a
body that does not arrive in time; `--max-connections` bounds open connections,
lowered to fit the open-file limit (the value used is in the `listening` log record):
at the cap the oldest idle connection is closed, and if every one is busy the new one
gets `503`.

`--event-loop` picks the loop the service runs on: `uvloop` by default wherever it can
be imported (a dependency on every platform but Windows), or `asyncio` for the
standard library's own, e.g. to rule the loop out while chasing a problem. Where
uvloop cannot be imported the default is `asyncio`, and asking for `uvloop` is a
usage error. The one-shot publisher commands (`accept`, `dispatch`, `status` and the
rest) always run on asyncio's own loop.

A service on an address other than loopback needs a bearer token, or `--insecure` to
say that it is meant to run without one. A token is at least {MIN_TOKEN_CHARS} characters,
without spaces, read from a file (`--...-token-file`) or from its variable, never
from the command line, where every user of the machine could read it.
"""

PUBLISHER_INTRO: Final = """
# `outbox-publisher`

The publisher's program: intake (`accept`), delivery (`dispatch`, `serve`) and the
operator's commands (`status`, `list`, `quarantine`, `redrive`, `trace`, `prune`).
Every command opens the source database given by `--db`. For what to do with a
blocked line, see [Operate a blocked line](../how-to/operate-a-blocked-line.md).
"""

SINK_INTRO: Final = """
# `outbox-sink`

The sink's program: it serves the inbox over HTTP, applying each event once with the
handler registry given by `--handlers` (the built-in warehouse by default), until
SIGTERM or SIGINT.
"""

# What each command does beyond its options, written by hand (a test checks that
# every key is a command of the parsers).
NOTES: Final[dict[str, str]] = {
    "outbox-publisher accept": f"""
With `--id`, `--sku` and `--qty` it records one order and prints `accepted ID` or
`duplicate ID`. With `--file PATH` it imports a JSON Lines file (`-` reads stdin): one
order `{{id, sku, qty}}`, or one event `{{id, type, key, data}}`, a JSON object per
line; blank lines are skipped. Lines are written {MAX_ACCEPT} at a time, each batch in
one transaction. A line that fails (not JSON, over {MAX_BODY_BYTES:,} bytes, invalid, a
conflict) fails alone and writes nothing; it is reported on stderr as `PATH:LINE:
what`, and the other lines are recorded. At the end one line on stdout counts them:
`accepted N, duplicate N, failed N`. A batch the database cannot take is reported
with its line range (`PATH:501-1000: ...`), none of it is written and nothing after
it is read. Exit status `0` if every line was accepted or a duplicate, `1` if any
failed (run the file again once those lines are fixed: what went in comes back as
duplicates), `2` if the file cannot be read. `--file` and `--id`/`--sku`/`--qty` do not
go together.
""",
    "outbox-publisher dispatch": """
It exits `0` when the whole batch was delivered (an empty one too), printing
`delivered N` and the IDs; `1` with one line on stderr saying how far it got
otherwise. It takes the relay lock as `serve` does (on
SQLite it is refused beside a running `serve`), and beside relay workers on PostgreSQL
it delivers under the leases of the lines in its batch, or refuses, naming the worker
that holds one.
""",
    "outbox-publisher serve": """
The console at `/console` runs in the same process, and SIGINT stops it as SIGTERM
does. On an address other than loopback it needs an intake token
(`--intake-token-file` or `OUTBOX_INTAKE_TOKEN`; clients send `Authorization: Bearer
...` on `POST /orders`, `POST /orders/batch`, `POST /events` and `POST /events/batch`)
or `--insecure`. The console at `/console` signs in with the operator token
(`--console-token-file` or `OUTBOX_CONSOLE_TOKEN`); without one it is read-only, and
`--no-console` serves none. `--sink` may be repeated for the nodes of one sink
cluster (one inbox). `--worker-id` names this relay worker in its leases and
`--lease-ttl` is how long a lease lasts unrenewed: see
[Several workers and sinks](../how-to/several-workers-and-sinks.md). The HTTP options
are described [above](#the-http-side-of-a-service).
""",
    "outbox-publisher list": """
Prints one line per entry, or a line saying that nothing matches.
""",
    "outbox-publisher prune": """
Deletes sent entries older than the duration, which is ASCII digits and a unit:
`90s`, `30m`, `12h`, `7d`. A bare number is refused, so that no length is read as
another than meant.
""",
    "outbox-sink": """
Without a token (`--token-file` or `OUTBOX_TOKEN`) it listens only on loopback unless
told `--insecure`. With one, every route but `/healthz`, `/readyz` and `/metrics`
needs `Authorization: Bearer <token>`. The HTTP options are described
[above](#the-http-side-of-a-service).
""",
}

CHAOS: Final[dict[str, str]] = {
    "outbox-publisher": """
`--chaos exit-after-ack` ends the publisher with status 73 right after its first
verified ACK, before that entry is marked sent; `exit-after-ack=N` after the Nth, so
that a crash can land while pipelined requests are in flight. The chaos runner tells
such an exit from a crash by its status. See
[Breaking it on purpose](../tutorial/breaking-it.md).
""",
    "outbox-sink": """
`--chaos` faults are for the chaos runner and for tests: `drop-after-commit=N` closes
the connection without a reply after each of the first N commits, and
`exit-after-commit=N` ends the process with status 73 right after the Nth. See
[Breaking it on purpose](../tutorial/breaking-it.md).
""",
}


def render(program: Program) -> str:
    """The page of `program`."""
    intro = PUBLISHER_INTRO if program.prog == "outbox-publisher" else SINK_INTRO
    sections = [_command(program, command) for command in program.commands]
    return page(
        GENERATED_NOTE,
        intro,
        _synopsis(program),
        GENERAL,
        HTTP_SIDE,
        "## Chaos options\n\n" + CHAOS[program.prog].strip(),
        "## Commands" if len(program.commands) > 1 else "## Options",
        *sections,
    )


def _synopsis(program: Program) -> str:
    usage = "\n\n".join(synopsis(command) for command in program.commands)
    lines = [f"```\n{usage}\n```"]
    if len(program.commands) > 1:
        lines.append(
            table(
                ["Command", "What it does"],
                (
                    [f"[{code(c.subcommand)}](#{slug(c.name)})", text(c.summary)]
                    for c in program.commands
                ),
            )
        )
    return "## Synopsis\n\n" + "\n\n".join(lines)


def _command(program: Program, command: Command) -> str:
    parts = []
    if len(program.commands) > 1:
        parts.append(f"### {code(command.name)}\n\n{_sentence(command.summary)}")
    note = NOTES.get(command.name)
    if note:
        parts.append(" ".join(note.split()))
    parts.append(
        table(["Option", "Default", "Variable", "Description"], map(_row, command.options))
    )
    if command.epilog:
        parts.append(text(command.epilog))
    return "\n\n".join(parts)


def _row(option: Option) -> list[str]:
    if option.positional:
        default = "required (argument)"
    elif option.required:
        default = "required"
    elif option.flag in MACHINE_DEFAULTS:
        default = MACHINE_DEFAULTS[option.flag]
    elif option.default is not None:
        default = code(option.default)
    elif option.metavar is None:
        default = "off"
    elif option.repeatable:
        default = "none"
    else:
        default = "unset"
    described = _sentence(option.help)
    if option.choices:
        described += " One of " + ", ".join(code(c) for c in option.choices) + "."
    if option.repeatable:
        described += " Repeatable."
    return [code(option.invocation), default, code(option.env) if option.env else "", described]


_NAMES: Final = re.compile(r"(?<![\w`-])(--[a-z][a-z-]*|OUTBOX_[A-Z_]+)(?![\w`])")


def _sentence(help_text: str) -> str:
    """An option's help as a sentence: a capital, a full stop, flags and variables
    as code."""
    value = help_text[:1].upper() + help_text[1:]
    if value and not value.endswith("."):
        value += "."
    return text(_NAMES.sub(r"`\1`", value))
