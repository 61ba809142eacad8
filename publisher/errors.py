"""Errors of the publisher side: `DeliveryError` for a delivery that was not proven,
`OutboxError` for an operation on one outbox entry that cannot be done."""

from __future__ import annotations


class DeliveryError(Exception):
    """The event was not delivered: no verified ACK came back.

    `retryable` says whether sending the same event again may succeed: true for
    connection errors, timeouts, 5xx and unverifiable replies; false when the sink
    rejected the event itself (400, 409, 413, 422).
    """

    retryable = True

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TargetNotAllowed(DeliveryError):
    """The sink URL is not an allowed target; nothing was sent."""

    retryable = False


class NotAcknowledged(DeliveryError):
    """The sink answered, but not with a verified ACK for the event sent."""


class Rejected(NotAcknowledged):
    """The sink refused the event itself; sending it again as it is cannot succeed."""

    retryable = False


class LeaseLost(Exception):
    """This worker no longer holds the lease of a line (another worker took it over,
    or a write under an old epoch was refused): it stops delivering that line. Not a
    delivery failure: nothing is recorded against the entry."""

    def __init__(self, line: str, epoch: int, why: str) -> None:
        super().__init__(f"lease of line {line!r} at epoch {epoch} lost: {why}")
        self.line = line
        self.epoch = epoch


class FencedBySink(LeaseLost, NotAcknowledged):
    """The sink refused a request (409) for its stale lease epoch: nothing applied.

    `seen` is the epoch the sink said it has seen for the line (None when its reply
    named none): the lease taken past it is one the sink accepts.
    """

    def __init__(self, line: str, epoch: int, why: str, *, seen: int | None = None) -> None:
        # Not "lost": the outbox may still hold the lease (it is behind the sink).
        Exception.__init__(
            self, f"lease of line {line!r} at epoch {epoch} fenced by the sink: {why}"
        )
        self.line = line
        self.epoch = epoch
        self.status = 409
        self.seen = seen


class OutboxError(Exception):
    """An operation on an outbox entry cannot be done as asked."""


class UnknownEntry(OutboxError, LookupError):
    """No outbox entry has this ID."""

    def __init__(self, event_id: str) -> None:
        super().__init__(f"no outbox entry has ID {event_id!r}")
        self.event_id = event_id


class InvalidTransition(OutboxError):
    """The entry is not in a state that allows this operation."""


class RelayAlreadyRunning(OutboxError):
    """Another relay delivers from this outbox: two would send every entry twice."""

    def __init__(self, location: str, holder: str) -> None:
        super().__init__(
            f"another relay is already delivering from {location}: {holder};"
            " stop it first (one relay per outbox)"
        )
        self.location = location
        self.holder = holder
