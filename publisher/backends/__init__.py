"""Outbox backends, and the one factory that picks one from a `--db` location."""

from __future__ import annotations

from plumbing.storage import Opening, parse_location
from publisher.store import Outbox


def open_outbox(location: str) -> Opening[Outbox]:
    """The outbox at `location`, opened with the backend it names (BadLocation if none)."""
    where = parse_location(location)  # raises before anything is opened

    async def opener() -> Outbox:
        from publisher.backends.sqlite import SqliteOutbox

        return await SqliteOutbox.connect(where.target)

    return Opening(opener)
