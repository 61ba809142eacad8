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
import math
import os
import platform
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final, Literal, TypeVar

import aiohttp

from bench import cases, e2e, workers
from bench.cases import FULL, QUICK, Context, Figures, NotAvailable, Sizes
from bench.procs import REPO_ROOT, Children
from bench.profile import SERVER_SETTINGS, py_spy
from chaos.dbs import BACKENDS, Place, open_place
from chaos.procs import ChaosError
from plumbing.cli import TextFormatter
from publisher.relay import DEFAULT_DEPTH

T = TypeVar("T")

DEFAULT_OUT: Final = REPO_ROOT / "bench" / "results.json"
RSS_BUDGET_MIB: Final = 20.0
# 4 workers "not slower" than 1, less 10% for noise: on this shared 2-core machine the
# two drains of one K have differed by up to 30% (other work on the machine); the
# interleaved order (1, 2, 4, 4, 2, 1) cancels a drift, not that noise.
WORKERS_NOT_SLOWER: Final = 0.9

Case = Callable[[Context], Awaitable[Figures]]
CASES: Final[tuple[tuple[str, Case], ...]] = (
    ("ceiling", cases.ceiling),
    ("commit_ceiling", cases.commit_ceiling),
    ("naive_peer", cases.naive_peer),
    ("relay_single", cases.relay_single),
    ("relay_batch", cases.relay_batch),
    ("relay_single_serial", cases.relay_single_serial),
    ("relay_batch_serial", cases.relay_batch_serial),
    ("relay_lanes", cases.relay_lanes),
    ("intake_latency", cases.intake_latency),
    ("e2e_ceiling", e2e.ceiling),
    ("e2e_intake", e2e.intake),
    ("e2e_single", e2e.single),
    ("e2e_bulk", e2e.bulk),
    ("e2e_latency", e2e.latency),
    ("scaling", cases.scaling),
    ("memory", cases.memory),
)
# What `--backend postgres` runs by default: the relay and end-to-end cases on both
# backends and the figures they are measured against, in one run of about three
# minutes. The other SQLite cases (naive peer, lanes, intake, scaling, memory) are the
# default run's; `--cases` runs any of them alongside.
SIDE_BY_SIDE: Final = frozenset(
    {
        "ceiling",
        "commit_ceiling",
        "relay_single",
        "relay_batch",
        "relay_single_serial",
        "relay_batch_serial",
        "e2e_ceiling",
        "e2e_intake",
        "e2e_single",
        "e2e_bulk",
        "e2e_latency",
    }
)
PG_CASES: Final[tuple[tuple[str, Case], ...]] = (
    ("pg_commit_ceiling", cases.pg_commit_ceiling),
    ("pg_relay_single", cases.pg_relay_single),
    ("pg_relay_batch", cases.pg_relay_batch),
    ("pg_relay_single_serial", cases.pg_relay_single_serial),
    ("pg_relay_batch_serial", cases.pg_relay_batch_serial),
    ("pg_workers", workers.pg_workers),
    ("pg_e2e_intake", e2e.pg_intake),
    ("pg_e2e_single", e2e.pg_single),
    ("pg_e2e_bulk", e2e.pg_bulk),
    ("pg_e2e_latency", e2e.pg_latency),
)


@dataclass(frozen=True)
class Target:
    name: str
    detail: str
    measured: float | None
    target: float
    comparison: Literal[">=", "<="]
    unit: str
    cases: tuple[str, ...]
    why_not: str | None = None  # why nothing was measured
    # Measured against the same goal for comparison only: another setting than the
    # one the target is about. Never met or missed.
    reference: bool = False
    # For a ratio: the most the CPU the measured processes spent per event allows with
    # every CPU busy (cpu_bound_per_s against the same reference). A goal above it
    # cannot be met on this machine by any arrangement of them, only by costing less;
    # a miss below it says so.
    reach: float | None = None

    @property
    def met(self) -> bool | None:
        if self.measured is None or self.reference:
            return None
        if self.comparison == ">=":
            return self.measured >= self.target
        return self.measured <= self.target

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "detail": self.detail,
            "measured": self.measured,
            "target": self.target,
            "comparison": self.comparison,
            "unit": self.unit,
            "met": self.met,
            "reference": self.reference,
            "cases": list(self.cases),
            **({"not_measured": self.why_not} if self.why_not else {}),
            **({"cpu_reach": self.reach} if self.reach is not None else {}),
        }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
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
        "while they are timed: stacks written to DIR, a summary in each case's figures "
        "(sampling costs CPU: the rates of such a run are not comparable)",
    )
    args = parser.parse_args(argv)
    if args.profile is not None and py_spy() is None:
        parser.error("--profile needs py-spy (pip install py-spy)")
    mode = "quick" if args.quick else "full"
    selected = _selected(parser, args)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so every finally runs: no child left
    started = time.monotonic()
    machine = machine_info()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        children = stack.enter_context(Children(tmp))
        place = _postgres(parser, args, stack) if args.backend == "postgres" else None
        ctx = Context(children, tmp, QUICK if args.quick else FULL, place, args.profile)
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
    targets = [
        t
        for t in compute_targets(results, ctx.sizes)
        if all(case in results for case in t.cases)  # a target of cases not run is left out
    ]
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


