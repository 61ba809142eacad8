"""Run every case, compute the targets as ratios of figures from this run, report.

`python -m bench [--quick] [--out PATH] [--backend postgres [--db-url URL]]` prints a
table on stdout (progress on stderr) and writes the results as JSON. Exit status 0
when every case ran (or was reported "not available"), 1 when a case failed; a
missed target is a result, not a failure.

`--backend postgres` runs the relay and end-to-end cases on SQLite and again on
PostgreSQL (`pg_*`), with the HTTP ceilings and each backend's durable commit
ceiling, in the same run: on a throwaway server the run starts and removes, or in
fresh schemas of the database `--db-url` names (password from PGPASSWORD or a
.pgpass file).
`--cases a,b` runs only those cases (and reports only the targets they make).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Final, TypeVar

import aiohttp

from bench import cases, costs, e2e, generic, marks, own_handler, workers
from bench.cases import SIZES, Context, Figures, NotAvailable
from bench.procs import REPO_ROOT, Children
from bench.profile import SERVER_SETTINGS, py_spy
from bench.report import render
from bench.targets import evaluate
from chaos.dbs import BACKENDS, Place, open_place
from chaos.procs import ChaosError
from plumbing.cli import TextFormatter

T = TypeVar("T")

DEFAULT_OUT: Final = REPO_ROOT / "bench" / "results.json"

Case = Callable[[Context], Awaitable[Figures]]
CASES: Final[tuple[tuple[str, Case], ...]] = (
    ("ceiling", cases.ceiling),
    ("commit_ceiling", cases.commit_ceiling),
    ("event_costs", costs.event_costs),
    ("mark_costs", marks.mark_costs),
    ("naive_peer", cases.naive_peer),
    ("relay_single", cases.relay_single),
    ("relay_batch", cases.relay_batch),
    ("relay_single_generic", generic.relay_single_generic),
    ("relay_batch_generic", generic.relay_batch_generic),
    ("relay_single_handler", own_handler.relay_single_handler),
    ("relay_batch_handler", own_handler.relay_batch_handler),
    ("relay_single_serial", cases.relay_single_serial),
    ("relay_batch_serial", cases.relay_batch_serial),
    ("relay_lanes", cases.relay_lanes),
    ("intake_latency", cases.intake_latency),
    ("e2e_ceiling", e2e.ceiling),
    ("e2e_intake", e2e.intake),
    ("e2e_single", e2e.single),
    ("e2e_bulk", e2e.bulk),
    ("e2e_latency", e2e.latency),
    ("e2e_single_generic", generic.e2e_single_generic),
    ("e2e_bulk_generic", generic.e2e_bulk_generic),
    ("e2e_bulk_handler", own_handler.e2e_bulk_handler),
    ("scaling", cases.scaling),
    ("memory", cases.memory),
)
# What `--backend postgres` runs by default: the relay and end-to-end cases on both
# backends (orders, and beside them generic events and a handler of one's own) and the
# figures they are measured against. The other SQLite cases (naive peer, lanes, intake,
# scaling, memory) are the default run's; `--cases` runs any of them alongside.
SIDE_BY_SIDE: Final = frozenset(
    {
        "ceiling",
        "commit_ceiling",
        "event_costs",
        "relay_single",
        "relay_batch",
        "relay_single_generic",
        "relay_batch_generic",
        "relay_single_handler",
        "relay_batch_handler",
        "relay_single_serial",
        "relay_batch_serial",
        "e2e_ceiling",
        "e2e_intake",
        "e2e_single",
        "e2e_bulk",
        "e2e_latency",
        "e2e_single_generic",
        "e2e_bulk_generic",
        "e2e_bulk_handler",
    }
)
PG_CASES: Final[tuple[tuple[str, Case], ...]] = (
    ("pg_commit_ceiling", cases.pg_commit_ceiling),
    ("pg_relay_single", cases.pg_relay_single),
    ("pg_relay_batch", cases.pg_relay_batch),
    ("pg_relay_single_generic", generic.pg_relay_single_generic),
    ("pg_relay_batch_generic", generic.pg_relay_batch_generic),
    ("pg_relay_single_handler", own_handler.pg_relay_single_handler),
    ("pg_relay_batch_handler", own_handler.pg_relay_batch_handler),
    ("pg_relay_single_serial", cases.pg_relay_single_serial),
    ("pg_relay_batch_serial", cases.pg_relay_batch_serial),
    ("pg_workers", workers.pg_workers),
    ("pg_e2e_intake", e2e.pg_intake),
    ("pg_e2e_single", e2e.pg_single),
    ("pg_e2e_bulk", e2e.pg_bulk),
    ("pg_e2e_latency", e2e.pg_latency),
    ("pg_e2e_single_generic", generic.pg_e2e_single_generic),
    ("pg_e2e_bulk_generic", generic.pg_e2e_bulk_generic),
    ("pg_e2e_bulk_handler", own_handler.pg_e2e_bulk_handler),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    size.add_argument(
        "--tiny",
        action="store_true",
        help="the least work each case can do, for tests: the figures mean nothing",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="sqlite",
        help="postgres: the PostgreSQL cases too, next to the SQLite ones (default: sqlite)",
    )
    parser.add_argument(
        "--db-url",
        metavar="URL",
        help="with --backend postgres: a postgresql:// database to make fresh schemas in "
        "(default: a throwaway server of the run's own); no password in it",
    )
    parser.add_argument("--cases", type=_names, help="only these cases, comma-separated")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="py-spy on every process of the e2e_intake, e2e_single and e2e_bulk cases "
        "(and of the first round of each kind of the generic ones, and of each registry "
        "of the handler ones) while they are timed: "
        "stacks written to DIR, a summary in each case's figures "
        "(sampling costs CPU: the rates of such a run are not comparable)",
    )
    args = parser.parse_args(argv)
    if args.profile is not None and py_spy() is None:
        parser.error("--profile needs py-spy (pip install py-spy)")
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    selected = _selected(parser, args)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so every finally runs: no child left
    started = time.monotonic()
    machine = machine_info()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        children = stack.enter_context(Children(tmp))
        place = _postgres(parser, args, stack) if args.backend == "postgres" else None
        ctx = Context(children, tmp, SIZES[mode], place, args.profile)
        with log_like_the_service(tmp / "bench.log"):
            try:
                results = asyncio.run(_until_terminated(run_cases(ctx, selected)))
            except asyncio.CancelledError:
                print("stopped by SIGTERM", file=sys.stderr, flush=True)
                return 128 + signal.SIGTERM
    machine["load_average_end"] = list(os.getloadavg())
    if "pg_commit_ceiling" in results:
        settings = results["pg_commit_ceiling"].get("settings") or {}
        machine["postgresql"] = settings.get("server_version")
    targets = evaluate(results, ctx.sizes)  # a target of cases not run is left out
    report = {
        "mode": mode,
        "profiled": args.profile is not None,
        "backend": args.backend,
        "machine": machine,
        "duration_s": round(time.monotonic() - started, 1),
        "cases": results,
        "targets": [t.to_dict() for t in targets],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report, targets))
    print(f"\nwritten to {args.out}")
    failed = [name for name, figures in results.items() if "error" in figures]
    return 1 if failed else 0


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _selected(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The names of the cases to run, in the table's order."""
    available = [name for name, _ in CASES]
    if args.backend == "postgres":
        available += [name for name, _ in PG_CASES]
    elif args.db_url is not None:
        parser.error("--db-url is for --backend postgres")
    if args.cases is None and args.backend == "postgres":
        return [name for name in available if name in SIDE_BY_SIDE or name.startswith("pg_")]
    if args.cases is None:
        return available
    unknown = [name for name in args.cases if name not in available]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r} for --backend {args.backend}")
    return [name for name in available if name in args.cases]


