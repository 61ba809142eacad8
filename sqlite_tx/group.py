"""Group commit (plumbing.group_commit) for the SQLite backends.

Calls that arrive while a transaction runs on the database thread share the next
one, and with it one fsync, instead of one each.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from typing import TypeVar

import plumbing.group_commit

from .database import Database

C_in = TypeVar("C_in")
R_out = TypeVar("R_out")
GroupFn = Callable[[sqlite3.Connection, list[C_in]], list[R_out | Exception]]


class GroupCommit(plumbing.group_commit.GroupCommit[C_in, R_out]):
    """Group commit on the database thread: calls submitted while a transaction runs
    wait, and are then run together in the next one, so they share one fsync.

    `commit(conn, calls)` runs on the database thread, makes one transaction of all
    the calls, and returns one outcome per call (see plumbing.group_commit).
    """

    def __init__(self, db: Database, commit: GroupFn[C_in, R_out]) -> None:
        async def run(calls: list[C_in]) -> list[R_out | Exception]:
            return await db.run(functools.partial(_group, commit, calls))

        super().__init__(run, deadline=db.deadline)


def _group(
    commit: GroupFn[C_in, R_out], calls: list[C_in], conn: sqlite3.Connection
) -> list[R_out | Exception]:
    return commit(conn, calls)
