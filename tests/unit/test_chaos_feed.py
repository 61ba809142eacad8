"""What a chaos run publishes (chaos.feed) and how it posts it (chaos.intake), without
starting anything: the feed's draws, the canonical forms it expects, the batches."""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path
from typing import Any

import pytest

from chaos.cli import build_parser, main
from chaos.feed import ACCOUNTS, MAX_PER_BATCH, MIXES, TYPES, Feed, Item, Mix
from chaos.intake import Intake, recorded
from chaos.procs import ChaosError, Service
from shared import checked_event, validate_order

SKUS = ("snack", "juice", "bread", "soap")


def feed(mix: Mix, seed: int = 3) -> Feed:
    return Feed(mix, seed, random.Random(seed), SKUS)


def items(mix: Mix, count: int = 400, seed: int = 3) -> list[Item]:
    drawn = feed(mix, seed)
    return [drawn.item(index) for index in range(count)]


def texts(value: object) -> list[str]:
    """Every string in a JSON value, object keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (k, *texts(v))]
    if isinstance(value, list):
        return [t for v in value for t in texts(v)]
    return []


def numbers(value: object) -> list[object]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return [value] if isinstance(value, int | float) and not isinstance(value, bool) else []


# ---------------------------------------------------------------- the feed


@pytest.mark.parametrize("mix", MIXES)
def test_same_seed_same_feed(mix: Mix) -> None:
    assert items(mix) == items(mix)
    assert items(mix, seed=4) != items(mix)


def test_an_orders_feed_draws_the_orders_a_seed_always_gave() -> None:
    """The run's generator, in the order the runner drew from it before generic events."""
    rng = random.Random(3)
    before = [(f"chaos-3-{n:06d}", rng.choice(SKUS), rng.randint(1, 9)) for n in range(50)]

    drawn = [(i.id, i.body["sku"], i.body["qty"]) for i in items("orders", 50)]

    assert drawn == before


def test_the_mixes_hold_what_they_say() -> None:
    assert all(i.order is not None for i in items("orders"))
    assert all(i.order is None for i in items("generic"))
    mixed = items("mixed")
    orders = sum(1 for i in mixed if i.order is not None)
    assert 0.35 < orders / len(mixed) < 0.65


def test_an_order_is_expected_as_its_order_placed_event() -> None:
    order = next(i for i in items("mixed") if i.order is not None)

    assert validate_order(order.body) == order.order
    sku, qty, event_id = order.body["sku"], order.body["qty"], order.id
    assert order.canonical == (
        f'{{"data":{{"qty":{qty},"sku":"{sku}"}},"id":"{event_id}",'
        f'"key":"{sku}","type":"order.placed"}}'
    )


def test_generic_events_spread_over_types_keys_and_no_key() -> None:
    events = [i.body for i in items("generic")]
    drawn = feed("generic")

    assert {e["type"] for e in events} == set(TYPES)
    keys = {e.get("key") for e in events}
    assert keys == {*ACCOUNTS, *SKUS[:2], None} and set(drawn.keys) >= set(SKUS[:2])
    assert 0.1 < sum(1 for e in events if "key" not in e) / len(events) < 0.4
    assert 0.3 < sum(1 for i in items("generic") if i.batched) / len(events) < 0.7


def test_generic_data_holds_astral_text_escapes_and_floats() -> None:
    data = [i.body["data"] for i in items("generic")]
    every = [t for d in data for t in texts(d)]

    assert any(max(t, default="\0") > "\uffff" for t in every)  # outside the BMP
    assert "😀 grin" in every and "ﬁ ligature" in every  # UTF-16 order is not code points
    assert any("\u2028" in t for t in every) and any('"' in t and "\\" in t for t in every)
    found = [n for d in data for n in numbers(d)]
    assert {-0.0, 3.0, 1e21, 1.5e-7} <= {n for n in found if isinstance(n, float)}
    assert max(len(json.dumps(d)) for d in data) < 4096


@pytest.mark.parametrize("ascii_only", [True, False])
def test_the_expected_canonical_form_is_the_products_after_the_wire(ascii_only: bool) -> None:
    """What the runner expects (the rfc8785 package) is what the publisher computes from
    the body it receives, and that text validates again as the same event (the sink
    validates what the relay sends)."""
    for item in items("mixed", 300):
        if item.order is not None:
            continue
        wire = json.loads(json.dumps(item.body, ensure_ascii=ascii_only))
        _, text = checked_event(wire)
        assert text == item.canonical, item.id
        assert checked_event(json.loads(text))[1] == text, item.id