# ---------------------------------------------------------------- targets


def _figure(results: dict[str, Figures], case: str, *path: str | int) -> float | None:
    """A figure of a case that ran, or None."""
    value: Any = results.get(case, {})
    if "error" in value or value.get("available") is False:
        return None
    for key in path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return None
    return float(value) if isinstance(value, int | float) else None


def _why_not(results: dict[str, Figures], *names: str) -> str:
    for name in names:
        figures = results.get(name, {})
        if figures.get("available") is False:
            return f"{name} not available: {figures.get('reason')}"
        if "error" in figures:
            return f"{name} failed: {figures['error']}"
    return "figure missing"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def compute_targets(results: dict[str, Figures], sizes: Sizes) -> list[Target]:
    ceiling = _figure(results, "ceiling", "round_trips_per_s")
    naive = _figure(results, "naive_peer", "events_per_s")
    single = _figure(results, "relay_single", "events_per_s")
    batch = _figure(results, "relay_batch", "events_per_s")
    single_serial = _figure(results, "relay_single_serial", "events_per_s")
    batch_serial = _figure(results, "relay_batch_serial", "events_per_s")
    depth = DEFAULT_DEPTH
    small_rows, big_rows = sizes.scale_sent_rows
    small_backlog, _, big_backlog = sizes.scale_backlogs
    small_mem, big_mem = sizes.memory_backlogs
    low_rss = _figure(results, "memory", "peak_rss_mib", 0)
    high_rss = _figure(results, "memory", "peak_rss_mib", 1)
    rss_growth = None if low_rss is None or high_rss is None else high_rss - low_rss

    def target(
        name: str,
        detail: str,
        measured: float | None,
        goal: float,
        comparison: Literal[">=", "<="],
        cases_used: tuple[str, ...],
        unit: str = "x",
        reference: bool = False,
        reach: float | None = None,
    ) -> Target:
        why = None if measured is not None else _why_not(results, *cases_used)
        return Target(
            name, detail, measured, goal, comparison, unit, cases_used, why, reference, reach
        )

    def lanes_ratio(delivery: str, suffix: str) -> float | None:
        return _ratio(
            _figure(results, "relay_lanes", f"{delivery}_lanes{suffix}_events_per_s"),
            _figure(results, "relay_lanes", f"{delivery}_global{suffix}_events_per_s"),
        )

    lanes = ("relay_lanes",)
    stall = "sink stall 5 ms"
    pg_commits = _figure(results, "pg_commit_ceiling", "commits_per_s")
    pg_single = _figure(results, "pg_relay_single", "events_per_s")
    pg_batch = _figure(results, "pg_relay_batch", "events_per_s")
    pg_single_serial = _figure(results, "pg_relay_single_serial", "events_per_s")
    pg_batch_serial = _figure(results, "pg_relay_batch_serial", "events_per_s")
    postgres = [
        target(
            "PostgreSQL: batches vs its commit ceiling",
            f"pg_relay_batch events/s / pg_commit_ceiling commits/s (up to {depth} in flight)",
            _ratio(pg_batch, pg_commits),
            2.0,
            ">=",
            ("pg_relay_batch", "pg_commit_ceiling"),
        ),
        target(
            "  PostgreSQL: batches vs commit ceiling, --pipeline 1",
            "pg_relay_batch_serial events/s / pg_commit_ceiling commits/s",
            _ratio(pg_batch_serial, pg_commits),
            2.0,
            ">=",
            ("pg_relay_batch_serial", "pg_commit_ceiling"),
            reference=True,
        ),
        target(
            "PostgreSQL: one event per request vs ceiling",
            f"pg_relay_single events/s / ceiling round trips/s (up to {depth} in flight)",
            _ratio(pg_single, ceiling),
            0.5,
            ">=",
            ("pg_relay_single", "ceiling"),
        ),
        target(
            "  PostgreSQL: one per request vs ceiling, --pipeline 1",
            "pg_relay_single_serial events/s / ceiling round trips/s",
            _ratio(pg_single_serial, ceiling),
            0.5,
            ">=",
            ("pg_relay_single_serial", "ceiling"),
            reference=True,
        ),
    ]
    return [
        target(
            "one event per request vs ceiling",
            f"relay_single events/s / ceiling round trips/s (default: up to {depth} in flight)",
            _ratio(single, ceiling),
            0.5,
            ">=",
            ("relay_single", "ceiling"),
        ),
        target(
            "  one event per request vs ceiling, --pipeline 1",
            "relay_single_serial events/s / ceiling round trips/s",
            _ratio(single_serial, ceiling),
            0.5,
            ">=",
            ("relay_single_serial", "ceiling"),
            reference=True,
        ),
        target(
            "one event per request vs naive peer",
            "relay_single events/s / naive_peer events/s",
            _ratio(single, naive),
            1.5,
            ">=",
            ("relay_single", "naive_peer"),
        ),
        target(
            "batches vs ceiling",
            f"relay_batch events/s / ceiling round trips/s (default: up to {depth} in flight)",
            _ratio(batch, ceiling),
            5.0,
            ">=",
            ("relay_batch", "ceiling"),
        ),
        target(
            "  batches vs ceiling, --pipeline 1",
            "relay_batch_serial events/s / ceiling round trips/s",
            _ratio(batch_serial, ceiling),
            5.0,
            ">=",
            ("relay_batch_serial", "ceiling"),
            reference=True,
        ),
        target(
            "lanes vs global, slow sink, one event per request",
            f"per-SKU lanes events/s / global order events/s, one in flight per line, {stall}",
            lanes_ratio("single", ""),
            5.0,
            ">=",
            lanes,
        ),
        target(
            f"  lanes vs global, one per request, pipeline {depth}",
            f"per-SKU lanes events/s / global order events/s, default pipelining, {stall}",
            lanes_ratio("single", "_pipelined"),
            5.0,
            ">=",
            lanes,
            reference=True,
        ),
        target(
            "lanes vs global, slow sink, batches",
            f"per-SKU lanes events/s / global order events/s, one in flight per line, {stall}",
            lanes_ratio("batch", ""),
            5.0,
            ">=",
            lanes,
        ),
        target(
            f"  lanes vs global, batches, pipeline {depth}",
            f"per-SKU lanes events/s / global order events/s, default pipelining, {stall}",
            lanes_ratio("batch", "_pipelined"),
            5.0,
            ">=",
            lanes,
            reference=True,
        ),
        target(
            "intake p99, sink stalled vs idle",
            "POST /orders p99 while the sink stalls 2 s / p99 while idle",
            _ratio(
                _figure(results, "intake_latency", "stalled", "p99_ms"),
                _figure(results, "intake_latency", "idle", "p99_ms"),
            ),
            2.0,
            "<=",
            ("intake_latency",),
        ),
        target(
            "pending(16), big vs small outbox",
            f"median time at {big_rows:,} sent rows / at {small_rows:,}",
            _ratio(
                _figure(results, "scaling", "pending16_ms", 1),
                _figure(results, "scaling", "pending16_ms", 0),
            ),
            1.5,
            "<=",
            ("scaling",),
        ),
        target(
            "metrics scrape, big vs small outbox",
            f"median time at {big_rows:,} sent rows / at {small_rows:,}",
            _ratio(
                _figure(results, "scaling", "scrape_ms", 1),
                _figure(results, "scaling", "scrape_ms", 0),
            ),
            1.5,
            "<=",
            ("scaling",),
        ),
        target(
            "throughput, big vs small backlog",
            f"events/s from a backlog of {big_backlog:,} / from {small_backlog:,}",
            _ratio(
                _figure(results, "scaling", "events_per_s", 2),
                _figure(results, "scaling", "events_per_s", 0),
            ),
            0.8,
            ">=",
            ("scaling",),
        ),
        target(
            "peak RSS, big vs small backlog",
            f"MiB above: draining {big_mem:,} minus draining {small_mem:,}",
            rss_growth,
            RSS_BUDGET_MIB,
            "<=",
            ("memory",),
            unit="MiB",
        ),
        *postgres,
        *worker_targets(results, target),
        *e2e_targets(results, target, ""),
        *e2e_targets(results, target, "pg_"),
    ]


