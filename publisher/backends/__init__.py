"""Outbox backends, and the one factory that picks one from a `--db` location."""

from __future__ import annotations

from plumbing.storage import Opening, parse_location
from publisher.store import Outbox


def open_outbox(location: str) -> Opening[Outbox]:
    """The outbox at `location`, opened with the backend it names (BadLocation if none,
    or if the location is not one that backend can use: raised before anything is
    opened)."""
    where = parse_location(location)
    if where.backend == "postgres":
        import pg_tx

        pg_tx.parse(where.target)  # a bad URI is BadLocation now, not when awaited

        async def open_postgres() -> Outbox:
            from publisher.backends.postgres import PostgresOutbox

            return await PostgresOutbox.connect(where.target)

        return Opening(open_postgres)

    async def open_sqlite() -> Outbox:
        from publisher.backends.sqlite import SqliteOutbox

        return await SqliteOutbox.connect(where.target)

    return Opening(open_sqlite)
