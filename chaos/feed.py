"""What a chaos run publishes: orders, generic events or a mix, all drawn from the seed.

An order `{id, sku, qty}` goes to POST /orders and is recorded as the event
`order.placed` keyed by its SKU; a generic event `{id, type, key?, data}` goes to
POST /events, or with the generic events next to it to POST /events/batch.

Generic events are drawn to test what both sides must agree on byte for byte, the
canonical form (RFC 8785): several types; keys from a small set that shares two
names with the SKUs (orders and events meet in one lane), and some events with no
key (the line "*"); nested data with text outside the Basic Multilingual Plane,
object keys whose order by UTF-16 code units differs from their order by code
points, escapes, and floats whose shortest form has an exponent or no fraction.

The canonical form the runner expects of each item is computed here with the
rfc8785 package itself, not with `shared.canonical_json`, so a verdict comparing it
with what the outbox stored checks the product's canonicalisation, not a copy of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import rfc8785

from shared import ORDER_PLACED, Event, Order

Mix = Literal["orders", "generic", "mixed"]
MIXES: Final[tuple[Mix, ...]] = ("orders", "generic", "mixed")
GENERIC_SHARE: Final = 0.5  # of a mixed feed
TYPES: Final = ("payment.captured", "shipment.sent", "customer.noted")
ACCOUNTS: Final = ("acct-7", "acct-8", "acct-9")
KEYLESS_SHARE: Final = 0.25
BATCHED_SHARE: Final = 0.5  # generic events that may go in a POST /events/batch
MAX_PER_BATCH: Final = 5
TEXTS: Final = (
    "plain",
    "Grüße aus Zürich",
    "日本語のテキスト",
    "emoji 🦄🚚💳 astral",
    "\U0001d11e music, \U0001d538 math, \U0001f004 tile",  # astral, escaped for lint
    "e\u0301 combining, \u00e9 precomposed",
    "שלום עולם",
    'quote " backslash \\ slash /',
    "line\nbreak\ttab\rreturn",
    "control \u0001\u001f, delete \u007f",
    "separators \u2028 \u2029",
    "byte order mark \ufeff, replacement \ufffd",
    "",
)
# Keys whose RFC 8785 order (UTF-16 code units) is not their code point order: "😀"
# (D83D DE00) sorts before "ﬁ" (FB01) although U+1F600 is above U+FB01.
DATA_KEYS: Final = ("😀 grin", "ﬁ ligature", "zebra", "Äpfel", "A", "a", "_")
# Floats whose canonical text tests the number rules: an integral float loses its
# fraction, -0.0 becomes 0, large and small ones take an exponent. None is integral
# at or above 2^53: such a float's canonical text is an integer outside I-JSON's range.
FLOATS: Final = (0.1, -2.5, 3.0, -0.0, 1e21, 1.5e-7, 123456789.125, 5e-324, 1.7976931348623157e308)
INTEGERS: Final = (0, -1, 42, 2**53 - 1, -(2**53 - 1))


@dataclass(frozen=True)
class Item:
    """One event to publish: the body to post, the canonical event both databases
    must hold for it, and the order it is (None for a generic event)."""

    body: dict[str, Any]
    canonical: str
    order: Order | None = None
    batched: bool = False  # a generic event that may share a POST /events/batch

    @property
    def id(self) -> str:
        event_id: str = self.body["id"]
        return event_id


def canonical(event: Event) -> str:
    """RFC 8785 of the event, by the rfc8785 package."""
    value: dict[str, Any] = dict(event)
    return rfc8785.dumps(value).decode()


def order_item(order: Order) -> Item:
    """An order, and the canonical `order.placed` event it is recorded as."""
    event = Event(
        id=order["id"],
        type=ORDER_PLACED,
        key=order["sku"],
        data={"sku": order["sku"], "qty": order["qty"]},
    )
    return Item(dict(order), canonical(event), order)


def generic_event(rng: random.Random, event_id: str, keys: tuple[str, ...]) -> Event:
    """A generic event drawn from `rng`: a type of TYPES, a key of `keys` or none."""
    event = Event(id=event_id, type=rng.choice(TYPES), data=_data(rng))
    if rng.random() >= KEYLESS_SHARE:
        event["key"] = rng.choice(keys)
    return event


def _data(rng: random.Random) -> dict[str, Any]:
    return {
        "amount": {"value": rng.choice(FLOATS), "cents": rng.choice(INTEGERS), "ok": True},
        "note": rng.choice(TEXTS),
        "lines": [
            {"n": n, "text": rng.choice(TEXTS), "weight": rng.uniform(-1e6, 1e6)}
            for n in range(rng.randint(0, 3))
        ],
        "labels": {key: rng.choice(TEXTS) for key in rng.sample(DATA_KEYS, rng.randint(1, 4))},
        "deep": {"a": {"b": {"c": [rng.choice(FLOATS), None, False, rng.choice(TEXTS)]}}},
    }


@dataclass
class Feed:
    """The run's items by index. Orders are drawn from the run's own generator
    (`orders`), as they always were, so an orders-only feed is the one a seed gave
    before generic events existed; which index is a generic event, and the event,
    come from a generator of the seed's own."""

    mix: Mix
    seed: int
    orders: random.Random
    skus: tuple[str, ...]
    events: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.mix not in MIXES:
            raise ValueError(f"mix must be one of {', '.join(MIXES)}, not {self.mix!r}")
        self.events = random.Random(f"events-{self.seed}")

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys of generic events: a few accounts and two of the SKUs."""
        return (*ACCOUNTS, *self.skus[:2])

    def item(self, index: int) -> Item:
        event_id = f"chaos-{self.seed}-{index:06d}"
        if not self._generic():
            sku = self.orders.choice(self.skus)
            return order_item(Order(id=event_id, sku=sku, qty=self.orders.randint(1, 9)))
        event = generic_event(self.events, event_id, self.keys)
        batched = self.events.random() < BATCHED_SHARE
        return Item(dict(event), canonical(event), batched=batched)

    def _generic(self) -> bool:
        if self.mix == "mixed":
            return self.events.random() < GENERIC_SHARE
        return self.mix == "generic"
