"""The console's event view, pure: which stages of a trace only wait (a pending
entry, no send of it failed, not yet received, acknowledged or marked), and the
trace with the sink's record left out for a reader who is not signed in."""

from __future__ import annotations

from publisher.console.api import SINK_HIDDEN, sink_hidden, waiting_stages
from publisher.store import Entry, State
from publisher.trace import Proof, SinkView, build_trace
from shared import Event, payload_digest

EVENT: Event = {"id": "o-1", "type": "order.placed", "key": "tea", "data": {"sku": "tea", "qty": 1}}


def entry(state: State, last_error: str | None = None) -> Entry:
    sent = state is State.SENT
    return Entry(
        seq=1,
        event=EVENT,
        lane="tea",
        state=state,
        queued_at=1000.0,
        sent_at=1001.0 if sent else None,
        ack={"id": "o-1"} if sent else None,
        attempts=0 if last_error is None else 3,
        last_error=last_error,
        last_attempt_at=None if last_error is None else 1000.5,
        first_failure_at=None if last_error is None else 1000.2,
    )


def test_a_pending_entry_waits_for_the_sink_its_ack_and_its_mark() -> None:
    pending = entry(State.PENDING)
    trace = build_trace("o-1", None, pending, [], SinkView(record=None))
    assert waiting_stages(trace, pending) == ["received", "acknowledged", "marked"]


def test_another_payload_in_the_sink_is_no_wait() -> None:
    pending = entry(State.PENDING)
    record = {"id": "o-1", "received_at": 1000.5, "deliveries": 1, "sha256": "0" * 64}
    trace = build_trace("o-1", None, pending, [], SinkView(record=record))
    assert trace.stages[2].proof is Proof.NOT_PROVEN
    assert waiting_stages(trace, pending) == ["acknowledged", "marked"]
    same = {**record, "sha256": payload_digest(EVENT)}
    trace = build_trace("o-1", None, pending, [], SinkView(record=same))
    assert waiting_stages(trace, pending) == ["acknowledged", "marked"]  # received: proven


def test_an_entry_whose_send_failed_does_not_merely_wait() -> None:
    failing = entry(State.PENDING, last_error="sink answered 400: unknown sku")
    trace = build_trace("o-1", None, failing, [], SinkView(record=None))
    assert waiting_stages(trace, failing) == []


def test_a_quarantined_or_missing_entry_does_not_wait() -> None:
    quarantined = entry(State.QUARANTINED)
    trace = build_trace("o-1", None, quarantined, [], SinkView(record=None))
    assert waiting_stages(trace, quarantined) == []
    trace = build_trace("o-1", None, None, [], SinkView(record=None))
    assert waiting_stages(trace, None) == []


def test_the_sinks_record_can_be_left_out() -> None:
    record = {"id": "o-1", "received_at": 1000.5, "deliveries": 2, "sha256": payload_digest(EVENT)}
    trace = build_trace("o-1", None, entry(State.SENT), [], SinkView(record=record))
    hidden = sink_hidden(trace)
    assert hidden.stages[2].proof is Proof.UNKNOWN and hidden.stages[2].evidence == SINK_HIDDEN
    assert [s for n, s in enumerate(hidden.stages) if n != 2] == [
        s for n, s in enumerate(trace.stages) if n != 2
    ]
