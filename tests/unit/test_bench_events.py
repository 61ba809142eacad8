"""The events the benchmark sends: what each kind is, and the ACK its yardstick gives."""

from __future__ import annotations

import json

import pytest

from bench.ackserver import ack
from bench.events import DATA_BYTES, GENERIC_TYPE, Kind, body, event, generic_data, stored
from bench.generic import alternating, rounds
from shared import ORDER_PLACED, canonical_json, checked_event, digest_of
from shared.cloudevents import structured
from shared.event import canonical_parts


def leaves(value: object) -> list[object]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in leaves(item)]
    return [value]


def depth(value: object) -> int:
    if isinstance(value, dict | list):
        items = value.values() if isinstance(value, dict) else value
        return 1 + max((depth(item) for item in items), default=0)
    return 0


@pytest.mark.parametrize("kind", [Kind.GENERIC, Kind.FLOATS])
def test_generic_data_is_1_kib_canonical_nested_and_not_all_ascii(kind: Kind) -> None:
    payloads = set()
    for n in range(300):
        made, canonical = stored(kind, n)
        assert checked_event(dict(made)) == (made, canonical)  # valid, and stored as intake would
        data_text = canonical_parts(made)[0]
        assert len(data_text.encode()) == DATA_BYTES
        payloads.add(data_text)
    assert len(payloads) == 300  # each n its own data
    data = event(kind, 7)["data"]
    assert depth(data) >= 4 and not json.dumps(data, ensure_ascii=False).isascii()
    floats = [leaf for leaf in leaves(data) if type(leaf) is float]
    assert bool(floats) is (kind is Kind.FLOATS)  # floats take rfc8785's path
    assert any(type(leaf) is int for leaf in leaves(data))
    assert generic_data(7, floats=kind is Kind.FLOATS) == data  # the same in every run


def test_each_kind_is_keyed_and_posted_as_its_route_takes_it() -> None:
    order, generic = event(Kind.ORDER, 9), event(Kind.GENERIC, 9)
    assert (order["type"], order["key"], order["data"]) == (
        ORDER_PLACED,
        "sku-1",
        {"sku": "sku-1", "qty": 5},
    )
    assert (generic["type"], generic["key"], generic["id"]) == (
        GENERIC_TYPE,
        "sku-1",
        "event-00000009",
    )
    assert stored(Kind.ORDER, 9)[1] == canonical_json(order)
    assert body(Kind.ORDER, 9, "x") == {"id": "x-00000009", "sku": "sku-1", "qty": 5}
    assert body(Kind.FLOATS, 9, "x") == {**event(Kind.FLOATS, 9, "x")}


@pytest.mark.parametrize("kind", list(Kind))
def test_the_ack_servers_digest_is_the_one_the_relay_checks(kind: Kind) -> None:
    made, canonical = stored(kind, 3)
    data_text = canonical_parts(made)[0]
    wire = structured(
        made["id"], made["type"], made["key"], data_text, "urn:x", "2026-01-01T00:00:00.000Z"
    )
    expected = {"ack": made["id"], "status": "applied", "sha256": digest_of(canonical)}
    assert ack(json.loads(wire)) == expected  # a CloudEvent, as the relay sends it
    assert ack(body(kind, 3)) == expected  # an order or a plain event, as a client POSTs it


def test_the_kinds_take_turns_forwards_then_backwards() -> None:
    order, generic, floats = Kind.ORDER, Kind.GENERIC, Kind.FLOATS
    assert rounds(1) == [order, generic, floats]
    assert rounds(2) == [order, generic, floats, floats, generic, order]


def test_any_variants_take_turns_so_a_drift_weighs_on_each_alike() -> None:
    assert alternating(("a", "b"), 1) == ["a", "b"]
    assert alternating(("a", "b"), 3) == ["a", "b", "b", "a", "a", "b"]
    assert alternating(("a", "b"), 0) == []
