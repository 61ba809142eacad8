"""The sink: an idempotent inbox that applies each event once and then ACKs it.

`create_app(db, handlers=...)` is the inbox as an aiohttp application (what
`python -m sink` serves); `Handlers` is a registry of what each event type does, as
SQL statements run in the inbox's own transaction (`Reject` refuses an event).

The inbox as a library, in a transaction of the caller's own (sink.in_transaction):
`read_cloudevents` reads a request's events, `receive_in` (`receive_in_async`)
records each in the caller's transaction, and `ack_body` is the ACK to answer with
once the caller has committed.
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
from sink.in_transaction import (
    Arrival,
    NotInTransaction,
    ack_body,
    receive_in,
    receive_in_async,
)
from sink.store import Inbox
from sink.wire import InvalidRequest, read_cloudevents

__all__ = [
    "Arrival",
    "HandledEvent",
    "HandlerFailed",
    "HandlerRejected",
    "Handlers",
    "Inbox",
    "InvalidRequest",
    "NoHandler",
    "NotApplied",
    "NotInTransaction",
    "Reject",
    "Statement",
    "ack_body",
    "create_app",
    "read_cloudevents",
    "receive_in",
    "receive_in_async",
]
