"""The verdict of a chaos run, read from both database files with independent connections."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


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

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.applied_twice == 0 and self.inventory_ok

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def read_verdict(source_db: Path, sink_db: Path, expected: dict[str, tuple[str, int]]) -> Verdict:
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
    )
