"""Group commit (plumbing.group_commit) for the PostgreSQL backends.

Calls that arrive while a transaction commits share the next one: one transaction,
its round trips and one WAL flush for many calls instead of one each.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

import plumbing.group_commit
from plumbing.group_commit import Deadline
from plumbing.storage import deadline_passed

from .database import PgDatabase
from .pool import Conn

C_in = TypeVar("C_in")
R_out = TypeVar("R_out")


class GroupCommit(plumbing.group_commit.GroupCommit[C_in, R_out]):
    """Group commit (plumbing.group_commit) on a pooled connection: calls submitted
    while a group is being committed share the next transaction's round trips and
    its WAL flush.

    `commit(conn, calls)` gets a connection outside any transaction, makes one
    transaction of all the calls, and returns one outcome per call.
    """

    def __init__(
        self,
        db: PgDatabase,
        commit: Callable[[Conn, list[C_in]], Awaitable[list[R_out | Exception]]],
    ) -> None:
        async def run(calls: list[C_in]) -> list[R_out | Exception]:
            async with db.connection() as conn:
                return await commit(conn, calls)

        super().__init__(run, deadline=call_deadline(db))


def call_deadline(db: PgDatabase) -> Deadline:
    """The deadline of one call of a group commit: the database's, counted from the
    call's submission, so that a call queued behind a group that hangs fails within
    it too (StorageTimeout, a 503 saying so), not after its own group's deadline."""
    deadline_s = db.settings.deadline_s
    return deadline_s, functools.partial(deadline_passed, db.location, deadline_s)
