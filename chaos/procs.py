"""Real service processes for chaos runs: start, wait until listening, kill, restart."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

STARTUP_TIMEOUT_S: Final = 20.0
STOP_TIMEOUT_S: Final = 10.0
HTTP_TIMEOUT_S: Final = 5.0
LOOPBACK: Final = "127.0.0.1"
MAX_READS: Final = 1_000
_SAMPLE: Final = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")


class ChaosError(Exception):
    """The chaos run could not be carried out (not a verdict about the system)."""


def free_port() -> int:
    """A loopback port nobody listens on right now, kept for restarts on the same port."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Service:
    """One of our services as an OS process on a fixed loopback port."""

    module: str
    args: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[str] | None = None
    exits: list[int] = field(default_factory=list)
    starts: int = 0
    name: str = ""  # in reports (default: the module); several workers or sinks differ
    pauses: int = 0

    def __post_init__(self) -> None:
        self.name = self.name or self.module

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, *extra: str) -> None:
        """Start the process and return once it says it is listening."""
        command = [sys.executable, "-m", self.module, *self.args, "--port", str(self.port), *extra]
        self.starts += 1
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=log, text=True, env=_child_env()
            )
        _wait_listening(self.proc, self.module, self.log_path)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reap(self) -> int | None:
        """If the process has ended, record and return its exit status."""
        if self.proc is None or self.proc.poll() is None:
            return None
        status = self.proc.returncode
        self.exits.append(status)
        self.proc = None
        return status

    def kill(self) -> bool:
        """SIGKILL: no handler, no cleanup, no flush.

        True if the signal is what ended the process: not when it had already ended,
        nor when it was ending on its own (a chaos exit, say) as the signal came.
        """
        killed = False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            killed = self.proc.wait(timeout=STOP_TIMEOUT_S) == -signal.SIGKILL
        self.reap()
        return killed

    def pause(self) -> subprocess.Popen[str] | None:
        """SIGSTOP the running process (a GC pause, a frozen VM); the process paused,
        for `resume`, or None if none was running."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.send_signal(signal.SIGSTOP)
        self.pauses += 1
        return self.proc

    def stop(self) -> int | None:
        """SIGTERM and wait for an orderly exit (SIGKILL if it takes too long)."""
        if self.proc is None:
            return None
        terminate(self.proc, STOP_TIMEOUT_S)
        return self.reap()


def resume(proc: subprocess.Popen[Any]) -> None:
    """SIGCONT a paused process, unless it has ended meanwhile (killed while paused)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)


def terminate(proc: subprocess.Popen[Any], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM, then SIGKILL if the process does not end within `timeout_s`; its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)
    return proc.returncode


def read_first_line(
    proc: subprocess.Popen[bytes],
    name: str,
    log_path: Path,
    timeout_s: float = STARTUP_TIMEOUT_S,
    *,
    exit_timeout_s: float = STOP_TIMEOUT_S,
) -> str:
    """The first line a process started with a binary stdout pipe prints, within `timeout_s`.

    Raises ChaosError, with the end of its log, if it exits (waited for up to
    `exit_timeout_s` once its stdout closes) or stays silent instead.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        for _ in range(MAX_READS):
            if b"\n" in buffer:
                return buffer.split(b"\n", 1)[0].decode(errors="replace")
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if not selector.select(left):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                status = proc.wait(timeout=exit_timeout_s)
                raise ChaosError(f"{name} exited with {status}: {_log_tail(log_path)}")
            buffer += chunk
    raise ChaosError(f"{name} printed no line within {timeout_s}s: {buffer!r}")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    for name in [n for n in env if n.startswith("OUTBOX_")]:
        del env[name]  # the run sets every option itself
    return env


def _wait_listening(proc: subprocess.Popen[str], name: str, log_path: Path) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            if " listening on " in line:
                return
            if not line:
                break
        elif proc.poll() is not None:
            break
    proc.kill()
    proc.wait(timeout=STOP_TIMEOUT_S)
    raise ChaosError(f"{name} did not start: {_log_tail(log_path)}")


def _log_tail(log_path: Path) -> str:
    tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
    return " | ".join(tail) or "no output"


def http_json(
    method: str, url: str, body: object | None = None, *, ascii_only: bool = True
) -> tuple[int, Any]:
    """One request to a loopback service; (status, parsed JSON). Raises OSError if unreachable.

    The body is JSON with every character outside ASCII escaped (`ascii_only`: text
    outside the Basic Multilingual Plane as a surrogate pair) or written as UTF-8."""
    data = None if body is None else json.dumps(body, ensure_ascii=ascii_only).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    try:
        with opener.open(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def counters(url: str) -> dict[str, float]:
    """A service's /metrics: each sample name's values summed over its labels, and
    each labelled sample as written (`name{label="value"}`). Raises OSError if the
    service cannot be reached."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=HTTP_TIMEOUT_S) as response:
        text = response.read().decode(errors="replace")
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        with contextlib.suppress(ValueError):
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[3])
            if match[2]:
                totals[match[1] + match[2]] = float(match[3])
    return totals
