"""The forms an event arrives in over HTTP, read into what the inbox takes. No I/O.

POST /events takes one event, as
- a CloudEvent in structured mode (`Content-Type: application/cloudevents+json`);
- a CloudEvent in binary mode (`ce-specversion`, `ce-id`, `ce-source`, `ce-type`, and
  `ce-partitionkey` for a key, as headers; `Content-Type: application/json`; the body
  is the data);
- a plain event `{id, type, key?, data}` (`application/json`);
- an order of the previous release `{id, sku, qty}` (`application/json`, no `ce-`
  headers: an object with `sku` or `qty` and no `type`).
POST /events/batch takes 1 to MAX_BATCH of them, as a batched-mode JSON array of
structured CloudEvents (`application/cloudevents-batch+json`), or as `{"events":
[...]}` (`application/json`) of plain events and orders of the previous release.

An order of the previous release is received as the `order.placed` event it records
(shared.event.order_event): stored, compared and digested in that canonical form, so
it is the same event as the CloudEvent a publisher of this release sends for it. Its
ACK's digest is over the previous release's canonical form, which is what a
publisher of that release checks: sinks can be upgraded before publishers.

`read_cloudevents` is the same reading for a web framework of the user's own, in front
of `receive_in` (sink.in_transaction): the CloudEvents modes only (structured, binary,
batched), each refusal an InvalidRequest carrying the sink's own answer.

Each event's canonical form is computed once, here, and handed to the inbox with it.
A refusal is a BadRequest: 415 naming the media types a route takes, 400 for a batch
envelope, and 400 "invalid event" for an event, naming the `field` as validation
names it (a JSON pointer into the event, an order's field, a `ce-` header) and, when
the place is in the body, its `pointer` (RFC 6901) from the body's root: in a batch,
under the item's index.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from multidict import CIMultiDict

from plumbing.bodies import parse_json
from plumbing.http_errors import BadRequest
from shared import MAX_BATCH, Event, InvalidEvent, checked_event, validate_order
from shared.ack import digest_of
from shared.cloudevents import (
    BATCHED,
    HEADER_PREFIX,
    JSON,
    STRUCTURED,
    from_binary,
    from_structured,
    is_binary,
    media_type,
)
from shared.event import MAX_DATA_BYTES_LIMIT, previous_canonical
from sink.store import Incoming, Received

EVENT_MEDIA: Final = (STRUCTURED, JSON)  # what POST /events takes
BATCH_MEDIA: Final = (BATCHED, JSON)  # what POST /events/batch takes
BATCH_FIELD: Final = "events"  # the list of a batch sent as application/json
# The event's fields that binary mode carries in headers.
_HEADERS: Final = {"/id": "ce-id", "/type": "ce-type", "/key": "ce-partitionkey"}
# The event's fields a CloudEvent names otherwise.
_ATTRIBUTES: Final = {"/key": "/partitionkey"}


class Taken(NamedTuple):
    """One event of a request, validated: what the inbox takes, and the text its ACK's
    digest is over when that is not the stored canonical form (`previous`: an order
    sent in the previous release's format, answered in that release's terms)."""

    incoming: Incoming
    previous: str | None = None

    @property
    def event_id(self) -> str:
        return self.incoming.event["id"]

    def ack_digest(self, done: Received) -> str:
        """The digest the ACK of this event carries, given what the inbox did with it
        (it holds the same canonical form, or the event would have been a conflict)."""
        return done.digest if self.previous is None else digest_of(self.previous)


def media_of(content_type: str | None, taken: tuple[str, ...]) -> str:
    """The media type of a request's Content-Type if it is one of `taken`, else
    BadRequest 415 naming those."""
    media = media_type(content_type)
    if media not in taken:
        raise BadRequest(
            415,
            "unsupported",
            f"the body must be sent as Content-Type: {' or '.join(taken)}",
            content_type=content_type,
            accepted=list(taken),
        )
    return media


def read_event(media: str, headers: Mapping[str, str], body: object) -> Taken:
    """The event of a POST /events request of media type `media` (media_of), its
    parsed body and its headers; BadRequest 400 if it is not a valid one."""
    if media == STRUCTURED:
        return _structured(body, "")
    if is_binary(headers):
        return _binary(headers, body)
    if any(name.lower().startswith(HEADER_PREFIX) for name in headers):
        # CloudEvents attributes in headers but no spec version: refused, rather than
        # read as a plain event that would ignore them.
        missing = InvalidEvent(
            f"{HEADER_PREFIX}specversion", "is required: ce-* headers are binary mode"
        )
        raise invalid(missing, None)
    return _plain(body, "")


def event_ids(media: str, headers: Mapping[str, str], body: object) -> list[str]:
    """The ID a POST /events request names, valid or not (a later request may name
    it as its predecessor); none if it names none."""
    if media != STRUCTURED and is_binary(headers):
        event_id = headers.get("ce-id")
        return [event_id] if event_id is not None else []
    return item_ids([body])


def item_ids(items: list[object]) -> list[str]:
    """The string IDs of a batch's items, valid or not."""
    ids = (item.get("id") if isinstance(item, dict) else None for item in items)
    return [event_id for event_id in ids if isinstance(event_id, str)]