# End to end: single-order intake vs the trivial handler's ceilings; bulk intake vs the
# 8-client one; the wait from a 201 to the sink's application at half the maximum load.
E2E_SINGLE_VS_8: Final = 0.35
E2E_SINGLE_VS_1: Final = 1.0
E2E_BULK_VS_8: Final = 1.0
E2E_P99_MS: Final = 50.0
E2E_P50_MS: Final = 10.0


def e2e_targets(
    results: dict[str, Figures], target: Callable[..., Target], prefix: str
) -> list[Target]:
    """The end-to-end targets of one backend: `prefix` "" for SQLite, "pg_" for PostgreSQL."""
    where = "PostgreSQL: " if prefix else ""
    single, bulk, latency = f"{prefix}e2e_single", f"{prefix}e2e_bulk", f"{prefix}e2e_latency"
    ceilings = {k: _figure(results, "e2e_ceiling", f"round_trips_per_s_{k}") for k in (1, 8)}
    rate = _figure(results, single, "events_per_s")
    reach = {c: _figure(results, c, "cpu_bound_per_s") for c in (single, bulk)}
    load = f"paced at {e2e.LOAD_SHARE:g}x the e2e maximum, healthy sink"
    return [
        target(
            f"{where}e2e, POST /orders vs 8-client ceiling",
            f"{single} events/s (8 clients, until applied and marked) / e2e_ceiling "
            "8-client round trips/s",
            _ratio(rate, ceilings[8]),
            E2E_SINGLE_VS_8,
            ">=",
            (single, "e2e_ceiling"),
            reach=_ratio(reach[single], ceilings[8]),
        ),
        target(
            f"{where}e2e, POST /orders vs 1-client ceiling",
            f"{single} events/s / e2e_ceiling 1-client round trips/s",
            _ratio(rate, ceilings[1]),
            E2E_SINGLE_VS_1,
            ">=",
            (single, "e2e_ceiling"),
            reach=_ratio(reach[single], ceilings[1]),
        ),
        target(
            f"{where}e2e, bulk intake vs 8-client ceiling",
            f"{bulk} events/s (POST /orders/batch of {e2e.BULK_BATCH}) / e2e_ceiling "
            "8-client round trips/s",
            _ratio(_figure(results, bulk, "events_per_s"), ceilings[8]),
            E2E_BULK_VS_8,
            ">=",
            (bulk, "e2e_ceiling"),
            reach=_ratio(reach[bulk], ceilings[8]),
        ),
        target(
            f"{where}201 to applied at the sink, p99",
            f"{latency}: {load}",
            _figure(results, latency, "idle", "p99_ms"),
            E2E_P99_MS,
            "<=",
            (latency,),
            unit="ms",
        ),
        target(
            f"{where}201 to applied at the sink, p50",
            f"{latency}: {load}",
            _figure(results, latency, "idle", "p50_ms"),
            E2E_P50_MS,
            "<=",
            (latency,),
            unit="ms",
        ),
    ]


