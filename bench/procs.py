"""Child processes of a benchmark run: started on port 0, all stopped at the end."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from chaos.procs import ChaosError, read_first_line, terminate

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S: Final = 20.0
STOP_TIMEOUT_S: Final = 5.0
PROXY_VARIABLES: Final = frozenset(
    {"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"}
)
# Positions in /proc/PID/stat after the command name (proc(5), fields 4, 14 to 17).
_PPID, _UTIME, _STIME, _CUTIME, _CSTIME = 1, 11, 12, 13, 14
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

    def cpu_s(self) -> float:
        """CPU seconds (user + system, all threads) the process has used so far."""
        fields = _stat(self.pid)
        if fields is None:
            return math.nan
        return (int(fields[_UTIME]) + int(fields[_STIME])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not end in time; close the pipe."""
        terminate(self.proc, STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > _CSTIME else None


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and every process under it, including
    the children each has waited for after they ended: a server's work for its
    clients (a PostgreSQL server's backends) wherever it ran. NaN if it is gone."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields is None:
            continue
        ticks[int(entry.name)] = sum(int(fields[i]) for i in (_UTIME, _STIME, _CUTIME, _CSTIME))
        children.setdefault(int(fields[_PPID]), []).append(int(entry.name))
    if pid not in ticks:
        return math.nan
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += ticks.get(current, 0)
        todo.extend(children.get(current, ()))
    return total / os.sysconf("SC_CLK_TCK")


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
        try:
            line = read_first_line(
                proc, name, log, STARTUP_TIMEOUT_S, exit_timeout_s=STOP_TIMEOUT_S
            )
        except ChaosError as exc:
            raise BenchError(str(exc)) from None
        match = _LISTENING.search(line)
        if match is None:
            child.stop()
            raise BenchError(f"{name}: unexpected first line {line!r}")
        child.base_url, child.path = match[1], match[2]
        return child

    def stop(self, *children: Child) -> None:
        """Stop these children, all at once (each SIGTERMed and waited for in a thread
        of its own): a case's workers take their time to shut down side by side."""
        with ThreadPoolExecutor(max_workers=len(children) or 1) as pool:
            list(pool.map(Child.stop, children))
        for child in children:
            if child in self._started:
                self._started.remove(child)

    def stop_all(self) -> None:
        for child in reversed(self._started):
            child.stop()
        self._started.clear()
