"""Lease fencing where only PostgreSQL has it: several sinks (pools, processes) on one
inbox. Requests of one line with different epochs applied at once through two
connections serialise on the line's fence row, so no epoch is applied after a higher
one; a group commit carries each call's lease; and a request whose predecessor
(Outbox-After) another sink process is applying goes on soon after that commit.
The behaviour both backends share is in tests/behaviour/test_inbox_store.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import psycopg
import pytest
from pg_faults import PgAccess
from test_pg_sink_group import event, in_progress, taken

from shared import LEASE_HEADER, PREDECESSOR_HEADER, Event, Lease, Receipt, StaleLease
from sink import Inbox
from sink.store import BatchReceipt

SOURCE = "outbox-a"
ROUNDS = 30


@pytest.fixture
async def two_inboxes(pg_database: str) -> AsyncIterator[tuple[Inbox, Inbox]]:
    """Two inboxes on one database, each with its pool: two sink processes, as the
    database sees them."""
    async with Inbox.open(pg_database) as one, Inbox.open(pg_database) as two:
        yield one, two


def refusals(outcomes: list[Any]) -> int:
    return sum(isinstance(o, BaseException) for o in outcomes)


async def test_two_sinks_racing_epochs_4_and_5_never_apply_4_after_5(
    two_inboxes: tuple[Inbox, Inbox], inbox_database: PgAccess
) -> None:
    one, two = two_inboxes

    def send(inbox: Inbox, event_id: str, epoch: int) -> Any:
        line = event_id.split("-")[0]
        return inbox.receive_batch(taken([event(event_id, line)]), lease=Lease(SOURCE, line, epoch))

    calls: list[tuple[Inbox, str, int]] = []  # inbox, event ID, epoch
    got: list[Any] = []
    rounds = 0
    with in_progress(one, 2):  # the first inbox commits in groups, the second alone
        # Each round its own line, at once; who goes first varies. On a loaded machine
        # one order can win every round (the inbox committing alone is faster), so a
        # last round, if needed, lets the order that never won go first and finish
        # before the other starts: both outcomes are then checked, whatever the load.
        for r in range(ROUNDS + 1):
            order = [(one, 4), (two, 5)] if r % 2 else [(two, 5), (one, 4)]
            if r == ROUNDS:  # the last round
                if 0 < refusals(got) < 3 * r:
                    break  # the race went both ways
                order = [(one, 4), (two, 5)] if refusals(got) else [(two, 5), (one, 4)]
            round_calls = [(i, f"r{r}-e{e}-{k}", e) for k in range(3) for i, e in order]
            async with asyncio.timeout(10):
                if r < ROUNDS:
                    got += await asyncio.gather(
                        *(send(*call) for call in round_calls), return_exceptions=True
                    )
                else:  # one epoch's calls, then the other's
                    for epoch in (order[0][1], order[1][1]):
                        first = [call for call in round_calls if call[2] == epoch]
                        got += await asyncio.gather(
                            *(send(*call) for call in first), return_exceptions=True
                        )
                    round_calls.sort(key=lambda call: call[2] != order[0][1])
            calls += round_calls
            rounds += 1

    refused = [(c, o) for c, o in zip(calls, got, strict=True) if isinstance(o, BaseException)]
    assert all(isinstance(o, StaleLease) and (c[2], o.seen) == (4, 5) for c, o in refused), refused
    rows = inbox_database.query("SELECT id, applied_seq FROM inbox_events")
    seq = dict(rows)
    applied_4_after_5 = 0
    for r in range(rounds):
        fours = [s for i, s in seq.items() if i.startswith(f"r{r}-e4")]
        fives = [s for i, s in seq.items() if i.startswith(f"r{r}-e5")]
        assert len(fives) == 3  # the highest epoch is never refused
        applied_4_after_5 += bool(fours) and max(fours) > min(fives)
    assert applied_4_after_5 == 0
    assert len(rows) == len(calls) - len(refused)
    assert 0 < len(refused) < 3 * rounds, "the race never went both ways"
    fences = inbox_database.query("SELECT DISTINCT epoch FROM inbox_lease_fences")
    assert fences == [(5,)]


async def test_a_group_commit_carries_each_calls_lease_in_one_transaction(
    pg_database: str, inbox_database: PgAccess
) -> None:
    async with Inbox.open(pg_database) as inbox:
        await inbox.receive_batch(taken([event("old", "tea")]), lease=Lease(SOURCE, "tea", 7))
        calls: list[tuple[list[Event], str | None, Lease | None]] = [
            ([event("a1", "apple"), event("a2", "apple")], None, Lease(SOURCE, "apple", 2)),
            ([event("a3", "apple")], "a2", Lease(SOURCE, "apple", 2)),  # names a2, same group
            ([event("b1", "bean")], None, Lease(SOURCE, "bean", 1)),
            ([event("n1", "nut")], None, None),
            ([event("t1", "tea")], None, Lease(SOURCE, "tea", 8)),
        ]
        with in_progress(inbox, 2):
            got = await asyncio.gather(
                *(inbox.receive_batch(taken(e), after=a, lease=lease) for e, a, lease in calls)
            )
        assert all(
            isinstance(g, BatchReceipt) and {r.receipt for r in g.received} == {Receipt.APPLIED}
            for g in got
        )
        assert (
            inbox_database.transactions("inbox_events WHERE id <> 'old'") == 1
        )  # INSERT_CALLS, once
        assert inbox_database.query("SELECT line, epoch FROM inbox_lease_fences ORDER BY line") == [
            ("apple", 2),
            ("bean", 1),
            ("tea", 8),
        ]

        # A stale call in a group stops the group's statement there; it alone is refused.
        stale_group = [
            ([event("b2", "bean")], None, Lease(SOURCE, "bean", 1)),
            ([event("t2", "tea")], None, Lease(SOURCE, "tea", 7)),
            ([event("b3", "bean")], "b2", Lease(SOURCE, "bean", 1)),
            ([event("a4", "apple")], None, Lease(SOURCE, "apple", 3)),
        ]
        with in_progress(inbox, 2):
            outcomes = await asyncio.gather(
                *(
                    inbox.receive_batch(taken(e), after=a, lease=lease)
                    for e, a, lease in stale_group
                ),
                return_exceptions=True,
            )
    assert isinstance(outcomes[1], StaleLease) and outcomes[1].seen == 8
    assert all(isinstance(o, BatchReceipt) for i, o in enumerate(outcomes) if i != 1), outcomes
    assert inbox_database.query(
        "SELECT count(*) FROM inbox_events WHERE id IN ('b2', 'b3', 'a4', 't2')"
    ) == [(3,)]
    assert inbox_database.query("SELECT epoch FROM inbox_lease_fences WHERE line = 'apple'") == [
        (3,)
    ]


# ---------------------------------------------------------------- two sink processes

LATE_S = 0.2  # B goes on within this of A's commit (the poll's longest pause is 50 ms)


async def test_a_request_whose_predecessor_another_sink_is_applying_goes_on_after_its_commit(
    pg_database: str, sink_process: Callable[..., Any]
) -> None:
    first, second = sink_process(pg_database), sink_process(pg_database)
    loop = asyncio.get_running_loop()
    done_at: dict[str, float] = {}

    async def post(client: aiohttp.ClientSession, url: str, body: Event, **headers: str) -> int:
        async with client.post(url, json=body, headers=headers) as response:
            status = response.status
        done_at[body["id"]] = loop.time()
        return status

    # A's transaction waits for a row the test holds: A is being applied by the first
    # sink, not committed, while B (after A) arrives at the second.
    with psycopg.connect(pg_database, autocommit=True) as setup:
        setup.execute(b"INSERT INTO inbox_inventory (sku, qty) VALUES ('held', 0)")
    holder = psycopg.connect(pg_database)
    try:
        holder.execute(b"SELECT qty FROM inbox_inventory WHERE sku = 'held' FOR UPDATE")
        async with aiohttp.ClientSession() as client:
            lease = {LEASE_HEADER: Lease(SOURCE, "held", 1).header()}
            a = asyncio.create_task(post(client, first.url, event("A", "held"), **lease))
            await waiting_for_a_lock(pg_database)
            headers = {PREDECESSOR_HEADER: "A", **lease}
            b = asyncio.create_task(post(client, second.url, event("B", "held"), **headers))
            await asyncio.sleep(0.3)
            assert not b.done() and not a.done()  # B waits for A (and A for the row)
            holder.commit()
            released = loop.time()
            assert await asyncio.wait_for(a, 5) == 200
            assert await asyncio.wait_for(b, 5) == 200
    finally:
        holder.close()
    assert done_at["A"] - released < 1.0
    assert done_at["B"] - done_at["A"] < LATE_S, "B waited for its own timeout, not for A"
    with psycopg.connect(pg_database) as check:
        rows = check.execute(b"SELECT id FROM inbox_events ORDER BY applied_seq").fetchall()
    assert rows == [("A",), ("B",)]


async def waiting_for_a_lock(url: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                b"SELECT count(*) FROM pg_stat_activity"
                b" WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()
        if row is not None and row[0] > 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("A's transaction never waited for the held row")
