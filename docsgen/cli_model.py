"""The command lines as data, read from the real argument parsers.

Every option built with plumbing.cli.add_option says in its help which OUTBOX_*
variable it reads and its default; both are read back from the parser, which is
built with no OUTBOX_* variable and no $USER in the environment, so that the
defaults shown are the code's own and not this machine's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from plumbing.cli import ENV_PREFIX, _default_shown

_ENV_SUFFIX: Final = re.compile(r"\s*\[env (?P<env>[A-Z0-9_]+)\]$")
# Defaults that depend on the machine a program runs on: what the page says instead.
MACHINE_DEFAULTS: Final = {
    "--by": "$USER, or `operator` when that is unset or not a valid name",
    "--event-loop": "`uvloop` where it is installed (every platform but Windows), else `asyncio`",
}


@dataclass(frozen=True)
class Option:
    """One option (or positional argument) as a page shows it."""

    invocation: str  # `--db DB`, `--event-loop {uvloop,asyncio}`, `id`
    flag: str  # `--db`, or the positional's name
    help: str  # without the default and environment variable the parser appends
    default: str | None  # as --help shows it
    env: str | None  # the OUTBOX_* variable, for an option that reads one
    choices: tuple[str, ...]
    required: bool
    repeatable: bool
    positional: bool
    metavar: str | None  # what follows the flag, if anything


@dataclass(frozen=True)
class Command:
    """A program, or one of its subcommands."""

    name: str  # `outbox-publisher accept`, `outbox-sink`
    subcommand: str | None
    summary: str
    options: tuple[Option, ...]
    epilog: str | None


@dataclass(frozen=True)
class Program:
    script: str  # the console script: outbox-publisher
    module: str  # python -m publisher
    prog: str  # the name the program calls itself in --help and errors
    description: str
    commands: tuple[Command, ...]


@contextlib.contextmanager
def neutral_environment() -> Iterator[None]:
    """No OUTBOX_* variable and no $USER while parsers are built: both would become
    defaults. Restored afterwards."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX) or k == "USER"}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def program(script: str, module: str, build: Callable[[], argparse.ArgumentParser]) -> Program:
    """The program whose parser `build` makes."""
    with neutral_environment():
        parser = build()
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        command = _command(script, None, parser.description or "", parser)
        return Program(script, module, parser.prog, parser.description or "", (command,))
    (choices,) = subparsers
    summaries = {a.dest: a.help or "" for a in choices._choices_actions}
    commands = tuple(
        _command(f"{script} {name}", name, summaries.get(name, ""), sub)
        for name, sub in choices.choices.items()
    )
    return Program(script, module, parser.prog, parser.description or "", commands)


def _command(
    name: str, subcommand: str | None, summary: str, parser: argparse.ArgumentParser
) -> Command:
    options = tuple(
        _option(parser, action)
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    )
    return Command(name, subcommand, summary, options, parser.epilog)


def _option(parser: argparse.ArgumentParser, action: argparse.Action) -> Option:
    formatter = parser._get_formatter()
    help_text = (action.help or "").replace("%%", "%")
    env = None
    found = _ENV_SUFFIX.search(help_text)
    if found is not None:
        env = found["env"]
        help_text = help_text[: found.start()]
    default = _default_shown(action.default)
    if default is not None:
        default = default.replace("%%", "%")
        help_text = help_text.removesuffix(f" (default: {default})")
    positional = not action.option_strings
    flag = action.option_strings[-1] if action.option_strings else action.dest
    metavar = None
    if action.nargs != 0:
        metavar = formatter._format_args(action, action.dest.upper() if not positional else flag)
    if positional:
        invocation = str(action.metavar or action.dest.upper())
    else:
        invocation = flag if metavar is None else f"{flag} {metavar}"
    return Option(
        invocation=invocation,
        flag=flag,
        help=help_text.strip(),
        default=default,
        env=env,
        choices=tuple(str(c) for c in action.choices or ()),
        required=bool(action.required) or positional,
        repeatable=isinstance(action, argparse._AppendAction),
        positional=positional,
        metavar=metavar,
    )


def synopsis(command: Command, width: int = 88) -> str:
    """The command's usage, wrapped at `width` with continuation lines indented."""
    words = [command.name]
    for option in command.options:
        if option.positional:
            words.append(option.invocation)
            continue
        word = option.invocation
        word = word if option.required else f"[{word}]"
        words.append(word + ("..." if option.repeatable else ""))
    lines: list[str] = []
    line = ""
    indent = " " * (len(command.name) + 1)
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = indent + word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines)


def programs() -> tuple[Program, Program]:
    """Both programs, the publisher first."""
    from publisher.cli import build_parser as publisher_parser
    from sink.cli import build_parser as sink_parser

    return (
        program("outbox-publisher", "python -m publisher", publisher_parser),
        program("outbox-sink", "python -m sink", sink_parser),
    )
