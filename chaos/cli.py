"""`python -m chaos`: break the two services on purpose and read what the databases show.

`--backend postgres` runs both services on PostgreSQL: on a throwaway server the run
starts and removes, or, with `--db-url`, in fresh schemas of the operator's database
(the password from PGPASSWORD or a .pgpass file, never from the command line).

Exit status: 0 when the verdict holds, 1 on any violation, 2 on bad usage or a run
that could not be carried out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from chaos.dbs import BACKENDS, Place, open_place
from chaos.feed import MIXES
from chaos.handlers import SPEC as EFFECTS_SPEC
from chaos.procs import ChaosError
from chaos.run import run
from chaos.scenarios import SCENARIOS, Outcome
from plumbing.cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ArgumentParser,
    fail,
    int_in,
    positive_s,
    strict_int,
)

PROG: Final = "chaos"
MAX_EVENTS: Final = 100_000
MAX_PG_RESTARTS: Final = 1_000
MAX_WORKERS: Final = 16
MAX_SINKS: Final = 8
MAX_LEASE_TTL_S: Final = 60.0
TIME_LIMIT_S: Final = 3600.0


def add_backend_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="sqlite",
        help="where both services keep their data: SQLite files, or PostgreSQL",
    )
    parser.add_argument(
        "--db-url",
        metavar="URL",
        help="with --backend postgres: a postgresql:// URI of a database to make fresh "
        "schemas in (default: a throwaway server of the run's own); no password in it",
    )


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog=PROG, description="Kill the services on purpose; count what survived."
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    go = commands.add_parser("run", help="feed events while killing the services at random moments")
    go.add_argument(
        "--events", type=int_in(1, MAX_EVENTS), default=200, help="events to feed (--events-mix)"
    )
    go.add_argument(
        "--events-mix",
        choices=MIXES,
        default="orders",
        help="orders: orders only (POST /orders); generic: events of several types, keyed "
        "or not, with nested unicode and float data (POST /events, /events/batch); "
        "mixed: both, about half each (default: orders)",
    )
    go.add_argument(
        "--handlers",
        metavar="MODULE:ATTR",
        help="the sinks' handler registry (python -m sink --handlers); "
        f"{EFFECTS_SPEC} keeps the inventory and one row per applied event, which the "
        "verdict counts (none: lost, two: applied twice); with any other registry but "
        "the default warehouse, the inventory is not checked",
    )
    go.add_argument("--kills", type=int_in(0, MAX_EVENTS), default=5, help="kills during the feed")
    go.add_argument("--seed", type=strict_int, default=1, help="random seed (same seed, same plan)")
    go.add_argument(
        "--target",
        choices=["publisher", "sink", "both"],
        default="both",
        help="which service the kills may hit",
    )
    go.add_argument(
        "--ordering",
        choices=["global", "key", "sku"],
        default="global",
        help="the publisher's ordering (sku: the former name of key); the verdict checks "
        'order in the same lines: one, or one per event key ("*" for events without one)',
    )
    go.add_argument(
        "--delivery", choices=["batch", "single"], default="batch", help="the publisher's delivery"
    )
    go.add_argument(
        "--drain-timeout", type=positive_s, default=120.0, help="seconds to wait for the backlog"
    )
    go.add_argument(
        "--time-limit",
        type=positive_s,
        default=TIME_LIMIT_S,
        help="seconds the whole run may take; beyond it the run stops (exit status 2)",
    )
    go.add_argument(
        "--workdir", type=Path, help="keep the DB files and logs here (default: a temp dir)"
    )
    go.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    add_backend_options(go)
    go.add_argument(
        "--pg-restarts",
        type=int_in(0, MAX_PG_RESTARTS),
        default=0,
        help="with --backend postgres and no --db-url: stop the server (fast or immediate) "
        "this many times during the feed and start it again",
    )
    go.add_argument(
        "--workers",
        type=int_in(1, MAX_WORKERS),
        default=1,
        help="relay workers on the one outbox (more than one: --backend postgres)",
    )
    go.add_argument(
        "--sinks",
        type=int_in(1, MAX_SINKS),
        default=1,
        help="sink processes on the one inbox, every worker given all their URLs "
        "(more than one: --backend postgres)",
    )
    go.add_argument(
        "--pauses",
        type=int_in(0, MAX_EVENTS),
        default=0,
        help="SIGSTOP a process of the --target at random this many times during the feed, "
        "each for 0.1 to 2 lease TTLs, then SIGCONT it",
    )
    go.add_argument(
        "--lease-ttl",
        type=positive_s,
        default=2.0,
        help="the workers' --lease-ttl, seconds: how long a killed or paused worker's lines"
        " wait before another worker takes them",
    )
    story = commands.add_parser("scenario", help="run named scenarios, each with its own verdict")
    story.add_argument(
        "names",
        nargs="+",
        choices=[*SCENARIOS, "all"],
        metavar="NAME",
        help=f"one or more of {', '.join(SCENARIOS)}, or all",
    )
    story.add_argument("--workdir", type=Path, help="keep the DB files and logs here")
    story.add_argument("--json", action="store_true", help="one JSON object per scenario")
    add_backend_options(story)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="outbox-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    keep = args.workdir is not None
    place: Place | None = None
    try:
        if args.backend == "sqlite" and args.db_url is not None:
            return fail(PROG, "--db-url is for --backend postgres", EXIT_USAGE)
        if getattr(args, "pg_restarts", 0) and (args.backend, args.db_url) != ("postgres", None):
            return fail(
                PROG, "--pg-restarts needs --backend postgres on its own server (no --db-url)",
                EXIT_USAGE,
            )  # fmt: skip
        several = getattr(args, "workers", 1) > 1 or getattr(args, "sinks", 1) > 1
        if several and args.backend != "postgres":
            return fail(PROG, "--workers and --sinks above 1 need --backend postgres", EXIT_USAGE)
        if getattr(args, "lease_ttl", 0) > MAX_LEASE_TTL_S:
            return fail(PROG, f"--lease-ttl is at most {MAX_LEASE_TTL_S:g} s", EXIT_USAGE)
        place = open_place(args.backend, args.db_url, keep=keep)
        if args.command == "run":
            return cmd_run(args, workdir, place)
        return cmd_scenario(args, workdir, place)
    except ChaosError as exc:
        keep = True  # the message points at the logs: they must still be there
        return fail(PROG, f"{exc} (files and logs kept in {workdir})", EXIT_USAGE)
    except KeyboardInterrupt:
        return fail(PROG, "interrupted", EXIT_USAGE)
    finally:
        if place is not None:
            place.close()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def cmd_run(args: argparse.Namespace, workdir: Path, place: Place) -> int:
    if not args.json:
        print(f"[chaos] databases: {place.describe()}", file=sys.stderr, flush=True)
    report = run(
        workdir,
        args.events,
        args.kills,
        args.seed,
        args.target,
        args.drain_timeout,
        progress=not args.json,
        ordering=args.ordering,
        delivery=args.delivery,
        time_limit_s=args.time_limit,
        databases=place.pair("run", workdir),
        pg_restarts=args.pg_restarts,
        pg_server=getattr(place, "server", None),
        workers=args.workers,
        sinks=args.sinks,
        pauses=args.pauses,
        lease_ttl_s=args.lease_ttl,
        events_mix=args.events_mix,
        handlers=args.handlers,
    )
    figures = report.to_dict()
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            shown = json.dumps(value) if isinstance(value, dict | list) else value
            print(f"{key:<22} {shown}")
        verdict = "OK" if figures["ok"] else "VIOLATION"
        generic = figures["generic"]
        print(
            f"\n{verdict}: {figures['accepted']} accepted"
            + (f" ({generic} of them not orders)" if generic else "")
            + f", {figures['delivered']} delivered, "
            f"{figures['resends']} resends absorbed, {figures['lost']} lost, "
            f"{figures['applied_twice']} applied twice, "
            f"{figures['payload_mismatches']} payloads differing, {figures['unknown']} unknown, "
            f"{figures['order_inversions']} order inversions ({figures['ordering']} order)"
            + (f" on {figures['backend']}" if figures["backend"] != "sqlite" else "")
            + (
                f", {figures['workers']} workers, {figures['sinks']} sinks, "
                f"{figures['all_faults']} faults"
                if args.workers > 1 or args.sinks > 1
                else ""
            )
        )
    return EXIT_OK if figures["ok"] else EXIT_FAILED


def cmd_scenario(args: argparse.Namespace, workdir: Path, place: Place) -> int:
    names = list(SCENARIOS) if "all" in args.names else list(dict.fromkeys(args.names))
    quiet = args.json

    def say(line: str) -> None:
        if not quiet:
            print(line, flush=True)

    say(f"databases: {place.describe()}\n")
    outcomes: list[Outcome] = []
    for name in names:
        scenario_dir = workdir / name
        shutil.rmtree(scenario_dir, ignore_errors=True)
        scenario_dir.mkdir(parents=True)
        outcome = SCENARIOS[name](scenario_dir, say, place.pair(name, scenario_dir))
        outcomes.append(outcome)
        if quiet:
            print(json.dumps(outcome.to_dict()), flush=True)
        else:
            print(f"{name}: {'OK' if outcome.ok else 'VIOLATION'}: {outcome.result}\n", flush=True)
    return EXIT_OK if all(o.ok for o in outcomes) else EXIT_FAILED