def batch_items(media: str, body: object) -> list[object]:
    """The items of a POST /events/batch body (each still to be read with
    `read_item`): 1 to MAX_BATCH, else BadRequest 400 saying what a batch is."""
    if media == BATCHED:
        if not isinstance(body, list) or not 1 <= len(body) <= MAX_BATCH:
            raise BadRequest(
                400, "invalid", f"a CloudEvents batch is a JSON array of 1 to {MAX_BATCH} events"
            )
        return body
    if not isinstance(body, dict) or set(body) != {BATCH_FIELD}:
        raise BadRequest(400, "invalid", 'a batch is a JSON object {"events": [...]}')
    items = body[BATCH_FIELD]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise BadRequest(400, "invalid", f"events must be a list of 1 to {MAX_BATCH} events")
    return items


def read_item(media: str, item: object, index: int) -> Taken:
    """Item `index` of a batch of media type `media`; BadRequest 400 if it is not a
    valid event (its pointer under the item's place in the body)."""
    if media == BATCHED:
        return _structured(item, f"/{index}")
    return _plain(item, f"/{BATCH_FIELD}/{index}")


def invalid(exc: InvalidEvent, pointer: str | None, field: str | None = None) -> BadRequest:
    """400 "invalid event": the field as validation names it (or `field`), the
    problem, and the place in the body when it is in the body."""
    details: dict[str, Any] = {"field": exc.field if field is None else field}
    details["detail"] = exc.problem
    if pointer is not None:
        details["pointer"] = pointer
    return BadRequest(400, "invalid", "invalid event", **details)


def is_previous_order(obj: object) -> bool:
    """Whether a plain JSON event is an order of the previous release: an object with
    an order's fields and no type (a plain event without a type is an invalid event)."""
    return isinstance(obj, dict) and "type" not in obj and ("sku" in obj or "qty" in obj)


def _plain(obj: object, at: str) -> Taken:
    if is_previous_order(obj):
        return _order(obj, at)
    return _event(obj, at)


def _order(obj: object, at: str) -> Taken:
    try:
        order = validate_order(obj)
    except InvalidEvent as exc:
        raise invalid(exc, f"{at}/{exc.field}") from exc
    return Taken(Incoming.of_order(order), previous_canonical(order))


def _event(obj: object, at: str) -> Taken:
    try:
        return Taken(_incoming(obj))
    except InvalidEvent as exc:
        raise invalid(exc, at + exc.field) from exc


def _incoming(parsed: object) -> Incoming:
    """An event of a parsed body, validated with data up to the most any publisher
    may allow (InvalidEvent naming the place otherwise)."""
    return Incoming.of(*checked_event(parsed, max_data_bytes=MAX_DATA_BYTES_LIMIT, parsed=True))


