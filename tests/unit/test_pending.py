"""An outbox entry as the relay reads it (publisher.store.Pending): its data is left
unparsed until someone asks for the event, and each kind of sender gets what it may use."""

from __future__ import annotations

import json
from typing import Any

from publisher.store import Pending
from shared.event import StoredEvent, canonical_json, canonical_parts

PAYMENT: dict[str, Any] = {
    "id": "p-1",
    "type": "payment.captured",
    "key": "c-9",
    "data": {"amount_cents": 1999, "currency": "EUR", "customer": {"id": "c-9", "name": "Åsa"}},
}
RECORDED_AT = 1_700_000_000.25


def test_a_stored_entry_goes_to_a_reading_sender_as_its_head_and_the_text_of_its_data() -> None:
    stored = canonical_json(PAYMENT)  # type: ignore[arg-type]
    row = Pending.stored(7, stored, 2, "c-9", RECORDED_AT)
    sent = row.sent(copied=False)
    assert isinstance(sent, StoredEvent)
    assert dict(sent) == {"id": "p-1", "type": "payment.captured", "key": "c-9"}
    assert sent.data_text == canonical_parts(PAYMENT)[0]  # type: ignore[arg-type]
    assert (sent.canonical, sent.recorded_at) == (stored, RECORDED_AT)
    assert (row.seq, row.id, row.type, row.attempts, row.lane) == (
        7,
        "p-1",
        "payment.captured",
        2,
        "c-9",
    )


def test_a_stored_entrys_event_is_parsed_whole_when_asked_for() -> None:
    row = Pending.stored(7, canonical_json(PAYMENT), 0, "c-9", RECORDED_AT)  # type: ignore[arg-type]
    assert row.event == PAYMENT
    assert row.event is row.event  # parsed once


def test_a_sender_that_may_change_events_gets_a_copy_of_its_own_each_time() -> None:
    row = Pending.stored(7, canonical_json(PAYMENT), 0, "c-9", RECORDED_AT)  # type: ignore[arg-type]
    first = row.sent(copied=True)
    assert type(first) is dict and first == PAYMENT
    first["data"]["customer"]["id"] = "changed"
    assert row.sent(copied=True) == PAYMENT
    assert row.event == PAYMENT


def test_a_text_not_laid_out_as_a_canonical_event_is_parsed_at_once() -> None:
    spaced = json.dumps(PAYMENT)  # valid JSON, not the canonical layout
    row = Pending.stored(7, spaced, 0, "c-9", RECORDED_AT)
    sent = row.sent(copied=False)
    assert isinstance(sent, StoredEvent) and sent.data_text is None
    assert dict(sent) == PAYMENT and row.id == "p-1"


def test_an_entry_made_of_an_event_keeps_that_event() -> None:
    row = Pending(3, PAYMENT, 0, None)  # type: ignore[arg-type]
    assert row.sent(copied=False) is PAYMENT
    assert row.sent(copied=True) == PAYMENT and row.sent(copied=True) is not PAYMENT
    assert (row.id, row.type) == ("p-1", "payment.captured")
