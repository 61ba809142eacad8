"""The chaos runner's kill plan and its command line, without starting anything."""

from __future__ import annotations

import random

import pytest

from chaos.cli import TIME_LIMIT_S, build_parser, main
from chaos.procs import ChaosError
from chaos.run import KILLS_BY_TARGET, Deadline, RunReport, plan_kills
from chaos.scenarios import SCENARIOS
from chaos.verdict import Verdict

PUBLISHER_KINDS = {"publisher:sigkill", "publisher:exit-after-ack"}
SINK_KINDS = {"sink:sigkill", "sink:exit-after-commit"}


def plan(seed: int, events: int, kills: int, target: str) -> dict[int, str]:
    return plan_kills(random.Random(seed), events, kills, target)  # type: ignore[arg-type]


def test_kill_kinds_are_the_documented_ones() -> None:
    assert set(KILLS_BY_TARGET["publisher"]) == PUBLISHER_KINDS
    assert set(KILLS_BY_TARGET["sink"]) == SINK_KINDS


@pytest.mark.parametrize("target", ["publisher", "sink", "both"])
@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_same_seed_same_plan(seed: int, target: str) -> None:
    first = plan(seed, 200, 20, target)
    assert first == plan(seed, 200, 20, target)
    assert len(first) == 20


def test_different_seeds_give_different_plans() -> None:
    plans = {tuple(plan(seed, 500, 10, "both").items()) for seed in range(10)}
    assert len(plans) == 10


def test_the_plan_continues_the_rng_deterministically() -> None:
    """The run draws orders from the same generator after the plan: it must be in step."""
    rng_a, rng_b = random.Random(3), random.Random(3)
    assert plan_kills(rng_a, 50, 5, "both") == plan_kills(rng_b, 50, 5, "both")
    assert [rng_a.random() for _ in range(5)] == [rng_b.random() for _ in range(5)]


@pytest.mark.parametrize("seed", range(20))
def test_publisher_target_only_kills_the_publisher(seed: int) -> None:
    kinds = set(plan(seed, 100, 30, "publisher").values())
    assert kinds <= PUBLISHER_KINDS


@pytest.mark.parametrize("seed", range(20))
def test_sink_target_only_kills_the_sink(seed: int) -> None:
    kinds = set(plan(seed, 100, 30, "sink").values())
    assert kinds <= SINK_KINDS


def test_each_target_uses_all_of_its_kinds() -> None:
    assert set(plan(1, 1000, 200, "publisher").values()) == PUBLISHER_KINDS
    assert set(plan(1, 1000, 200, "sink").values()) == SINK_KINDS
    assert set(plan(1, 1000, 200, "both").values()) == PUBLISHER_KINDS | SINK_KINDS


@pytest.mark.parametrize(
    ("events", "kills", "expected"),
    [(1, 0, 0), (1, 5, 0), (2, 1, 1), (2, 5, 1), (10, 9, 9), (10, 10, 9), (10, 100, 9)],
)
def test_never_more_kills_than_events_minus_one(events: int, kills: int, expected: int) -> None:
    points = plan(7, events, kills, "both")
    assert len(points) == expected
    assert all(1 <= point < events for point in points), points


def test_kill_points_are_distinct_and_sorted() -> None:
    points = list(plan(11, 100, 40, "both"))
    assert points == sorted(set(points))


def test_no_kills_asked_no_kills_planned() -> None:
    assert plan(7, 100, 0, "both") == {}


# ---------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--events", "0"],
        ["run", "--events", "-3"],
        ["run", "--events", "ten"],
        ["run", "--kills", "-1"],
        ["run", "--kills", "1.5"],
        ["run", "--target", "everything"],
        ["run", "--seed", "x"],
        ["run", "--ordering", "lanes"],
        ["run", "--delivery", "both"],
        ["run", "--time-limit", "0"],
        ["run", "--time-limit", "-5"],
        ["run", "--time-limit", "inf"],
        ["run", "--time-limit", "nan"],
        ["run", "--drain-timeout", "nan"],
        ["run", "--drain-timeout", "0"],
        ["scenario", "no-such-scenario"],
        ["scenario", "crash-after-ack", "no-such-scenario"],
        ["scenario"],
        [],
        ["explode"],
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("chaos")


