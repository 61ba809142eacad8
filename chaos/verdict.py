"""The verdict of a chaos run, read from both databases with independent connections.

Either backend: SQLite files (read-only connections) or PostgreSQL databases (a
read-only snapshot each), through chaos.dbs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final, Literal

from chaos.dbs import (
    DbLocation,
    Reader,
    applied_ids,
    as_int,
    as_json,
    as_text,
    entry_payload,
    reading,
)
from chaos.handlers import EFFECTS_TABLE
from shared import GLOBAL_LINE

Ordering = Literal["global", "key", "sku"]  # "sku": the name "key" had for orders
ORDERINGS: Final[tuple[Ordering, ...]] = ("global", "key", "sku")


@dataclass(frozen=True)
class Verdict:
    """What both files show once the backlog has drained, for orders and generic
    events alike (an order is recorded as the event order.placed).

    - accepted: events in the source DB (every one the runner was told was accepted),
      orders and generic events
    - generic: of those, events that are not orders (no row in `orders`)
    - delivered: outbox entries marked sent
    - resends: deliveries the sink saw beyond the first for an ID
    - duplicates: IDs the sink received more than once (each absorbed by its inbox)
    - lost: accepted events the sink never applied, or that were never marked sent
    - applied_twice: SKUs whose inventory holds more than their accepted orders add
      up to, plus IDs with more than one inbox row
    - inventory_ok: every SKU's inventory equals the sum of its accepted quantities
    - payload_mismatches: accepted events whose canonical form is not one text in
      the outbox, the inbox and what the runner published (each present one)
    - unknown: inbox rows of IDs the source never accepted
    - order_inversions: pairs of one line the sink first applied against outbox seq
      order, less those a quarantine record explains (see `order_inversions`)
    - ordering: the lines the order was checked in: global (one line) or key (one
      per event key, "*" for events without one; sku is its former name)
    - effects_checked: whether the sink's handlers left one row per applied event
      in `chaos_effects` (the registry chaos.handlers:EFFECTS); then an accepted
      event with no such row is lost too, and one with several applied twice
    - inventory_checked: whether the inventory was compared with the orders (not
      with a registry that is neither the built-in warehouse nor EFFECTS, which
      may not keep one)
    """

    accepted: int
    delivered: int
    resends: int
    duplicates: int
    lost: int
    applied_twice: int
    inventory_ok: bool
    pending: int
    quarantined: int
    order_inversions: int
    ordering: Ordering
    generic: int = 0
    payload_mismatches: int = 0
    unknown: int = 0
    effects_checked: bool = False
    inventory_checked: bool = True

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.applied_twice == 0
            and (self.inventory_ok or not self.inventory_checked)
            and self.order_inversions == 0
            and self.payload_mismatches == 0
            and self.unknown == 0
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def read_verdict(
    source_db: DbLocation,
    sink_db: DbLocation,
    expected: Mapping[str, tuple[str, int]],
    ordering: Ordering = "global",
    *,
    published: Mapping[str, str] | None = None,
    inventory: bool = True,
) -> Verdict:
    """Compare both databases with what the runner itself knows was accepted: the
    orders it was told were accepted (`expected`: SKU and quantity by ID) and the
    canonical form of every event it published (`published`, by ID; orders too).
    `inventory`: whether the sink's handlers keep the inventory (the built-in
    warehouse, chaos.handlers:EFFECTS), so that it is checked."""
    with reading(source_db) as source, reading(sink_db) as sink:
        verdict = _verdict(source, sink, expected, ordering, published or {})
    return verdict if inventory else replace(verdict, inventory_checked=False)


@dataclass(frozen=True)
class _Source:
    """The source file's orders and outbox entries, by ID."""

    orders: dict[str, tuple[str, int]]
    states: dict[str, int]  # 0 pending, 1 sent, 2 quarantined
    payloads: dict[str, str]

    @classmethod
    def read(cls, source: Reader) -> _Source:
        orders = source.rows("SELECT id, sku, qty FROM outbox_orders")
        payload = entry_payload(source)
        entries = source.rows(f"SELECT id, sent, quarantined, {payload} FROM outbox_entries")
        return cls(
            orders={i: (sku, qty) for i, sku, qty in orders},
            states={i: as_int(sent) + 2 * as_int(gone) for i, sent, gone, _ in entries},
            payloads={i: as_text(payload) for i, _, _, payload in entries},
        )


