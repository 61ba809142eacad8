"""Outbox backends, and the one factory that picks one from a `--db` location."""

from __future__ import annotations

from pathlib import Path

from plumbing.storage import BadLocation, Opening, parse_location
from publisher.store import Outbox


def open_outbox(location: str, *, create: bool = True) -> Opening[Outbox]:
    """The outbox at `location`, opened with the backend it names (BadLocation if none,
    or if the location is not one that backend can use: raised before anything is
    opened). Without `create`, BadLocation where there is no outbox yet (a SQLite
    file not there, now; a PostgreSQL database or schema without its tables, when
    awaited), with nothing created."""
    where = parse_location(location)
    if where.backend == "postgres":
        import pg_tx

        pg_tx.parse(where.target)  # a bad URI is BadLocation now, not when awaited

        async def open_postgres() -> Outbox:
            from publisher.backends.postgres import PostgresOutbox

            return await PostgresOutbox.connect(where.target, create=create)

        return Opening(open_postgres)

    if not create and not Path(where.target).exists():
        raise BadLocation(f"{where.target}: no such database file (serve and accept create one)")

    async def open_sqlite() -> Outbox:
        from publisher.backends.sqlite import SqliteOutbox

        return await SqliteOutbox.connect(where.target)

    return Opening(open_sqlite)
