"""The verdict of a chaos run, read from both databases with independent connections.

Either backend: SQLite files (read-only connections) or PostgreSQL databases (a
read-only snapshot each), through chaos.dbs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from chaos.dbs import DbLocation, Reader, applied_ids, as_int, as_json, reading

Ordering = Literal["global", "sku"]
ORDERINGS: Final[tuple[Ordering, ...]] = ("global", "sku")


@dataclass(frozen=True)
class Verdict:
    """What both files show once the backlog has drained.

    - accepted: orders in the source DB (every one the runner was told was accepted)
    - delivered: outbox entries marked sent
    - resends: deliveries the sink saw beyond the first for an ID
    - duplicates: IDs the sink received more than once (each absorbed by its inbox)
    - lost: accepted orders the sink never applied, or that were never marked sent
    - applied_twice: SKUs whose inventory holds more than their accepted orders add up to
    - inventory_ok: every SKU's inventory equals the sum of its accepted quantities
    - order_inversions: pairs of one line the sink first applied against outbox seq
      order, less those a quarantine record explains (see `order_inversions`)
    - ordering: the lines the order was checked in: global (one line) or sku (one per SKU)
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

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.applied_twice == 0
            and self.inventory_ok
            and self.order_inversions == 0
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def read_verdict(
    source_db: DbLocation,
    sink_db: DbLocation,
    expected: dict[str, tuple[str, int]],
    ordering: Ordering = "global",
) -> Verdict:
    """Compare both databases with what the runner itself knows was accepted (`expected`)."""
    with reading(source_db) as source, reading(sink_db) as sink:
        return _verdict(source, sink, expected, ordering)


def _verdict(
    source: Reader, sink: Reader, expected: dict[str, tuple[str, int]], ordering: Ordering
) -> Verdict:
    orders = {i: (sku, qty) for i, sku, qty in source.rows("SELECT id, sku, qty FROM orders")}
    outbox = {
        i: as_int(sent) + 2 * as_int(quarantined)
        for i, sent, quarantined in source.rows("SELECT id, sent, quarantined FROM outbox")
    }
    inbox = dict(sink.rows("SELECT id, deliveries FROM inbox"))
    stock = dict(sink.rows("SELECT sku, qty FROM inventory"))
    accepted = {**orders, **expected}  # an order the runner saw accepted but the DB lacks is lost
    lost = {i for i in accepted if i not in orders or i not in inbox or outbox.get(i) != 1}
    want: Counter[str] = Counter()
    for sku, qty in accepted.values():
        want[sku] += qty
    skus = set(want) | set(stock)
    return Verdict(
        accepted=len(orders),
        delivered=sum(1 for state in outbox.values() if state == 1),
        resends=sum(n - 1 for n in inbox.values()),
        duplicates=sum(1 for n in inbox.values() if n > 1),
        lost=len(lost),
        applied_twice=sum(1 for sku in skus if stock.get(sku, 0) > want[sku]),
        inventory_ok=all(stock.get(sku, 0) == want[sku] for sku in skus),
        pending=sum(1 for state in outbox.values() if state == 0),
        quarantined=sum(1 for state in outbox.values() if state == 2),
        order_inversions=_inversions(source, sink, ordering),
        ordering=ordering,
    )


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

    A line is every outbox entry (global) or the entries of one SKU (sku). The sink's
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
    entries = {
        event_id: (seq, (lane or as_json(payload)["sku"]) if ordering == "sku" else "*")
        for seq, event_id, lane, payload in source.rows("SELECT seq, id, lane, payload FROM outbox")
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


def _excuses(source: Reader, entries: dict[str, tuple[int, str]]) -> dict[str, _Excuse]:
    excuses: defaultdict[str, _Excuse] = defaultdict(_Excuse)
    rows = source.rows("SELECT id, delivered_past, delivered_past_count FROM quarantines")
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
