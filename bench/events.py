"""The events the cases send: today's orders, and generic events of 1 KiB of data.

An order `{id, sku, qty}` is what `POST /orders` takes and is recorded as the event
`order.placed` (shared.event.order_event). A generic event is what `POST /events`
takes: `{"id", "type", "key", "data"}` with `data` of exactly `DATA_BYTES` bytes in its
canonical form (RFC 8785, UTF-8), nested objects and an array of them, strings with
some text outside ASCII, integers; the `floats` variant has prices, weights and
rates as JSON numbers with a fraction, which sends canonicalisation down the
`rfc8785` package's path instead of `json.dumps` (shared.event.canonical_data).

Everything here is a pure function of its arguments: the same n gives the same
event in every run, and two n give two different payloads of the same size.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

from shared import Event, Order, canonical_json, order_canonical, order_event
from shared.event import canonical_data

SKUS: Final = tuple(f"sku-{n}" for n in range(8))
DATA_BYTES: Final = 1024  # a generic event's canonical data, encoded
GENERIC_TYPE: Final = "shipment.prepared"
LINES: Final = 4  # objects in the data's array
_PAD_FIELD: Final = "note"  # the string that brings the data to DATA_BYTES


class Kind(StrEnum):
    """What a case sends: orders, or generic events with or without floats."""

    ORDER = "order"
    GENERIC = "generic"  # 1 KiB of data, integers only
    FLOATS = "generic_floats"  # the same shape, prices, weights and rates as floats

    @property
    def prefix(self) -> str:
        """What its IDs start with by default."""
        return "order" if self is Kind.ORDER else "event"


def order(n: int, prefix: str = "order", skus: int = len(SKUS)) -> Order:
    """The nth order; SKUs take turns (the first `skus` of sku-0, sku-1, ...)."""
    return {"id": f"{prefix}-{n:08d}", "sku": f"sku-{n % skus}", "qty": 1 + n % 5}


def event(kind: Kind, n: int, prefix: str | None = None, keys: int = len(SKUS)) -> Event:
    """The nth event of a kind: the nth order's `order.placed` event, or a generic
    event keyed as the nth order is (sku-(n % keys)), so lanes fill alike."""
    prefix = kind.prefix if prefix is None else prefix
    if kind is Kind.ORDER:
        return order_event(order(n, prefix, keys))
    data = generic_data(n, floats=kind is Kind.FLOATS)
    return Event(id=f"{prefix}-{n:08d}", type=GENERIC_TYPE, key=f"sku-{n % keys}", data=data)


def stored(
    kind: Kind, n: int, prefix: str | None = None, keys: int = len(SKUS)
) -> tuple[Event, str]:
    """The nth event of a kind and its canonical form, as intake stores it (an
    order's written directly, as the order intake does)."""
    if kind is Kind.ORDER:
        placed = order(n, kind.prefix if prefix is None else prefix, keys)
        return order_event(placed), order_canonical(placed)
    made = event(kind, n, prefix, keys)
    return made, canonical_json(made)


def body(kind: Kind, n: int, prefix: str | None = None) -> dict[str, Any]:
    """What a client POSTs for the nth item: an order to /orders, an event to /events."""
    if kind is Kind.ORDER:
        return dict(order(n, kind.prefix if prefix is None else prefix))
    return dict(event(kind, n, prefix))


def generic_data(n: int, *, floats: bool = False) -> dict[str, Any]:
    """DATA_BYTES of canonical data for the nth event (see the module docstring)."""
    data = _shape(n, floats)
    short = DATA_BYTES - _size(data)
    if short < 0:  # the shape alone must leave room for the pad
        raise AssertionError(f"generic data {n} is {-short} bytes over {DATA_BYTES}")
    data[_PAD_FIELD] = ("Leave at the back door if nobody answers. " * 30)[:short]
    return data


def _size(data: dict[str, Any]) -> int:
    """The canonical size of the data with an empty pad: an ASCII pad of k characters
    adds k bytes to it."""
    return len(canonical_data({**data, _PAD_FIELD: ""}, "/data").encode())


def _shape(n: int, floats: bool) -> dict[str, Any]:
    def money(cents: int) -> int | float:
        return cents / 100 if floats else cents

    lines = [
        {
            "sku": f"sku-{(n + k) % 97}",
            "title": (
                "Kaffeebohnen, geröstet",
                "Thé vert « Sencha »",
                "Żubrówka glass",
                "Café crème",
            )[k],
            "qty": 1 + (n + k) % 7,
            "unit_price": money(199 + 37 * ((n * 7 + k) % 113)),
            "weight": (n + k) % 9 / 4 + 0.25 if floats else 250 * (1 + (n + k) % 9),
            "tags": ["fragile", "food"] if k % 2 else ["food"],
        }
        for k in range(LINES)
    ]
    return {
        "shipment": {
            "id": f"shp-{n:010d}",
            "carrier": "DHL Paket",
            "created_at": 1_700_000_000 + 17 * n,
            "priority": n % 3,
            "insured": n % 2 == 0,
        },
        "customer": {
            "id": f"cus-{n % 5_000:06d}",
            "name": ("Zoë Müller", "Łukasz Żółć", "José Núñez", "Ana Ødegård")[n % 4],
            "address": {
                "street": "Hauptstraße 12",
                "city": ("München", "Kraków", "Málaga", "Tromsø")[n % 4],
                "postcode": f"{10_000 + n % 89_999}",
                "country": ("DE", "PL", "ES", "NO")[n % 4],
            },
            "loyalty": {"tier": n % 4, "points": 37 * n % 100_000},
        },
        "lines": lines,
        "totals": {
            "items": sum(line["qty"] for line in lines),
            "amount": money(sum(199 + 37 * ((n * 7 + k) % 113) for k in range(LINES))),
            "tax_rate": 0.19 if floats else 19,
            "currency": "EUR",
        },
    }