def _postgres(
    parser: argparse.ArgumentParser, args: argparse.Namespace, stack: contextlib.ExitStack
) -> Place:
    """Where the pg_* cases make their databases; removed when the run ends."""
    try:
        settings = SERVER_SETTINGS if args.profile is not None else None
        place = open_place("postgres", args.db_url, server_settings=settings)
    except ChaosError as exc:
        parser.exit(2, f"python -m bench: {exc}\n")
    stack.callback(place.close)
    print(f"PostgreSQL: {place.describe()}", file=sys.stderr, flush=True)
    return place


@contextlib.contextmanager
def log_like_the_service(path: Path) -> Iterator[None]:
    """Log as `publisher serve` does (INFO, text lines), into a file instead of stderr,
    so the in-process relay pays for its log lines like the service."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    handler = logging.FileHandler(path)
    handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        handler.close()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


async def _until_terminated(work: Coroutine[Any, Any, T]) -> T:
    """Run `work`; SIGTERM cancels it, so each case's cleanup runs as for any other
    cancellation (a SystemExit raised at a random point of the event loop's own code
    can be lost, and the run would go on)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)  # back to the handler outside


def machine_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "aiohttp": aiohttp.__version__,
        "load_average_start": list(os.getloadavg()),
    }


async def run_cases(ctx: Context, selected: Sequence[str] | None = None) -> dict[str, Figures]:
    every = dict((*CASES, *PG_CASES))
    chosen = [(name, every[name]) for name in selected or [name for name, _ in CASES]]
    results: dict[str, Figures] = {}
    for number, (name, case) in enumerate(chosen, start=1):
        print(f"[{number}/{len(chosen)}] {name} ...", file=sys.stderr, flush=True)
        began = time.monotonic()
        try:
            figures = {"available": True, **await case(ctx)}
        except NotAvailable as exc:
            figures = {"available": False, "reason": str(exc)}
        except Exception as exc:  # one case failing does not lose the others
            figures = {"available": True, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            ctx.children.stop_all()  # whatever a failed case left running
        figures["case_s"] = round(time.monotonic() - began, 2)
        results[name] = figures
        outcome = figures.get("error") or figures.get("reason") or "done"
        print(f"      {outcome} in {figures['case_s']:.1f}s", file=sys.stderr, flush=True)
    return results