def worker_targets(results: dict[str, Figures], target: Callable[..., Target]) -> list[Target]:
    """pg_workers: 4 workers against 1, duplicates without faults, failover time."""
    case = ("pg_workers",)
    bound = _figure(results, "pg_workers", "failover_bound_s") or workers.FAILOVER_BOUND_S
    return [
        target(
            "PostgreSQL workers: 4 vs 1, SKU order",
            "pg_workers events/s with 4 workers / with 1 (64 SKUs, sink stall 5 ms, one "
            "event per request); 'not slower', less 10% for run-to-run noise",
            _ratio(
                _figure(results, "pg_workers", "events_per_s_4"),
                _figure(results, "pg_workers", "events_per_s_1"),
            ),
            WORKERS_NOT_SLOWER,
            ">=",
            case,
        ),
        target(
            "PostgreSQL workers: duplicate deliveries, no faults",
            "inbox deliveries beyond the first, all six pg_workers drains",
            _figure(results, "pg_workers", "duplicates"),
            0.0,
            "<=",
            case,
            unit="",
        ),
        target(
            "PostgreSQL workers: failover after a SIGKILL",
            f"SIGKILL of a worker -> first ACK of its lanes by another (bound: lease TTL "
            f"{workers.LEASE_TTL_S:g} s + 2 s)",
            _figure(results, "pg_workers", "failover_s"),
            bound,
            "<=",
            case,
            unit="s",
        ),
    ]


