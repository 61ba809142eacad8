"""`python -m chaos run --backend postgres --workers K --sinks M --pauses P`: a short
run of several workers and sinks, killed, paused and with a PostgreSQL restart, fed
orders and generic events, read back through its report and the databases; and the
options it refuses (in test_pg_chaos_options.py, with the other PostgreSQL options)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_module
from test_chaos import leftovers

from chaos.feed import ACCOUNTS
from chaos.run import MANY_SKUS, plan_pauses

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 150.0


def test_the_pause_plan_is_the_seeds_and_about_half_outlast_the_lease() -> None:
    plan = plan_pauses(3, 2_000, 400, "both", 2.0)

    assert plan == plan_pauses(3, 2_000, 400, "both", 2.0)
    assert len(plan) == 400 and {kind for kind, _ in plan.values()} == {"publisher", "sink"}
    seconds = [s for _, s in plan.values()]
    assert min(seconds) >= 0.2 and max(seconds) <= 4.0
    assert 0.3 < sum(s > 2.0 for s in seconds) / len(seconds) < 0.7
    assert {kind for kind, _ in plan_pauses(3, 50, 10, "sink", 2.0).values()} == {"sink"}


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.usefixtures("pg_server")  # no PostgreSQL here: a skip, or a failure under CI
def test_workers_and_sinks_killed_and_paused_lose_nothing_and_keep_key_order(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    workdir = tmp_path / "run"
    args = ["--events", "160", "--kills", "6", "--pauses", "8", "--pg-restarts", "1"]
    args += ["--workers", "3", "--sinks", "2", "--ordering", "key", "--seed", "4"]
    args += ["--events-mix", "mixed"]

    done = run_module(
        "chaos", "run", "--backend", "postgres", *args, "--json", "--workdir", str(workdir),
        env=child_env, cwd=tmp_path, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert figures["ok"] is True and figures["drained"] is True, figures
    assert (figures["lost"], figures["applied_twice"], figures["order_inversions"]) == (0, 0, 0)
    assert (figures["payload_mismatches"], figures["unknown"]) == (0, 0)
    assert 0 < figures["generic"] < 160 and figures["events_mix"] == "mixed"
    assert (figures["workers"], figures["sinks"], figures["lease_ttl_s"]) == (3, 2, 2.0)
    assert figures["accepted"] == figures["delivered"] == 160
    assert figures["pauses"] == sum(figures["pauses_by_service"].values()) >= 1
    assert set(figures["pauses_by_service"]) <= {"w1", "w2", "w3", "sink-1", "sink-2"}
    assert (
        figures["all_faults"]
        == (figures["faults"] + figures["pauses"] + figures["pg_restarts"])
        >= 6
    )
    assert set(figures["exit_statuses"]) == {"w1", "w2", "w3", "sink-1", "sink-2"}
    # Per key at the sink: every key of the run its own line (SKUs, the accounts, and
    # "*" for events without a key), none reordered.
    lines = figures["lines"]
    assert set(lines) <= {*MANY_SKUS, *ACCOUNTS, "*"} and len(lines) >= 8
    assert "*" in lines and set(ACCOUNTS) <= set(lines)
    assert sum(line["applied"] for line in lines.values()) == 160
    assert all(line["inversions"] == 0 for line in lines.values()), lines
    # Each worker's log counts what it delivered; all of them add up to every entry.
    delivered = figures["delivered_by_worker"]
    assert set(delivered) == {"w1", "w2", "w3"}
    assert sum(delivered.values()) >= 160
    assert set(figures["lease_epochs"]) == set(lines)
    assert set(figures["fence_counters"]) >= {
        "publisher_fenced_writes_total",
        "sink_fenced_requests_total",
    }
    assert set(figures["fencing_in_logs"]) == {
        "worker_lines_lost",
        "worker_fenced_deliveries",
        "sink_stale_refusals",
    }
    for name in ("w1", "w2", "w3"):
        assert (workdir / f"publisher-{name}.log").exists()
    assert leftovers(workdir) == []
