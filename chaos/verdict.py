"""The verdict of a chaos run, read from both database files with independent connections."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

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


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def read_verdict(
    source_db: Path,
    sink_db: Path,
    expected: dict[str, tuple[str, int]],
    ordering: Ordering = "global",
) -> Verdict:
    """Compare both files with what the runner itself knows was accepted (`expected`)."""
    orders = {i: (sku, qty) for i, sku, qty in _rows(source_db, "SELECT id, sku, qty FROM orders")}
    outbox = dict(_rows(source_db, "SELECT id, sent + 2 * quarantined FROM outbox"))
    inbox = {
        i: (json.loads(p), n)
        for i, p, n in _rows(sink_db, "SELECT id, payload, deliveries FROM inbox")
    }
    stock = dict(_rows(sink_db, "SELECT sku, qty FROM inventory"))
    accepted = {**orders, **expected}  # an order the runner saw accepted but the file lacks is lost
    lost = {i for i in accepted if i not in orders or i not in inbox or outbox.get(i) != 1}
    want: Counter[str] = Counter()
    for sku, qty in accepted.values():
        want[sku] += qty
    skus = set(want) | set(stock)
    return Verdict(
        accepted=len(orders),
        delivered=sum(1 for state in outbox.values() if state == 1),
        resends=sum(n - 1 for _, n in inbox.values()),
        duplicates=sum(1 for _, n in inbox.values() if n > 1),
        lost=len(lost),
        applied_twice=sum(1 for sku in skus if stock.get(sku, 0) > want[sku]),
        inventory_ok=all(stock.get(sku, 0) == want[sku] for sku in skus),
        pending=sum(1 for state in outbox.values() if state == 0),
        quarantined=sum(1 for state in outbox.values() if state == 2),
        order_inversions=order_inversions(source_db, sink_db, ordering),
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


def order_inversions(source_db: Path, sink_db: Path, ordering: Ordering = "global") -> int:
    """Pairs of entries of one line that the sink first applied against outbox order.

    A line is every outbox entry (global) or the entries of one SKU (sku). The sink's
    first application of an ID is its inbox row: rows are only ever inserted, on the
    first delivery, so rowid order is first-application order. A pair x, y of one line
    with seq(x) < seq(y) is inverted when y's inbox row comes before x's. It is
    explained when a quarantine record of x lists y as delivered past x (or, for a
    record whose list was cut short, counts it among the passers after the last
    listed one). Entries missing from either file are not in any line (they are lost).
    """
    if ordering not in ORDERINGS:
        raise ValueError(f"ordering must be one of {', '.join(ORDERINGS)}, not {ordering!r}")
    entries = {
        event_id: (seq, lane if ordering == "sku" else "")
        for seq, event_id, lane in _rows(
            source_db,
            "SELECT seq, id, coalesce(lane, json_extract(payload, '$.sku')) FROM outbox",
        )
    }
    applied = [i for (i,) in _rows(sink_db, "SELECT id FROM inbox ORDER BY rowid") if i in entries]
    lines: defaultdict[str, list[str]] = defaultdict(list)
    for event_id in applied:
        lines[entries[event_id][1]].append(event_id)
    excuses = _excuses(source_db, entries)
    inverted = sum(inverted_pairs([entries[i][0] for i in line]) for line in lines.values())
    explained = sum(
        _explained(line, {i: entries[i][0] for i in line}, excuses) for line in lines.values()
    )
    return inverted - explained


def _excuses(source_db: Path, entries: dict[str, tuple[int, str]]) -> dict[str, _Excuse]:
    excuses: defaultdict[str, _Excuse] = defaultdict(_Excuse)
    rows = _rows(source_db, "SELECT id, delivered_past, delivered_past_count FROM quarantines")
    for event_id, past, count in rows:
        listed = [str(i) for i in json.loads(past)] if past else []
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