# ---------------------------------------------------------------- the table


def render(report: dict[str, Any], targets: list[Target]) -> str:
    results: dict[str, Figures] = report["cases"]
    machine = report["machine"]
    postgresql = f", PostgreSQL {machine['postgresql']}" if machine.get("postgresql") else ""
    lines = [
        f"outbox relay benchmark, {report['mode']} mode"
        f"{' (profiled: rates not comparable)' if report.get('profiled') else ''}, "
        f"{report['duration_s']:.0f}s: "
        f"{machine['cpus_usable']} CPUs, Python {machine['python']}, SQLite {machine['sqlite']}"
        f"{postgresql}, "
        f"load {machine['load_average_start'][0]:.2f} -> {machine['load_average_end'][0]:.2f}",
        "",
        f"{'case':<22} figures",
    ]
    for name, figures in results.items():
        if "error" in figures:
            text = f"FAILED: {figures['error']}"
        elif figures.get("available") is False:
            text = f"not available: {figures.get('reason')}"
        else:
            text = _describe(name, figures, results)
        lines.append(f"{name:<22} {text}")
        for process, seen in figures.get("profile", {}).items():
            lines.append(f"{'':<22}   {_profiled(process, seen, figures)}")
    lines += ["", f"{'target':<52} {'measured':>10} {'target':>10}  result"]
    for t in targets:
        measured = "-" if t.measured is None else f"{t.measured:.2f}{t.unit}"
        goal = f"{t.comparison} {t.target:g}{t.unit}"
        result = {True: "met", False: "missed", None: "not measured"}[t.met]
        if t.reference:
            result = "reference" if t.measured is not None else "not measured"
        if t.met is False and t.reach is not None and t.reach < t.target:
            result += f": out of reach, its CPU per event allows {t.reach:.2f}{t.unit} here"
        lines.append(f"{t.name:<52} {measured:>10} {goal:>10}  {result}")
        lines.append(f"    {t.detail}" + (f" ({t.why_not})" if t.why_not else ""))
    return "\n".join(lines)


def _profiled(process: str, seen: Figures, figures: Figures) -> str:
    """One line of a --profile summary: a process's areas, or the server's statements."""
    if process != "postgres":
        areas = ", ".join(f"{a} {share:.0%}" for a, share in list(seen["areas"].items())[:8])
        return f"py-spy {process} ({seen['samples']:,} samples): {areas}"
    total = seen["statement_ms"]
    timed = [(q, q["exec_ms"] + q["plan_ms"]) for q in seen["top_statements"][:3]]
    top = ", ".join(
        f"{q['database']} {ms / total:.0%} (plan {q['plan_ms'] / ms:.0%}) {q['query'][:40]}..."
        for q, ms in timed
        if ms > 0
    )
    return (
        f"pg_stat_statements: {total / figures['orders']:.3f} ms in statements per order "
        f"({seen['calls']:,} calls)" + (f"; {top}" if top else "")
    )


def _x(a: float | None, b: float | None) -> str:
    ratio = _ratio(a, b)
    return "?" if ratio is None else f"{ratio:.2f}x"


def _breakdown(f: Figures) -> str:
    return (
        f"per event {f['ms_per_event']:.3f} ms = {f['ms_per_event_in_requests']:.3f} in "
        f"requests + {f['ms_per_event_elsewhere']:.3f} elsewhere"
    )


