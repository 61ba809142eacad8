"""Child processes of a benchmark run: started on port 0, all stopped at the end."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S: Final = 20.0
STOP_TIMEOUT_S: Final = 5.0
MAX_READS: Final = 1_000
PROXY_VARIABLES: Final = frozenset(
    {"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"}
)
_LISTENING: Final = re.compile(r"listening on (http://127\.0\.0\.1:\d+)(/\S*)")


class BenchError(Exception):
    """A case could not be carried out (not a verdict about the system)."""


def child_env() -> dict[str, str]:
    """This environment without OUTBOX_* and proxy settings; the repo importable."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OUTBOX_") and k not in PROXY_VARIABLES
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass
class Child:
    """One started process and the URL it printed once listening."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    base_url: str = ""
    path: str = ""

    @property
    def url(self) -> str:
        return self.base_url + self.path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def peak_rss_kib(self) -> int | None:
        """VmHWM of the running process, in KiB (None if it cannot be read)."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        match = re.search(r"^VmHWM:\s+(\d+)\s+kB", status, re.MULTILINE)
        return None if match is None else int(match[1])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not end in time; close the pipe."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Children:
    """Every process a run starts; `with Children(workdir) as children:` stops them all."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._started: list[Child] = []
        self._env = child_env()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def start(self, name: str, module: str, *args: str) -> Child:
        """Run `python -m module args... --port 0` and wait for its listening line."""
        log = self._workdir / f"{name}-{len(self._started)}.log"
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args, "--port", "0"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=self._env,
                cwd=self._workdir,
            )
        child = Child(name, proc, log)
        self._started.append(child)
        line = _first_line(child, STARTUP_TIMEOUT_S)
        match = _LISTENING.search(line)
        if match is None:
            child.stop()
            raise BenchError(f"{name}: unexpected first line {line!r}")
        child.base_url, child.path = match[1], match[2]
        return child

    def stop(self, child: Child) -> None:
        child.stop()
        if child in self._started:
            self._started.remove(child)

    def stop_all(self) -> None:
        for child in reversed(self._started):
            child.stop()
        self._started.clear()


def _first_line(child: Child, timeout_s: float) -> str:
    proc = child.proc
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
                status = proc.wait(timeout=STOP_TIMEOUT_S)
                tail = child.log.read_text(errors="replace").strip().splitlines()[-3:]
                raise BenchError(f"{child.name} exited with {status}: {' | '.join(tail)}")
            buffer += chunk
    raise BenchError(f"{child.name} did not say it was listening within {timeout_s}s")