def test_an_unknown_mix_is_an_error() -> None:
    with pytest.raises(ValueError, match="mix"):
        Feed("everything", 1, random.Random(1), SKUS)  # type: ignore[arg-type]


# ---------------------------------------------------------------- intake


class OnePublisher:
    def __init__(self) -> None:
        self.service = Service("publisher", [], 1, None)  # type: ignore[arg-type]
        self.revived = 0

    def intake(self, rng: random.Random) -> Service:
        return self.service

    def revive(self) -> list[tuple[str, int]]:
        self.revived += 1
        return []


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Every request intake makes, as its path and the IDs in its body; each answered
    as the publisher would, every event recorded."""
    requests: list[tuple[str, list[str]]] = []

    def answer(method: str, url: str, body: Any, *, ascii_only: bool = True) -> tuple[int, Any]:
        path = url.partition("127.0.0.1:1")[2]
        if path.endswith("/batch"):
            ids = [e["id"] for e in body["events"]]
            requests.append((path, ids))
            results = [{"index": n, "id": i, "result": "accepted"} for n, i in enumerate(ids)]
            return 200, {"accepted": len(ids), "results": results}
        requests.append((path, [body["id"]]))
        return 201, {"id": body["id"], "result": "accepted"}

    monkeypatch.setattr("chaos.intake.http_json", answer)
    return requests


def test_intake_gathers_batched_events_and_keeps_feed_order(
    posted: list[tuple[str, list[str]]],
) -> None:
    intake = Intake(OnePublisher())
    fed = items("mixed", 200)

    for item in fed:
        intake.add(item)
    intake.flush()

    assert [i for _, ids in posted for i in ids] == [i.id for i in fed]
    paths = {path for path, _ in posted}
    assert paths == {"/orders", "/events", "/events/batch"}
    assert all(1 < len(ids) <= MAX_PER_BATCH for path, ids in posted if path == "/events/batch")
    assert all(len(ids) == 1 for path, ids in posted if path != "/events/batch")
    assert sum(intake.posts.values()) == len(posted)


def test_a_batch_reply_with_a_refused_event_is_not_recorded() -> None:
    ok = {"results": [{"result": "accepted"}, {"result": "duplicate"}]}
    refused = {"results": [{"result": "accepted"}, {"result": "invalid"}]}

    assert recorded("/events/batch", ok) is True
    assert recorded("/events/batch", refused) is False
    assert recorded("/events/batch", {"accepted": 2}) is False
    assert recorded("/events", {"result": "accepted"}) is True


def test_intake_stops_on_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("chaos.intake.http_json", lambda *a, **k: (400, {"error": "invalid"}))
    generic = next(i for i in items("generic") if not i.batched)

    with pytest.raises(ChaosError, match="intake refused"):
        Intake(OnePublisher()).add(generic)


# ---------------------------------------------------------------- command line


def test_the_mix_and_the_key_ordering_parse() -> None:
    parser = build_parser()

    assert parser.parse_args(["run"]).events_mix == "orders"
    args = parser.parse_args(["run", "--events-mix", "mixed", "--ordering", "key"])
    assert (args.events_mix, args.ordering) == ("mixed", "key")
    assert parser.parse_args(["run", "--ordering", "sku"]).ordering == "sku"


def test_an_unknown_mix_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["run", "--events-mix", "everything"])

    assert raised.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--events-mix" in err, err


@pytest.mark.parametrize("target", ["soak", "chaos"])
def test_make_soak_and_chaos_feed_orders_and_generic_events(target: str) -> None:
    """The Makefile targets' commands, parsed by the chaos CLI itself."""
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    recipe = makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    commands = [shlex.split(line.strip()) for line in recipe if line.startswith("\t")]
    assert commands and all(argv[:3] == ["$(BIN)/python", "-m", "chaos"] for argv in commands)
    parsed = [build_parser().parse_args(argv[3:]) for argv in commands]
    assert all(args.events_mix == "mixed" for args in parsed), commands
    if target == "soak":
        assert {args.ordering for args in parsed} == {"global", "key"}