def test_the_events_error_names_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--events", "0"])
    assert "--events" in capsys.readouterr().err


def test_good_usage_parses() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["run", "--events", "60", "--kills", "6", "--seed", "7", "--target", "sink", "--json"]
    )
    assert (args.events, args.kills, args.seed, args.target, args.json) == (60, 6, 7, "sink", True)
    args = parser.parse_args(["run", "--kills", "0"])
    assert args.kills == 0
    assert (args.ordering, args.delivery, args.time_limit) == ("global", "batch", TIME_LIMIT_S)
    args = parser.parse_args(
        ["run", "--ordering", "sku", "--delivery", "single", "--time-limit", "900"]
    )
    assert (args.ordering, args.delivery, args.time_limit) == ("sku", "single", 900.0)
    args = parser.parse_args(["run", "--events", "5000", "--kills", "1000"])
    assert (args.events, args.kills) == (5000, 1000)
    args = parser.parse_args(["scenario", *SCENARIOS, "--json"])
    assert args.names == list(SCENARIOS)
    assert args.json is True
    assert parser.parse_args(["scenario", "all"]).names == ["all"]


def test_scenario_names_are_the_four_stories() -> None:
    assert set(SCENARIOS) == {"crash-after-ack", "drop-after-commit", "poison-head", "slow-sink"}


def test_a_soak_sized_plan_keeps_every_kill() -> None:
    kills = plan(1, 5000, 1000, "both")
    assert len(kills) == 1000
    assert set(kills.values()) == PUBLISHER_KINDS | SINK_KINDS


# ---------------------------------------------------------------- report and time bound


def clean_verdict(**changes: object) -> Verdict:
    figures: dict[str, object] = {
        "accepted": 10,
        "delivered": 10,
        "resends": 2,
        "duplicates": 1,
        "lost": 0,
        "applied_twice": 0,
        "inventory_ok": True,
        "pending": 0,
        "quarantined": 0,
        "order_inversions": 0,
        "ordering": "sku",
    }
    return Verdict(**{**figures, **changes})  # type: ignore[arg-type]


def report(verdict: Verdict, drained: bool = True) -> RunReport:
    return RunReport(
        verdict=verdict,
        kills=["sink:sigkill", "publisher:exit-after-ack", "sink:sigkill"],
        sigkills={"publisher": 1, "sink": 1},
        chaos_exits={"publisher": 1, "sink": 0},
        restarts=4,
        exit_statuses={"publisher": {"-9": 1, "0": 1, "73": 1}, "sink": {"-9": 1, "0": 1}},
        drained=drained,
        elapsed_s=1.234,
        delivery="single",
    )


def test_the_report_counts_kills_by_kind_and_faults() -> None:
    figures = report(clean_verdict()).to_dict()

    assert figures["kills"] == 3
    assert figures["kill_kinds"] == ["publisher:exit-after-ack", "sink:sigkill"]
    assert figures["kills_by_kind"] == {"publisher:exit-after-ack": 1, "sink:sigkill": 2}
    assert figures["chaos_exits"] == 1
    assert figures["faults"] == 3  # two SIGKILLs that found a live process, one exit
    assert (figures["restarts"], figures["elapsed_s"]) == (4, 1.23)
    assert figures["exit_statuses"] == {
        "publisher": {"-9": 1, "0": 1, "73": 1},
        "sink": {"-9": 1, "0": 1},
    }
    assert (figures["ordering"], figures["delivery"]) == ("sku", "single")
    assert (figures["order_inversions"], figures["ok"]) == (0, True)


def test_an_inversion_or_an_undrained_backlog_is_not_ok() -> None:
    assert report(clean_verdict(order_inversions=1)).to_dict()["ok"] is False
    assert report(clean_verdict(), drained=False).to_dict()["ok"] is False


def test_a_deadline_passes_within_its_limit_and_stops_beyond_it() -> None:
    Deadline(60.0).check("now")
    gone = Deadline(0.5, started=0.0)  # started long ago on the monotonic clock
    assert gone.left() < 0
    with pytest.raises(ChaosError, match=r"time limit of 0\.5 s while testing"):
        gone.check("while testing")