@dataclass(frozen=True)
class _Sink:
    """The sink file's inbox rows (by ID, and how many rows each ID has) and inventory."""

    deliveries: dict[str, int]
    payloads: dict[str, str]
    rows_per_id: Counter[str]
    stock: dict[str, int]
    effects: Counter[str] | None  # effect rows per ID (chaos.handlers), None: no table

    @classmethod
    def read(cls, sink: Reader) -> _Sink:
        rows = sink.rows("SELECT id, deliveries, payload FROM inbox_events")
        counted = bool(sink.columns(EFFECTS_TABLE))
        effects = sink.rows(f"SELECT event_id FROM {EFFECTS_TABLE}") if counted else None
        return cls(
            deliveries={i: n for i, n, _ in rows},
            payloads={i: as_text(payload) for i, _, payload in rows},
            rows_per_id=Counter(i for i, _, _ in rows),
            stock=dict(sink.rows("SELECT sku, qty FROM inbox_inventory")),
            effects=None if effects is None else Counter(i for (i,) in effects),
        )


def _verdict(
    source: Reader,
    sink: Reader,
    expected: Mapping[str, tuple[str, int]],
    ordering: Ordering,
    published: Mapping[str, str],
) -> Verdict:
    sent, got = _Source.read(source), _Sink.read(sink)
    accepted = {**sent.orders, **expected}  # an order the runner saw but the file lacks: lost
    known = set(sent.states) | set(accepted) | set(published)
    effects = got.effects
    lost = [
        i
        for i in known
        if i not in got.deliveries
        or sent.states.get(i) != 1
        or (i in expected and i not in sent.orders)
        or (effects is not None and effects[i] == 0)
    ]
    doubled = 0 if effects is None else sum(1 for n in effects.values() if n > 1)
    want: Counter[str] = Counter()
    for sku, qty in accepted.values():
        want[sku] += qty
    skus = set(want) | set(got.stock)
    over = sum(1 for sku in skus if got.stock.get(sku, 0) > want[sku])
    states = list(sent.states.values())
    return Verdict(
        accepted=len(set(sent.orders) | set(sent.states)),
        generic=len(set(sent.states) - set(sent.orders)),
        delivered=states.count(1),
        resends=sum(n - 1 for n in got.deliveries.values()),
        duplicates=sum(1 for n in got.deliveries.values() if n > 1),
        lost=len(lost),
        applied_twice=over + doubled + sum(1 for n in got.rows_per_id.values() if n > 1),
        inventory_ok=all(got.stock.get(sku, 0) == want[sku] for sku in skus),
        payload_mismatches=sum(1 for i in known if len(_texts(i, sent, got, published)) > 1),
        unknown=len(set(got.deliveries) - known),
        pending=states.count(0),
        quarantined=states.count(2),
        order_inversions=_inversions(source, sink, ordering),
        ordering=ordering,
        effects_checked=effects is not None,
    )


def _texts(event_id: str, sent: _Source, got: _Sink, published: Mapping[str, str]) -> set[str]:
    """The canonical forms of one event found in the outbox, the inbox and what the
    runner published (each that has it): one text when they agree."""
    found = (sent.payloads.get(event_id), got.payloads.get(event_id), published.get(event_id))
    return {text for text in found if text is not None}


# ---------------------------------------------------------------- order


@dataclass
class _Excuse:
    """What an entry's quarantine records allow to be applied before it."""

    listed: set[str] = field(default_factory=set)
    # Records whose list was cut short keep only the first IDs (by seq) and a count:
    # that many more passers, all after the last listed one, are explained too.
    unlisted: int = 0
    unlisted_after_seq: int = 0


def order_inversions(
    source_db: DbLocation, sink_db: DbLocation, ordering: Ordering = "global"
) -> int:
    """Pairs of entries of one line that the sink first applied against outbox order.

    A line is every outbox entry (global) or the entries of one key (key, or its
    former name sku; events without a key are the line "*"; see `line_of`). The sink's
    first application of an ID is its inbox row's `applied_seq` (on a SQLite file from
    before that column, its rowid: rows are only ever inserted, on the first delivery).
    A pair x, y of one line
    with seq(x) < seq(y) is inverted when y's inbox row comes before x's. It is
    explained when a quarantine record of x lists y as delivered past x (or, for a
    record whose list was cut short, counts it among the passers after the last
    listed one). Entries missing from either database are not in any line (they are lost).
    """
    with reading(source_db) as source, reading(sink_db) as sink:
        return _inversions(source, sink, ordering)


