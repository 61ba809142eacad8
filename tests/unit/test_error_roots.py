"""One exception root per concern, so a caller can catch a concern as a whole."""

from __future__ import annotations

import pytest

from plumbing.storage import BadLocation, StorageError
from publisher.errors import (
    DeliveryError,
    InvalidTransition,
    NotAcknowledged,
    OutboxError,
    Rejected,
    TargetNotAllowed,
    UnknownEntry,
)
from shared import Conflict, ContractError, InvalidAck, InvalidEvent, PredecessorMissing
from sqlite_tx.aiosqlite_internals import AiosqliteChanged


@pytest.mark.parametrize(
    ("error", "root"),
    [
        (InvalidEvent, ContractError),
        (Conflict, ContractError),
        (PredecessorMissing, ContractError),
        (InvalidAck, ContractError),
        (NotAcknowledged, DeliveryError),
        (Rejected, DeliveryError),
        (TargetNotAllowed, DeliveryError),
        (UnknownEntry, OutboxError),
        (InvalidTransition, OutboxError),
        (AiosqliteChanged, StorageError),
    ],
)
def test_each_error_has_the_root_of_its_concern(error: type[Exception], root: type) -> None:
    assert issubclass(error, root)


def test_value_errors_stay_value_errors() -> None:
    # Callers that caught ValueError for bad input keep working.
    assert issubclass(InvalidEvent, ValueError)
    assert issubclass(InvalidAck, ValueError)
    assert issubclass(BadLocation, ValueError)


def test_the_roots_are_apart() -> None:
    roots = [ContractError, DeliveryError, OutboxError, StorageError]
    for a in roots:
        for b in roots:
            assert a is b or not issubclass(a, b)
