"""Command-line conventions both services share.

One line on stderr per error and fixed exit codes; every option can also come from
an OUTBOX_* environment variable, and its --help shows its default; logs as plain
text or one JSON object per line.

Text from outside (a sink's reply, a reason or a name kept in a record, an ID read
from a database) reaches a terminal and the text log through `escaped`: a control
character in it would act on the terminal (ESC sequences, CR) or forge log lines
(CR LF and a timestamp), so each is written as a visible escape instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, NoReturn

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
# A chaos option ended the process on purpose (publisher --chaos exit-after-ack, sink
# --chaos exit-after-commit): the chaos runner tells it from a crash by this status.
CHAOS_EXIT_STATUS: Final = 73
ENV_PREFIX: Final = "OUTBOX_"
TRUE_WORDS: Final = frozenset({"1", "true", "yes", "on"})
_DURATION_RE: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
# ASCII digits only: int() and float() would also take "1_000" and other scripts' digits.
_INT_RE: Final = re.compile(r"-?[0-9]+")
_DECIMAL_RE: Final = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
MAX_PORT: Final = 65535
_SECONDS_PER_UNIT: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# A duration with its unit, in ASCII digits (`\d` would take other scripts' digits).
_UNIT_DURATION_RE: Final = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd])")
# What a terminal or a log reader acts on instead of showing, or shows as nothing: the
# C0 and C1 controls and DEL, the line and paragraph separators, lone surrogates (no
# UTF-8 encoder writes those), the interlinear annotation marks, and every default
# ignorable code point of Unicode (bidi overrides and isolates, zero widths, the BOM,
# the soft hyphen, fillers, variation selectors, tag characters). The console's page
# escapes the same set (console.js).
_UNSAFE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f"
    "\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0"
    "\ufff0-\ufffb\ud800-\udfff\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)


def utc_text(timestamp: float, timespec: str = "milliseconds") -> str:
    """A Unix time as every view of both services shows one: ISO 8601 in UTC with Z
    (2026-12-06T01:21:10.000Z), as the console's and CloudEvents' times read."""
    moment = datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
    return moment.isoformat(timespec=timespec).removesuffix("+00:00") + "Z"


def escaped(text: str) -> str:
    """`text` with every character a terminal or a log reader would act on written as
    a Python escape (\\r, \\n, \\x1b, \\u202e): one line, shown as it is."""
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    return match[0].encode("unicode_escape").decode("ascii")


class DefaultsShown(argparse.HelpFormatter):
    """--help shows each option's default (as add_option does for its own), unless
    its help already says it or it has none worth showing (off, unset)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or "(default" in text or action.default is argparse.SUPPRESS:
            return action.help
        shown = _default_shown(action.default)
        return action.help if shown is None else f"{text} (default: {shown})".strip()


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit status 2.

    Abbreviated options are off: `--token` must not quietly mean `--token-file`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {escaped(message)} (see --help)\n")


def add_version(parser: argparse.ArgumentParser, side: str, modules: tuple[str, str]) -> None:
    """`--version`: the installed release, and the schema version of `side` it writes
    on SQLite and on PostgreSQL (`modules`: the two backends' SQL modules, imported
    only when asked), which is what decides whether it opens a database."""

    class Version(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
            import importlib
            from importlib import metadata

            sqlite, postgres = (importlib.import_module(name).SCHEMA.version for name in modules)
            release = metadata.version("outbox-relay")
            print(
                f"{parser.prog} {release}: {side} schema version {sqlite} on SQLite,"
                f" {postgres} on PostgreSQL"
            )
            parser.exit(EXIT_OK)

    parser.add_argument(
        "--version",
        nargs=0,
        action=Version,
        help="show the release, and the schema version it writes, and exit",
    )


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def add_option(parser: argparse.ArgumentParser, flag: str, **kwargs: Any) -> None:
    """add_argument whose default also comes from OUTBOX_<FLAG>, shown in --help.

    A required option is satisfied by its environment variable.
    """
    env = env_name(flag)
    value = os.environ.get(env) or None  # set but empty counts as unset
    if value is not None:
        if kwargs.get("action") == "store_true":
            kwargs["default"] = value.strip().lower() in TRUE_WORDS
        elif kwargs.get("action") == "append":
            kwargs["default"] = [part for part in value.split(",") if part]
        else:
            # argparse applies `type` to a string default, but never `choices`:
            # check those in the type, so a bad variable is a usage error too.
            kwargs["type"] = _from_env(env, kwargs.get("type"), kwargs.get("choices"))
            kwargs["default"] = value
        kwargs["required"] = False
    shown = _default_shown(kwargs.get("default"))
    default = "" if shown is None else f" (default: {shown})"
    kwargs["help"] = f"{kwargs.get('help', '')}{default} [env {env}]".strip()
    parser.add_argument(flag, **kwargs)


def _default_shown(value: object) -> str | None:
    """How --help shows a default: a number or a text as it is; nothing for an option
    that is off or unset by default, or for a default that has no plain form."""
    if isinstance(value, bool) or value is None or value == []:
        return None
    if isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, int | str):
        text = str(value)
    elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        text = ",".join(value)
    else:
        return None
    return escaped(text).replace("%", "%%")  # argparse formats help with %