def _inversions(source: Reader, sink: Reader, ordering: Ordering) -> int:
    return sum(order.inversions for order in _line_orders(source, sink, ordering).values())


@dataclass(frozen=True)
class LineOrder:
    """One line at the sink: entries applied, and pairs applied against outbox order
    (less those a quarantine record explains)."""

    applied: int
    inversions: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def line_orders(
    source_db: DbLocation, sink_db: DbLocation, ordering: Ordering = "global"
) -> dict[str, LineOrder]:
    """Each line's LineOrder (the global line is named "*"); see `order_inversions`."""
    with reading(source_db) as source, reading(sink_db) as sink:
        return _line_orders(source, sink, ordering)


def _line_orders(source: Reader, sink: Reader, ordering: Ordering) -> dict[str, LineOrder]:
    if ordering not in ORDERINGS:
        raise ValueError(f"ordering must be one of {', '.join(ORDERINGS)}, not {ordering!r}")
    by_key = ordering != "global"
    entries = {
        event_id: (seq, line_of(payload) if by_key else GLOBAL_LINE)
        for seq, event_id, payload in source.rows(
            f"SELECT seq, id, {entry_payload(source)} FROM outbox_entries"
        )
    }
    applied = [i for i in applied_ids(sink) if i in entries]
    lines: defaultdict[str, list[str]] = defaultdict(list)
    for event_id in applied:
        lines[entries[event_id][1]].append(event_id)
    excuses = _excuses(source, entries)
    return {
        name: LineOrder(
            applied=len(line),
            inversions=inverted_pairs([entries[i][0] for i in line])
            - _explained(line, {i: entries[i][0] for i in line}, excuses),
        )
        for name, line in sorted(lines.items())
    }


def line_of(payload: object) -> str:
    """An entry's line in order by key, from the event the outbox stored (not from
    its lane column, the relay's own bookkeeping): the event's key, "*" for an event
    without one; a payload of the release before events, an order, names its SKU."""
    event = as_json(payload)
    key = event.get("key", event.get("sku"))
    return key if isinstance(key, str) else GLOBAL_LINE


def _excuses(source: Reader, entries: dict[str, tuple[int, str]]) -> dict[str, _Excuse]:
    excuses: defaultdict[str, _Excuse] = defaultdict(_Excuse)
    rows = source.rows("SELECT id, delivered_past, delivered_past_count FROM outbox_quarantines")
    for event_id, past, count in rows:
        listed = [str(i) for i in as_json(past)] if past else []
        excuse = excuses[event_id]
        excuse.listed.update(listed)
        if count is not None and count > len(listed):
            excuse.unlisted += count - len(listed)
            last = max((entries[i][0] for i in listed if i in entries), default=0)
            excuse.unlisted_after_seq = max(excuse.unlisted_after_seq, last)
    return dict(excuses)


def inverted_pairs(seqs: Sequence[int]) -> int:
    """Pairs i < j with seqs[i] > seqs[j], counted with a Fenwick tree over seq ranks."""
    rank = {seq: r for r, seq in enumerate(sorted(set(seqs)), start=1)}
    tree = [0] * (len(rank) + 1)
    inverted = 0
    for seen, seq in enumerate(seqs):
        at, not_after = rank[seq], 0
        while at > 0:  # how many seen so far have a seq not above this one
            not_after += tree[at]
            at -= at & -at
        inverted += seen - not_after
        at = rank[seq]
        while at < len(tree):
            tree[at] += 1
            at += at & -at
    return inverted


def _explained(line: list[str], seq_of: dict[str, int], excuses: dict[str, _Excuse]) -> int:
    """Inverted pairs of this line (in application order) that quarantine records explain."""
    explained = 0
    for position, late in enumerate(line):
        excuse = excuses.get(late)
        if excuse is None:
            continue
        passers = [i for i in line[:position] if seq_of[i] > seq_of[late]]
        explained += sum(1 for i in passers if i in excuse.listed)
        beyond = sum(
            1 for i in passers if i not in excuse.listed and seq_of[i] > excuse.unlisted_after_seq
        )
        explained += min(beyond, excuse.unlisted)
    return explained
