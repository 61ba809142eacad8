"""The command lines run in the test process: `main(argv)` called as `python -m`
calls it, its output read from pytest's capture (capsys).

For a case whose meaning needs no process of its own (a usage error, a refused
location, a command run to completion on a file): no interpreter to start, nothing
to import again. A test that calls these is a plain function, not `async`: each
`main()` runs an event loop of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from publisher.cli import main as publisher_main
from sink.cli import main as sink_main

Main = Callable[[Sequence[str] | None], int]
# Read by the test run itself (tests/conftest.py), not by any parser: kept.
RUN_SETTINGS = frozenset({"OUTBOX_REQUIRE_POSTGRES"})


@dataclass(frozen=True)
class Ran:
    """What one command line left: its exit status and what it wrote."""

    status: int
    out: str
    err: str


def as_a_child_process(monkeypatch: pytest.MonkeyPatch, cwd: Path) -> None:
    """The settings a child process of the end-to-end tests gets (conftest.child_env):
    no OUTBOX_* variable (every option reads one), `cwd` as the working directory."""
    for name in list(os.environ):
        if name.startswith("OUTBOX_") and name not in RUN_SETTINGS:
            monkeypatch.delenv(name)
    monkeypatch.chdir(cwd)


def run_main(capsys: pytest.CaptureFixture[str], main: Main, *argv: str) -> Ran:
    """`main(argv)` to its end: the exit status it returned, or that argparse exited
    with (a usage error, --help), and what it wrote on stdout and stderr."""
    capsys.readouterr()  # this run's output only
    with process_state_kept():
        try:
            status = main(list(argv))
        except SystemExit as exc:
            status = _exit_status(exc.code)
    out, err = capsys.readouterr()
    return Ran(status, out, err)


def run_publisher(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """`python -m publisher argv...`, in this process."""
    return run_main(capsys, publisher_main, *argv)


def run_sink(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """`python -m sink argv...`, in this process."""
    return run_main(capsys, sink_main, *argv)


def assert_one_line_error(ran: Ran) -> None:
    """One line on stderr, no traceback, nothing on stdout."""
    assert "Traceback" not in ran.err, ran.err
    assert len(ran.err.splitlines()) == 1, ran.err
    assert ran.out == ""


def _exit_status(code: object) -> int:
    """The status a process ends with for SystemExit(code), as the interpreter sets it."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Process-wide switches plumbing.cli.setup_logging turns off (the root logger's
# handlers and level are put back by conftest's root_logging_restored).
LOGGING_SWITCHES = ("logThreads", "logProcesses", "logMultiprocessing", "_srcfile")


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """What a `main()` changes for the whole process, put back afterwards: a service
    that fails after its loop installed SIGINT and SIGTERM handlers leaves, on uvloop,
    the handlers of its closed loop in place (asyncio's loop restores the defaults),
    so this process could no longer be interrupted; and the logging switches."""
    handlers = [signal.getsignal(sig) for sig in SIGNALS]
    switches = [getattr(logging, name) for name in LOGGING_SWITCHES]
    try:
        yield
    finally:
        for sig, handler in zip(SIGNALS, handlers, strict=True):
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(sig, handler)
        for name, value in zip(LOGGING_SWITCHES, switches, strict=True):
            setattr(logging, name, value)
