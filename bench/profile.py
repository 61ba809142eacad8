"""`python -m bench --profile DIR`: py-spy on every process of an end-to-end case.

While an `e2e_intake`, `e2e_single` or `e2e_bulk` case (and its `pg_` form) is timed,
py-spy samples each of its processes: the publisher, the sink and this one (the
clients). The collapsed stacks are written to `DIR/<case>-<process>.txt` (py-spy's
raw format, which flame graph tools read), and the case's figures carry a summary
of each: the samples taken, their share by area (the package of the innermost
frame: aiohttp, asyncio, publisher, ...) and the functions with the most samples of
their own. py-spy needs to be allowed to trace the processes (root, or
kernel.yama.ptrace_scope 0); one that cannot attach fails the case with its words.

On PostgreSQL (`--backend postgres` on the run's own server, which then loads
pg_stat_statements) the case also carries the server's side: the time it spent in
the statements of the run's databases over the same span, and the statements that
took most of it.

Sampling takes CPU of its own, so the rates of a profiled run are not comparable
with those of a run without `--profile`; the shares are what it is for.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from bench.procs import REPO_ROOT, BenchError

RATE_HZ: Final = 250
TOP_FUNCTIONS: Final = 12
START_TIMEOUT_S: Final = 15.0
START_POLL_S: Final = 0.02
STOP_TIMEOUT_S: Final = 30.0
_FRAME: Final = re.compile(r"^(?P<function>.*) \((?P<file>.+?)(?::\d+)?\)$")
_STDLIB: Final = re.compile(r"/lib/python3\.\d+/")


def py_spy() -> str | None:
    """The py-spy next to this Python (a virtualenv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


@contextlib.asynccontextmanager
async def sampled(
    directory: Path, case: str, pids: Mapping[str, int]
) -> AsyncIterator[dict[str, Any]]:
    """py-spy on each of `pids` (by process name) for the body's span; the dict yielded
    is filled with each process's summary once the samplers have stopped. Every
    sampler started is stopped, whatever happens; a sampler that fails is reported
    unless the body already failed."""
    program = py_spy()
    if program is None:
        raise BenchError("--profile needs py-spy (pip install py-spy)")
    directory.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    samplers: dict[str, tuple[asyncio.subprocess.Process, Path]] = {}
    body_failed = False
    try:
        for name, pid in pids.items():
            stacks, log = directory / f"{case}-{name}.txt", directory / f"{case}-{name}.log"
            samplers[name] = await _start(program, name, pid, stacks, log), stacks
        yield summary
    except BaseException:
        body_failed = True
        raise
    finally:
        failures = [await _stop(name, sampler) for name, (sampler, _) in samplers.items()]
        failure = next((f for f in failures if f is not None), None)
        if failure is not None and not body_failed:
            raise failure
    for name, (_, stacks) in samplers.items():
        summary[name] = {"file": str(stacks), **summarise(_read(stacks))}


async def _start(
    program: str, name: str, pid: int, stacks: Path, log: Path
) -> asyncio.subprocess.Process:
    """py-spy recording `pid` into `stacks`, once it says it is sampling (in `log`,
    a file: a pipe nobody reads while it samples could fill and stall it)."""
    command = [program, "record", "-p", str(pid), "-o", str(stacks), "-f", "raw"]
    with log.open("wb") as out:
        sampler = await asyncio.create_subprocess_exec(
            *command,
            "-r",
            str(RATE_HZ),
            "--nonblocking",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        for _ in range(int(START_TIMEOUT_S / START_POLL_S)):
            words = log.read_text(errors="replace")
            if "Sampling process" in words:
                return sampler
            if sampler.returncode is not None:
                break
            await asyncio.sleep(START_POLL_S)
        else:
            words = f"no word from py-spy in {START_TIMEOUT_S:g} s"
    except BaseException:  # cancelled (SIGTERM): leave nothing behind
        await _stop(name, sampler)
        raise
    await _stop(name, sampler)
    said = " ".join(words.partition("Stack backtrace:")[0].split())  # its words, not its stack
    said = said or f"it ended with status {sampler.returncode}"
    raise BenchError(f"py-spy could not sample the {name} (pid {pid}): {said}")


async def _stop(name: str, sampler: asyncio.subprocess.Process) -> BenchError | None:
    """Ctrl-C, as py-spy expects: it writes what it sampled and exits. Killed if it
    does not within STOP_TIMEOUT_S, and then the error is returned."""
    if sampler.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            sampler.send_signal(signal.SIGINT)
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            await sampler.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            sampler.kill()
        await sampler.wait()
        return BenchError(f"py-spy on the {name} did not stop in {STOP_TIMEOUT_S:g} s")
    return None


# The PostgreSQL server's side (`--backend postgres`, on the run's own server, which
# then loads pg_stat_statements): the statements of its databases over the span.
SERVER_SETTINGS: Final = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
    "pg_stat_statements.track_planning": "on",
}
TOP_STATEMENTS: Final = 8
_OURS: Final = "d.datname <> 'postgres'"
_TOTALS: Final = f"""
    SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time + total_plan_time), 0)
    FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE {_OURS}
"""
_TOP: Final = rf"""
    SELECT d.datname, calls, total_exec_time, total_plan_time, rows,
           left(regexp_replace(query, '\s+', ' ', 'g'), 160)
    FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE {_OURS}
    ORDER BY total_exec_time + total_plan_time DESC LIMIT {TOP_STATEMENTS}
"""


@contextlib.asynccontextmanager
async def statements(url: str) -> AsyncIterator[dict[str, Any]]:
    """pg_stat_statements over the body's span: the time the server spent executing
    and planning statements, and the statements that took most of it; the dict
    yielded is filled once the body is over."""
    await asyncio.to_thread(_reset, url)
    figures: dict[str, Any] = {}
    yield figures
    (totals,) = await asyncio.to_thread(_server, url, _TOTALS)
    top = await asyncio.to_thread(_server, url, _TOP)
    figures["calls"], figures["statement_ms"] = int(totals[0]), float(totals[1])
    figures["top_statements"] = [
        {
            "database": database.rpartition("_")[2],  # source or sink (bench/e2e)
            "calls": calls,
            "exec_ms": exec_ms,
            "plan_ms": plan_ms,
            "rows": rows,
            "query": query,
        }
        for database, calls, exec_ms, plan_ms, rows, query in top
    ]


def _reset(url: str) -> None:
    """The view in the server's maintenance database (once), and its counts at zero."""
    _server(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    _server(url, "SELECT pg_stat_statements_reset()")


def _server(url: str, statement: str) -> list[tuple[Any, ...]]:
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            cursor = conn.execute(statement.encode())
            return cursor.fetchall() if cursor.description is not None else []
    except psycopg.Error as exc:
        raise BenchError(f"pg_stat_statements: {str(exc).strip().splitlines()[0]}") from None


def _read(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise BenchError(f"py-spy wrote no profile to {path}: {exc.strerror}") from None


def summarise(lines: Iterable[str]) -> dict[str, Any]:
    """From raw collapsed stacks (`frame;frame;... count`, the innermost frame last):
    the samples, each area's share of them, and the top functions by own samples."""
    total = 0
    areas: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        function, area = _where(stack.rpartition(";")[2])
        total += samples
        areas[area] += samples
        functions[function] += samples
    if total == 0:
        return {"samples": 0, "areas": {}, "top_functions": []}
    return {
        "samples": total,
        "areas": {area: n / total for area, n in areas.most_common()},
        "top_functions": [
            {"function": f, "share": n / total} for f, n in functions.most_common(TOP_FUNCTIONS)
        ],
    }


def _where(frame: str) -> tuple[str, str]:
    """`function (path)` and its area: the package under site-packages, the standard
    library module, or this project's top-level package."""
    match = _FRAME.match(frame)
    if match is None:
        return frame, "other"
    inner = match["file"]  # py-spy shortens it to the part under sys.path, mostly
    if "site-packages/" in inner:
        inner = inner.rsplit("site-packages/", 1)[1]
    elif _STDLIB.search(inner):
        inner = _STDLIB.split(inner, maxsplit=1)[1]
    elif inner.startswith(f"{REPO_ROOT}/"):
        inner = inner.removeprefix(f"{REPO_ROOT}/")
    area = inner.split("/", 1)[0].removesuffix(".py")
    return f"{match['function']} ({inner})", area or "other"