def _structured(obj: object, at: str) -> Taken:
    try:
        fields = from_structured(obj)
        return Taken(_incoming(fields))
    except InvalidEvent as exc:
        place = _ATTRIBUTES.get(exc.field, exc.field)
        raise invalid(exc, at + place, place) from exc


def _binary(headers: Mapping[str, str], data: object) -> Taken:
    try:
        fields = from_binary(headers, data)
    except InvalidEvent as exc:
        raise invalid(exc, None) from exc  # a header
    try:
        return Taken(_incoming(fields))
    except InvalidEvent as exc:
        header = _HEADERS.get(exc.field)
        if header is not None:
            raise invalid(exc, None, header) from exc
        raise invalid(exc, exc.field.removeprefix("/data")) from exc  # the body is the data


# ---------------------------------------------------------------- for a framework of one's own

CLOUDEVENTS_MEDIA: Final = (STRUCTURED, BATCHED, JSON)  # JSON: binary mode


class InvalidRequest(InvalidEvent):
    """The request carries no events the sink would take.

    `field` names the place: a JSON pointer from the body's root (in a batch, under
    the item's index), a `ce-` header, or Content-Type; `problem` says what is wrong.
    `status` (400, or 415 for a media type not read) and `body` (a JSON object) are
    the sink's own answer to the same request, to be sent as they are (a 415 names
    the three media types read here, where each route of the sink names its own)."""

    def __init__(self, status: int, body: dict[str, Any], field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.status = status
        self.body = body


def read_cloudevents(
    content_type: str | None, headers: Mapping[str, str], body: bytes
) -> list[Event]:
    """The events of a CloudEvents HTTP request, validated as the sink validates them:
    one in structured mode (`application/cloudevents+json`), one in binary mode
    (`application/json` with `ce-specversion`, `ce-id`, `ce-source` and `ce-type`
    headers, `ce-partitionkey` for a key; the body is the data), or 1 to MAX_BATCH in
    batched mode (`application/cloudevents-batch+json`). `headers` are the request's
    (names in any letter case); `body` its bytes, read as strictly as the sink reads
    them (no repeated key, no number a double cannot hold).

    Each event is `{id, type, key?, data}` as receive_in and ack_body take it. A
    request with any invalid item is refused whole (the sink itself applies the
    items before it): InvalidRequest, an InvalidEvent naming the place. The body's
    size is the framework's to cap, as the sink caps it (shared.MAX_BODY_BYTES for
    one event, shared.MAX_BATCH_BODY_BYTES for a batch)."""
    # Names in any letter case, each kept (a header given twice is refused, not taken
    # at its last value).
    lowered = CIMultiDict(headers.items())
    try:
        media = media_of(content_type, CLOUDEVENTS_MEDIA)
    except BadRequest as exc:
        problem = f"{content_type!r} is none of {', '.join(CLOUDEVENTS_MEDIA)}"
        raise _refused(exc, "Content-Type", problem) from exc
    if media == JSON and not is_binary(lowered):
        # What the sink would read as a plain event is no CloudEvent.
        missing = InvalidEvent("ce-specversion", f"is required: {JSON} is read as binary mode")
        raise _refused(invalid(missing, None), missing.field, missing.problem) from None
    try:
        parsed = parse_json(body)
        if media != BATCHED:
            return [read_event(media, lowered, parsed).incoming.event]
        items = batch_items(media, parsed)
        return [read_item(media, item, index).incoming.event for index, item in enumerate(items)]
    except BadRequest as exc:
        raise _refused_body(exc) from exc


def _refused_body(exc: BadRequest) -> InvalidRequest:
    """A refusal of the body (its JSON, a batch's envelope, an event), naming its place."""
    details = exc.body
    if isinstance(exc.__cause__, InvalidEvent):  # an event: its pointer, else its header
        place = details.get("pointer", details["field"])
        return _refused(exc, str(place), str(details["detail"]))
    detail = details.get("detail")
    return _refused(exc, "", str(exc) if detail is None else f"{exc}: {detail}")


def _refused(exc: BadRequest, field: str, problem: str) -> InvalidRequest:
    return InvalidRequest(exc.status, exc.body, field, problem)
