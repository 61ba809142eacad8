"""Command-line conventions both services share.

One line on stderr per error and fixed exit codes; every option can also come from
an OUTBOX_* environment variable; logs as plain text or one JSON object per line.
"""

from __future__ import annotations

import argparse
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


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit status 2.

    Abbreviated options are off: `--token` must not quietly mean `--token-file`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


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
    kwargs["help"] = f"{kwargs.get('help', '')} [env {env}]".strip()
    parser.add_argument(flag, **kwargs)


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
    """Print one line on stderr and return the exit status to use."""
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
    return status


_RESERVED: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a log call passed with extra=."""
    return {k: v for k, v in vars(record).items() if k not in _RESERVED}


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...`"""

    _second: int | None = None
    _second_text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """The default time format, its date and time part made once per second (a
        relay logs a line per request: strftime for each was a cost of its own)."""
        msec_format = self.default_msec_format
        if datefmt is not None or msec_format is None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        return msec_format % (self._second_text, record.msecs)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if record.name == "aiohttp.access":
            return line  # its fields are already in the message
        fields = " ".join(f"{k}={v}" for k, v in record_fields(record).items())
        return f"{line} {fields}" if fields else line


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