def _describe(name: str, f: Figures, results: dict[str, Figures]) -> str:
    ceiling = _figure(results, "ceiling", "round_trips_per_s")
    naive = _figure(results, "naive_peer", "events_per_s")
    if name == "ceiling":
        return (
            f"{f['round_trips_per_s']:,.0f} round trips/s ({f['requests']:,} sequential); "
            f"batches of 16 to the same server: {f['batch_events_per_s']:,.0f} events/s"
        )
    if name == "commit_ceiling":
        return f"{f['commits_per_s']:,.0f} durable commits/s ({f['commits']:,})"
    if name == "pg_commit_ceiling":
        settings = f.get("settings") or {}
        return (
            f"{f['commits_per_s']:,.0f} durable commits/s ({f['commits']:,}; fsync "
            f"{settings.get('fsync')}, synchronous_commit {settings.get('synchronous_commit')}, "
            f"{settings.get('wal_sync_method')})"
        )
    if name.startswith("pg_relay_"):
        pg_commits = _figure(results, "pg_commit_ceiling", "commits_per_s")
        sqlite = _figure(results, name.removeprefix("pg_"), "events_per_s")
        flight = f"up to {f['pipeline']} in flight" if f["pipeline"] > 1 else "one in flight"
        return (
            f"{f['events_per_s']:,.0f} events/s (backlog {f['backlog']:,}, {flight}) = "
            f"{_x(f['events_per_s'], ceiling)} ceiling, {_x(f['events_per_s'], pg_commits)} "
            f"PostgreSQL commit ceiling, {_x(f['events_per_s'], sqlite)} SQLite"
            + ("; " + _breakdown(f) if f["pipeline"] == 1 else "")
        )
    if name == "naive_peer":
        return f"{f['events_per_s']:,.0f} events/s (backlog {f['backlog']:,})"
    if name == "pg_workers":
        rates = ", ".join(
            f"{k} workers {f[f'events_per_s_{k}']:,.0f}" for k in workers.WORKER_COUNTS
        )
        cpu = ", ".join(
            f"{f.get(f'cpu_s_per_1k_workers_{k}', math.nan):.2f}"
            f" + {f.get(f'cpu_s_per_1k_sink_{k}', math.nan):.2f}"
            for k in workers.WORKER_COUNTS
        )
        return (
            f"{rates} events/s (2 x {f['backlog_per_run']:,} each, {f['skus']} SKUs, 5 ms "
            f"sink, one per request); CPU s per 1,000 (workers + sink) {cpu}; "
            f"{f['duplicates']} duplicates; failover "
            f"{f['failover_s']:.2f} s (lease TTL {f['lease_ttl_s']:g} s)"
        )
    if name == "relay_single":
        return (
            f"{f['events_per_s']:,.0f} events/s (backlog {f['backlog']:,}, "
            f"up to {f['pipeline']} in flight) = "
            f"{_x(f['events_per_s'], ceiling)} ceiling, {_x(f['events_per_s'], naive)} naive peer"
        )
    if name == "relay_batch":
        return (
            f"{f['events_per_s']:,.0f} events/s (backlog {f['backlog']:,}, "
            f"up to {f['pipeline']} in flight) = {_x(f['events_per_s'], ceiling)} ceiling"
        )
    if name in ("relay_single_serial", "relay_batch_serial"):
        return (
            f"{f['events_per_s']:,.0f} events/s (backlog {f['backlog']:,}, "
            f"one request in flight) = {_x(f['events_per_s'], ceiling)} ceiling; " + _breakdown(f)
        )
    if name == "relay_lanes":
        parts = []
        for delivery, label in (("single", "one/request"), ("batch", "batches")):
            for suffix, depth in (("", "one in flight"), ("_pipelined", "pipelined")):
                g = f[f"{delivery}_global{suffix}_events_per_s"]
                lane = f[f"{delivery}_lanes{suffix}_events_per_s"]
                parts.append(
                    f"{label}, {depth}: global {g:,.0f}, lanes {lane:,.0f} events/s = {_x(lane, g)}"
                )
        runs = f"2 x {f['backlog_per_run']:,} per mode"
        return f"{runs}, 5 ms sink, 8 SKUs; " + "; ".join(parts)
    if name == "intake_latency":
        idle, stalled = f["idle"], f["stalled"]
        return (
            f"healthy sink p50 {idle['p50_ms']:.1f} / p99 {idle['p99_ms']:.1f} ms; "
            f"sink stalled p50 {stalled['p50_ms']:.1f} / p99 {stalled['p99_ms']:.1f} ms "
            f"= {_x(stalled['p99_ms'], idle['p99_ms'])} ({f['requests']} requests each)"
        )
    if name.removeprefix("pg_").startswith("e2e_"):
        return _describe_e2e(name, f, results)
    if name == "scaling":
        small, big = f["sent_rows"]
        few, many = f["lanes_skus"]
        pending, scrape, rates = f["pending16_ms"], f["scrape_ms"], f["events_per_s"]
        backlogs = "/".join(f"{b:,}" for b in f["backlogs"])
        return (
            f"pending(16) {pending[0]:.3f} -> {pending[1]:.3f} ms ({_x(pending[1], pending[0])}), "
            f"scrape {scrape[0]:.3f} -> {scrape[1]:.3f} ms ({_x(scrape[1], scrape[0])}) "
            f"at {small:,} -> {big:,} sent rows; throughput from {backlogs}: "
            + " / ".join(f"{r:,.0f}" for r in rates)
            + f" events/s ({_x(rates[2], rates[0])}); lanes draining "
            + f"{f['lanes_backlog']:,} over {few} / {many:,} SKUs: "
            + f"{f[f'lanes_events_per_s_{few}_skus']:,.0f} / "
            + f"{f[f'lanes_events_per_s_{many}_skus']:,.0f} events/s"
        )
    if name == "memory":
        small, big = f["backlogs"]
        low, high = f["peak_rss_mib"]
        return (
            f"peak RSS {low:.1f} MiB draining {small:,}, {high:.1f} MiB draining {big:,} "
            f"(+{high - low:.1f} MiB)"
        )
    return json.dumps(f)


