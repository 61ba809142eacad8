"""build_trace: how far one event got, from the evidence given, and nothing guessed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from publisher.lines_view import LinesView
from publisher.store import Entry, Head, LineLease, Order, QuarantineRecord, Snapshot, State
from publisher.trace import PRUNED, Proof, SinkView, Trace, build_trace, render_trace
from shared import GLOBAL_LINE, Event, order_event, payload_digest

EVENT: Event = order_event({"id": "order-1", "sku": "snack", "qty": 7})
DIGEST = payload_digest(EVENT)
ACCEPTED_AT = 1_700_000_000.0
STAGES = ["accepted", "queued", "received", "acknowledged", "marked"]
P, N, U = Proof.PROVEN, Proof.NOT_PROVEN, Proof.UNKNOWN

ORDER = Order(id="order-1", sku="snack", qty=7, accepted_at=ACCEPTED_AT)
ACK: dict[str, Any] = {"ack": "order-1", "status": "applied", "sha256": DIGEST}


def entry(
    state: State = State.PENDING,
    *,
    ack: dict[str, Any] | None = None,
    attempts: int = 0,
    last_error: str | None = None,
    event: Event = EVENT,
    lane: str | None = "snack",
) -> Entry:
    sent = state is State.SENT
    return Entry(
        seq=42,
        event=event,
        lane=lane,
        state=state,
        queued_at=ACCEPTED_AT,
        sent_at=ACCEPTED_AT + 2 if sent else None,
        ack=ack,
        attempts=attempts,
        last_error=last_error,
        last_attempt_at=ACCEPTED_AT + 2 if attempts else None,
        first_failure_at=ACCEPTED_AT + 1 if last_error else None,
    )


def inbox(digest: str = DIGEST, deliveries: int = 1) -> SinkView:
    return SinkView(
        record={
            "id": "order-1",
            "sha256": digest,
            "received_at": ACCEPTED_AT + 1.5,
            "deliveries": deliveries,
            "last_delivery_at": ACCEPTED_AT + 1.5,
        }
    )


NOT_IN_INBOX = SinkView(record=None)
UNREACHABLE = SinkView(unknown="the sink could not be asked: connection refused")


def proofs(trace: Trace) -> list[Proof]:
    assert [stage.name for stage in trace.stages] == STAGES
    return [stage.proof for stage in trace.stages]


def evidence(trace: Trace, name: str) -> str:
    return next(stage.evidence for stage in trace.stages if stage.name == name)


# ---------------------------------------------------------------- whole journeys


def test_delivered_and_marked_is_proven_at_every_stage() -> None:
    trace = build_trace(
        "order-1", ORDER, entry(State.SENT, ack=ACK, attempts=1), [], inbox(deliveries=1)
    )

    assert proofs(trace) == [P, P, P, P, P]
    assert trace.event_id == "order-1"
    assert trace.attempts == 1
    assert trace.last_error is None
    assert "snack x7" in evidence(trace, "accepted")
    assert "seq 42" in evidence(trace, "queued")
    assert "deliveries seen: 1" in evidence(trace, "received")
    assert DIGEST in evidence(trace, "acknowledged")


def test_unknown_id_proves_nothing() -> None:
    trace = build_trace("order-9", None, None, [], NOT_IN_INBOX)

    assert proofs(trace) == [N, N, N, N, N]
    assert trace.attempts is None
    assert trace.last_error is None
    assert evidence(trace, "queued") == "no outbox row"


def test_queued_but_never_sent() -> None:
    trace = build_trace("order-1", ORDER, entry(), [], NOT_IN_INBOX)

    assert proofs(trace) == [P, P, N, N, N]
    assert "no row" in evidence(trace, "received")
    assert evidence(trace, "marked") == "entry is pending"


def test_sink_unreachable_makes_received_unknown_and_nothing_else() -> None:
    trace = build_trace("order-1", ORDER, entry(attempts=3, last_error="refused"), [], UNREACHABLE)

    assert proofs(trace) == [P, P, U, N, N]
    assert "connection refused" in evidence(trace, "received")
    assert (trace.attempts, trace.last_error) == (3, "refused")


def test_sink_unreachable_does_not_hide_what_the_outbox_proves() -> None:
    trace = build_trace("order-1", ORDER, entry(State.SENT, ack=ACK, attempts=1), [], UNREACHABLE)
    assert proofs(trace) == [P, P, U, P, P]


def test_ack_lost_before_the_mark_sink_has_it_publisher_does_not() -> None:
    # A crash between the sink's commit and the mark: stage 3 holds, 4 and 5 do not.
    trace = build_trace("order-1", ORDER, entry(attempts=1), [], inbox())

    assert proofs(trace) == [P, P, P, N, N]
    assert "no verified ACK" in evidence(trace, "acknowledged")


def test_duplicate_deliveries_are_reported_from_the_sink() -> None:
    trace = build_trace(
        "order-1", ORDER, entry(State.SENT, ack=ACK, attempts=2), [], inbox(deliveries=2)
    )
    assert proofs(trace) == [P, P, P, P, P]
    assert "deliveries seen: 2" in evidence(trace, "received")


def test_marked_without_a_stored_ack_does_not_claim_the_ack() -> None:
    trace = build_trace("order-1", ORDER, entry(State.SENT, ack=None, attempts=1), [], inbox())
    assert proofs(trace) == [P, P, P, N, P]


# ---------------------------------------------------------------- digests


def test_sink_holding_another_payload_is_not_proof_of_receipt() -> None:
    other = payload_digest(order_event({"id": "order-1", "sku": "snack", "qty": 8}))
    trace = build_trace("order-1", ORDER, entry(attempts=2, last_error="digest"), [], inbox(other))

    assert proofs(trace) == [P, P, N, N, N]
    assert "another payload" in evidence(trace, "received")


def test_sink_record_without_a_digest_is_not_proof_of_receipt() -> None:
    view = SinkView(record={"id": "order-1", "received_at": ACCEPTED_AT, "deliveries": 1})
    trace = build_trace("order-1", ORDER, entry(), [], view)
    assert trace.stages[2].proof is N


def test_digest_is_compared_with_the_entry_payload_not_the_order() -> None:
    # A digest over the same fields in another key order is the same canonical payload.
    data = {"qty": 7, "sku": "snack"}
    reordered: Event = {"data": data, "key": "snack", "type": "order.placed", "id": "order-1"}
    trace = build_trace("order-1", ORDER, entry(event=reordered), [], inbox(DIGEST))
    assert trace.stages[2].proof is P


# ---------------------------------------------------------------- pruned and quarantined


def test_pruned_entry_is_unknown_not_disproven() -> None:
    # prune deletes sent outbox rows only; the order row stays.
    trace = build_trace("order-1", ORDER, None, [], inbox())

    assert proofs(trace) == [P, U, P, U, U]
    for name in ("queued", "acknowledged", "marked"):
        assert evidence(trace, name) == PRUNED
    assert trace.attempts is None


def test_pruned_entry_with_the_sink_unreachable() -> None:
    trace = build_trace("order-1", ORDER, None, [], UNREACHABLE)
    assert proofs(trace) == [P, U, U, U, U]


def test_pruned_entry_that_the_sink_does_not_have() -> None:
    trace = build_trace("order-1", ORDER, None, [], NOT_IN_INBOX)
    assert proofs(trace) == [P, U, N, U, U]


def test_quarantined_entry_is_not_marked_and_its_records_are_kept() -> None:
    record = QuarantineRecord(
        reason="sku retired",
        quarantined_by="alice",
        quarantined_at=ACCEPTED_AT + 5,
        released_by=None,
        released_at=None,
        released_as=None,
        delivered_past_count=None,
        delivered_past=[],
    )
    trace = build_trace(
        "order-1",
        ORDER,
        entry(State.QUARANTINED, attempts=2, last_error="409"),
        [record],
        NOT_IN_INBOX,
    )

    assert proofs(trace) == [P, P, N, N, N]
    assert evidence(trace, "marked") == "entry is quarantined"
    assert trace.quarantines == [record]


# ---------------------------------------------------------------- output forms


def test_trace_dict_is_plain_json() -> None:
    record = QuarantineRecord(
        "bad", "bob", ACCEPTED_AT + 1, "carol", ACCEPTED_AT + 3, "redriven", 2, ["b", "c"]
    )
    trace = build_trace("order-1", ORDER, entry(State.SENT, ack=ACK, attempts=3), [record], inbox())

    data = json.loads(json.dumps(trace.to_dict()))

    assert [s["name"] for s in data["stages"]] == STAGES
    assert [s["proof"] for s in data["stages"]] == ["proven"] * 5
    assert data["attempts"] == 3
    assert data["quarantines"][0]["delivered_past"] == ["b", "c"]
    assert data["quarantines"][0]["released_as"] == "redriven"


def test_proof_words_are_the_three_of_the_contract() -> None:
    assert {p.value for p in Proof} == {"proven", "not proven", "unknown"}


def test_render_lists_every_stage_with_its_proof_and_the_quarantine() -> None:
    record = QuarantineRecord(
        "bad sku", "bob", ACCEPTED_AT + 1, "carol", ACCEPTED_AT + 3, "redriven", 2, ["b", "c"]
    )
    trace = build_trace(
        "order-1", ORDER, entry(attempts=3, last_error="sink answered 503"), [record], UNREACHABLE
    )

    text = render_trace(trace)

    lines = text.splitlines()
    assert lines[0] == "evidence for order-1"
    for number, name in enumerate(STAGES, start=1):
        assert any(line.split()[:2] == [str(number), name] for line in lines), name
    assert "unknown" in next(line for line in lines if " received " in line)
    assert "sink answered 503" in text
    assert "by bob: bad sku" in text
    assert "redriven" in text and "(b, c)" in text


@pytest.mark.parametrize("view", [NOT_IN_INBOX, UNREACHABLE, inbox()])
def test_build_trace_does_not_mutate_its_inputs(view: SinkView) -> None:
    the_entry = entry(State.SENT, ack=dict(ACK), attempts=1)
    before = (repr(ORDER), repr(the_entry), repr(view))
    build_trace("order-1", ORDER, the_entry, [], view)
    build_trace("order-1", ORDER, the_entry, [], view)
    assert (repr(ORDER), repr(the_entry), repr(view)) == before


def blocked_head(event_id: str, lane: str | None = None) -> Head:
    return Head(
        seq=7,
        id=event_id,
        queued_at=ACCEPTED_AT,
        attempts=3,
        last_error="sink rejected it with 400",
        blocked_since=ACCEPTED_AT + 1,
        lane=lane,
    )


def test_a_pending_entry_names_the_failing_heads_it_waits_behind() -> None:
    snapshot = Snapshot(
        taken_at=ACCEPTED_AT + 5,
        pending=3,
        quarantined=0,
        head=blocked_head("poison-1"),
        blocked_lanes=[blocked_head("poison-1", "mystery"), blocked_head("old-1", "snack")],
    )

    trace = build_trace("order-1", ORDER, entry(), [], NOT_IN_INBOX, snapshot)

    assert len(trace.waiting_behind) == 2
    assert trace.waiting_behind[0].startswith("global order: behind head poison-1")
    assert trace.waiting_behind[1].startswith("order by key: behind lane snack head old-1")
    assert "waiting: order by key" in render_trace(trace)


def test_an_entry_does_not_wait_behind_itself_or_other_lanes_or_when_sent() -> None:
    own = Snapshot(ACCEPTED_AT, 1, 0, blocked_head("order-1"), [blocked_head("order-1", "snack")])
    other_lane = Snapshot(ACCEPTED_AT, 2, 0, None, [blocked_head("x-1", "juice")])

    assert build_trace("order-1", ORDER, entry(), [], NOT_IN_INBOX, own).waiting_behind == []
    assert build_trace("order-1", ORDER, entry(), [], NOT_IN_INBOX, other_lane).waiting_behind == []
    sent = entry(State.SENT, ack=ACK)
    assert build_trace("order-1", ORDER, sent, [], inbox(), own).waiting_behind == []


def test_an_entry_waits_behind_the_head_of_the_lane_the_outbox_stored_not_of_its_sku() -> None:
    blocked = Snapshot(ACCEPTED_AT, 2, 0, None, [blocked_head("x-1", "elsewhere")])
    moved = entry(lane="elsewhere")  # its event's SKU is still "snack"

    [waiting] = build_trace("order-1", ORDER, moved, [], NOT_IN_INBOX, blocked).waiting_behind
    assert waiting.startswith("order by key: behind lane elsewhere head x-1")
    of_its_sku = Snapshot(ACCEPTED_AT, 2, 0, None, [blocked_head("x-1", "snack")])
    assert build_trace("order-1", ORDER, moved, [], NOT_IN_INBOX, of_its_sku).waiting_behind == []


def lease(line: str, owner: str | None = "w1") -> LineLease:
    return LineLease(line, owner, 3, ACCEPTED_AT + 9, 9.0, ACCEPTED_AT, ACCEPTED_AT)


def test_the_lines_named_are_the_stored_lane_and_the_global_line() -> None:
    leases = LinesView([lease(GLOBAL_LINE), lease("elsewhere"), lease("snack", "w2")])

    moved = build_trace("order-1", ORDER, entry(lane="elsewhere"), [], NOT_IN_INBOX, None, leases)
    assert [(held.line, held.owner) for held in moved.lines] == [
        ("elsewhere", "w1"),
        (GLOBAL_LINE, "w1"),
    ]
    # Pruned: the order's SKU is the lane the entry had.
    pruned = build_trace("order-1", ORDER, None, [], NOT_IN_INBOX, None, leases)
    assert [held.line for held in pruned.lines] == ["snack", GLOBAL_LINE]
    unknown = build_trace("order-9", None, None, [], NOT_IN_INBOX, None, leases)
    assert [held.line for held in unknown.lines] == [GLOBAL_LINE]


# ---------------------------------------------------------------- events of any type

PAYMENT: Event = {
    "id": "pay-1",
    "type": "payment.captured",
    "key": "cust-9",
    "data": {"amount": 1250, "note": "<script>x</script>\u0007\u00e9"},
}


def test_a_generic_event_is_accepted_by_its_entry_with_type_key_and_escaped_data() -> None:
    trace = build_trace("pay-1", None, entry(event=PAYMENT, lane="cust-9"), [], NOT_IN_INBOX)

    assert proofs(trace) == [P, P, N, N, N]
    accepted = evidence(trace, "accepted")
    assert accepted.startswith("event payment.captured key cust-9 data {")
    assert "\\u0007" in accepted and "\\u00e9" in accepted
    assert accepted.isascii() and accepted.isprintable()


def test_a_pruned_event_of_any_type_is_accepted_with_its_outbox_stages_unknown() -> None:
    # Not an order: no order row says it was pruned, the ID the outbox keeps does.
    trace = build_trace("pay-1", None, None, [], inbox(), pruned=True)

    assert proofs(trace) == [P, U, P, U, U]
    assert "keeps its ID and digest" in evidence(trace, "accepted")
    never = build_trace("pay-1", None, None, [], NOT_IN_INBOX)
    assert proofs(never) == [N, N, N, N, N]


def test_a_generic_event_without_a_key_says_no_key_and_its_line_is_the_global_one() -> None:
    keyless: Event = {"id": "tick-1", "type": "clock.tick", "data": {}}
    leases = LinesView([lease(GLOBAL_LINE), lease("snack")])
    keyless_entry = entry(event=keyless, lane=None)
    trace = build_trace("tick-1", None, keyless_entry, [], NOT_IN_INBOX, leases=leases)

    assert evidence(trace, "accepted").startswith("event clock.tick data {}, ")
    assert [lease.line for lease in trace.lines] == [GLOBAL_LINE]
