"""The sink: an idempotent inbox that applies each event once and then ACKs it.

`create_app(db, handlers=...)` is the inbox as an aiohttp application (what
`python -m sink` serves); `Handlers` is a registry of what each event type does, as
SQL statements run in the inbox's own transaction (`Reject` refuses an event).
"""

from sink.app import create_app
from sink.handlers import (
    HandledEvent,
    HandlerFailed,
    HandlerRejected,
    Handlers,
    NoHandler,
    NotApplied,
    Reject,
    Statement,
)
from sink.store import Inbox

__all__ = [
    "HandledEvent",
    "HandlerFailed",
    "HandlerRejected",
    "Handlers",
    "Inbox",
    "NoHandler",
    "NotApplied",
    "Reject",
    "Statement",
    "create_app",
]
