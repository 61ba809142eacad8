"""Inbox backends, and the one factory that picks one from a `--db` location."""

from __future__ import annotations

from plumbing.storage import Opening, parse_location
from sink.handlers import Handlers
from sink.store import Inbox


def open_inbox(location: str, handlers: Handlers) -> Opening[Inbox]:
    """The inbox at `location`, opened with the backend it names (BadLocation if none),
    running `handlers`' effects and with their schema applied."""
    where = parse_location(location)  # raises before anything is opened
    if where.backend == "postgres":
        import pg_tx  # the driver is loaded only for a PostgreSQL location

        pg_tx.parse(where.target)  # BadLocation for a URI libpq would refuse, still unopened

        async def opener() -> Inbox:
            from sink.backends.postgres import PostgresInbox

            return await PostgresInbox.connect(where.target, handlers)

        return Opening(opener)

    async def open_file() -> Inbox:
        from sink.backends.sqlite import SqliteInbox

        return await SqliteInbox.connect(where.target, handlers)

    return Opening(open_file)