def _from_env(
    env: str, convert: Callable[[str], Any] | None, choices: Iterable[Any] | None
) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = text if convert is None else convert(text)
        if choices is not None and value not in choices:
            allowed = ", ".join(map(str, choices))
            raise argparse.ArgumentTypeError(f"{value!r} is not one of {allowed} (flag or {env})")
        return value

    return parse


def strict_int(text: str) -> int:
    """argparse type: an integer in plain ASCII digits, optionally negative."""
    if _INT_RE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    return int(text)


def int_in(low: int, high: int) -> Callable[[str], int]:
    """argparse type: a strict integer from `low` to `high`."""

    def parse(text: str) -> int:
        if _INT_RE.fullmatch(text) is None or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {low} to {high}, got {text!r}"
            )
        return int(text)

    return parse


def positive_int(text: str) -> int:
    """argparse type: a strict integer greater than 0."""
    if _INT_RE.fullmatch(text) is None or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer greater than 0, got {text!r}")
    return int(text)


def port(text: str) -> int:
    """argparse type: a TCP port, 0 (any free port) to 65535."""
    return int_in(0, MAX_PORT)(text)


def positive_s(text: str) -> float:
    """argparse type: a finite number of seconds above 0, in plain decimal digits."""
    if _DECIMAL_RE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}")
    seconds = float(text)
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return seconds


def non_empty(text: str) -> str:
    """argparse type: text that is not empty or only white space."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def duration_with_unit_s(text: str) -> float:
    """argparse type: ASCII digits and a unit, '90s', '15m', '12h', '7d' (or '1.5h'),
    nothing else: a bare number or other scripts' digits could be read as another
    length than meant, where a wrong length deletes data (`prune --older-than`)."""
    match = _UNIT_DURATION_RE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text[:40]!r} (ASCII digits and a unit: 90s, 15m, 12h, 7d)"
        )
    seconds = float(match[1]) * _SECONDS_PER_UNIT[match[2]]
    if seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"duration must be finite, got {text[:40]!r}")
    return seconds


def duration_s(text: str) -> float:
    """argparse type: '90s', '15m', '12h', '7d' (or a plain number of seconds)."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None:
        try:
            seconds = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a duration: {text!r} (try 90s, 15m, 12h, 7d)"
            ) from None
    else:
        seconds = float(match[1]) * _SECONDS_PER_UNIT[match[2]]
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"duration must be a finite number >= 0, got {text!r}")
    return seconds


def fail(prog: str, message: object, status: int = EXIT_FAILED) -> int:
    """Print one line on stderr (`message` escaped: it may quote a sink's reply) and
    return the exit status to use."""
    print(f"{prog}: {escaped(str(message))}", file=sys.stderr, flush=True)
    return status


_RESERVED: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a log call passed with extra=."""
    return {k: v for k, v in vars(record).items() if k not in _RESERVED}


TRACE_INDENT: Final = "  "  # before each line of a traceback in the text log


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...`, one line, escaped (`escaped`)."""

    _second: int | None = None
    _second_text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """The time as every view shows one (utc_text): ISO 8601 in UTC to the
        millisecond, its date and time part made once per second (a relay logs a
        line per request: strftime for each was a cost of its own)."""
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        """One line per record, escaped, whatever its message and fields hold (a
        sink's reply quoted in an error must not start a line of its own). A
        traceback follows on lines of their own, each indented and escaped, so that
        no text quoted in it starts a line that reads as a record."""
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        if record.name != "aiohttp.access":  # its fields are already in the message
            fields = " ".join(f"{k}={v}" for k, v in record_fields(record).items())
            line = f"{line} {fields}" if fields else line
        line = escaped(line)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        for text in (record.exc_text, record.stack_info and self.formatStack(record.stack_info)):
            if text:
                line += "".join(f"\n{TRACE_INDENT}{escaped(part)}" for part in text.splitlines())
        return line


# One encoder for every line: json.dumps(default=...) builds a new one per call.
_JSON: Final = json.JSONEncoder(default=str)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **record_fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _JSON.encode(entry)


class CommandFormatter(logging.Formatter):
    """`PROG: level: message`, one line, escaped: what a one-shot command logs
    (a warning of the storage, say) reads as its errors do."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        return f"{self.prog}: {record.levelname.lower()}: {escaped(record.getMessage())}"


def setup_command_logging(prog: str) -> None:
    """Warnings and errors of a one-shot command on stderr, as CommandFormatter
    writes them (not Python's last-resort handler, which writes them as they are)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(CommandFormatter(prog))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


def setup_logging(log_format: str = "text", level: str = "INFO") -> None:
    """Logs on stderr (stdout is kept for results), as text or JSON lines.

    Neither format shows the thread, the process or the caller's source line, so
    log records do not look them up: a relay writes a line per request, and those
    look-ups were a third of what each line cost (the logging HOWTO's optimisations).
    """
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None  # no findCaller(): the frame walk per record
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
