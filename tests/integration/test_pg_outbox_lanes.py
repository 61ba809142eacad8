"""PostgreSQL: which lanes have pending entries, when the first pending entries do not
name enough of them (a long backlog in a few lanes): the lane index is walked, and the
lanes still come oldest head first. Rows are written with SQL of the test's own."""

from __future__ import annotations

import psycopg

from publisher.backends.postgres import LANE_SCAN_ROWS
from publisher.store import Outbox
from shared import Event, canonical_json

BACKLOG = LANE_SCAN_ROWS + 10


def queue(url: str, lane: str, count: int) -> None:
    """`count` pending events of key `lane`, after every entry there is, each stored
    in its canonical form (an entry needs no order row)."""
    events = [
        Event(id=f"{lane}-{n}", type="lane.tested", key=lane, data={}) for n in range(1, count + 1)
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            b"INSERT INTO outbox_entries (id, type, payload, queued_at, lane)"
            b" SELECT id, 'lane.tested', payload, 0, %(lane)s"
            b" FROM unnest(%(ids)s::text[], %(payloads)s::text[]) WITH ORDINALITY"
            b" AS e (id, payload, n) ORDER BY n",
            {
                "lane": lane,
                "ids": [one["id"] for one in events],
                "payloads": [canonical_json(one) for one in events],
            },
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