def _describe_e2e(name: str, f: Figures, results: dict[str, Figures]) -> str:
    ceilings = [_figure(results, "e2e_ceiling", f"round_trips_per_s_{k}") for k in (1, 8)]
    # Intake makes every order durable: the backend's commit ceiling too, when it ran.
    commit_case = "pg_commit_ceiling" if name.startswith("pg_") else "commit_ceiling"
    commits = _figure(results, commit_case, "commits_per_s")

    def against(rate: float) -> str:
        text = f"{_x(rate, ceilings[0])} 1-client, {_x(rate, ceilings[1])} 8-client ceiling"
        return text + (f", {_x(rate, commits)} commit ceiling" if commits else "")

    def cpu() -> str:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in f["cpu_share"].items())
        text = f"CPU {shares}; {f['cpu_ms_per_order']:.2f} ms CPU per order in all"
        trip = _figure(results, "e2e_ceiling", "cpu_ms_per_round_trip_8")
        if trip:  # at the ceiling's CPU use, the ratio to it can reach 1 / this at most
            text += f" = {_x(f['cpu_ms_per_order'], trip)} an 8-client ceiling round trip's"
        bound = f["cpu_bound_per_s"]
        return text + (
            f", at most {bound:,.0f}/s with all {f['cpus']} CPUs busy "
            f"({_x(bound, ceilings[1])} 8-client ceiling)"
        )

    def waits(w: Figures) -> str:
        return f"p50 {w['p50_ms']:.1f} / p99 {w['p99_ms']:.1f} / max {w['max_ms']:.1f} ms"

    case = name.removeprefix("pg_")
    if case == "e2e_ceiling":
        used = [
            f"{k} client{'s' if k > 1 else ''} {f[f'cpu_ms_per_round_trip_{k}']:.2f} ms "
            f"({sum(f[f'cpu_share_{k}'].values()):.2f} CPUs busy)"
            for k in (1, 8)
        ]
        return (
            f"trivial handler: 1 client {f['round_trips_per_s_1']:,.0f}, 8 clients "
            f"{f['round_trips_per_s_8']:,.0f} round trips/s ({f['requests']:,} each); "
            f"CPU per round trip, clients and server together: {used[0]}, {used[1]}"
        )
    if case == "e2e_intake":
        return (
            f"POST /orders alone, sink stopped: {f['orders_per_s']:,.0f} orders/s "
            f"({f['orders']:,}, 8 clients) = {against(f['orders_per_s'])}; {cpu()}"
        )
    if case in ("e2e_single", "e2e_bulk"):
        how = "POST /orders" if case == "e2e_single" else f"POST /orders/batch of {f['batch']}"
        text = (
            f"{f['events_per_s']:,.0f} events/s until applied and marked ({f['orders']:,} "
            f"orders, {how}, 8 clients; the answers at {f['intake_orders_per_s']:,.0f}/s) = "
            f"{against(f['events_per_s'])}; {cpu()}"
        )
        if case == "e2e_single":
            text += f"; 201 to applied at this load {waits(f['latency_at_full_load'])}"
        return text
    return (
        f"at {f['offered_per_s']:,.0f} orders/s offered ({f['orders']:,}): healthy sink "
        f"{waits(f['idle'])}; sink stopped {f['stall_s']:g} s: {waits(f['stalled'])}"
    )
