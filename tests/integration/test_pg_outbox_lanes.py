"""PostgreSQL: which lanes have pending entries, when the first pending entries do not
name enough of them (a long backlog in a few lanes): the lane index is walked, and the
lanes still come oldest head first. Rows are written with SQL of the test's own."""

from __future__ import annotations

import psycopg

from publisher.backends.postgres import LANE_SCAN_ROWS
from publisher.store import Outbox

BACKLOG = LANE_SCAN_ROWS + 10


def queue(url: str, lane: str, count: int) -> None:
    """`count` pending entries of SKU `lane`, after every entry there is."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            b"INSERT INTO orders (id, sku, qty, accepted_at)"
            b" SELECT %(lane)s || '-' || n, %(lane)s, 1, 0 FROM generate_series(1, %(count)s) n",
            {"lane": lane, "count": count},
        )
        conn.execute(
            b"INSERT INTO outbox (id, payload, queued_at, lane)"
            b" SELECT %(lane)s || '-' || n, '{}', 0, %(lane)s"
            b" FROM generate_series(1, %(count)s) n ORDER BY n",
            {"lane": lane, "count": count},
        )


async def test_lanes_behind_a_long_backlog_are_found_oldest_head_first(
    pg_outbox: Outbox, pg_database: str
) -> None:
    queue(pg_database, "m", 1)
    queue(pg_database, "a", BACKLOG)
    queue(pg_database, "z", 1)
    queue(pg_database, "b", 1)

    assert await pg_outbox.pending_lanes(1) == ["m"]
    assert await pg_outbox.pending_lanes(2) == ["m", "a"]  # the first rows name both
    assert await pg_outbox.pending_lanes(10) == ["m", "a", "z", "b"]  # the index walked
    assert await pg_outbox.pending_lanes(2, ["m", "a"]) == ["z", "b"]
    assert await pg_outbox.pending_lanes(10, ["a"]) == ["m", "z", "b"]
