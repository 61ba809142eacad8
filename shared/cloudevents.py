"""Events on the wire as CloudEvents 1.0 over the HTTP protocol binding.

The publisher sends each event in structured mode (`application/cloudevents+json`)
and a batch in batched mode (`application/cloudevents-batch+json`, a JSON array).
The sink reads those two and binary mode (`ce-*` headers, the data as the body).
The ordering key travels in the partitioning extension's `partitionkey`.

What identifies an event is its canonical form (shared.event): `source` and `time`
are not part of it (the relay sends the time the outbox recorded the event, the same
on every resend; another producer may send any), so they never make a conflict.

Encoding is text assembly around the stored canonical data (no parse, no dump on
the relay's path); decoding checks the envelope and returns the event dict that
shared.event validates. No I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from shared.errors import InvalidEvent

SPECVERSION: Final = "1.0"
STRUCTURED: Final = "application/cloudevents+json"
BATCHED: Final = "application/cloudevents-batch+json"
JSON: Final = "application/json"
HEADER_PREFIX: Final = "ce-"
# Attributes this system reads; any other extension attribute is allowed and ignored.
_REQUIRED: Final = ("specversion", "id", "source", "type")
SOURCE_MAX_CHARS: Final = 1024
_JSON_MEDIA: Final = re.compile(r"application/(?:[A-Za-z0-9.+-]+\+)?json", re.IGNORECASE)


def is_source(source: object) -> bool:
    """Whether `source` is a `source` attribute a sink takes (1 to SOURCE_MAX_CHARS
    characters)."""
    return isinstance(source, str) and 1 <= len(source) <= SOURCE_MAX_CHARS


def structured(
    event_id: str, event_type: str, key: str | None, data_text: str, source: str, time: str
) -> str:
    """One event as a structured-mode body. `data_text` is JSON text (the event's
    canonical data); `source` is any text (escaped here); id, type, key and time are
    of alphabets JSON writes as they are."""
    keyed = "" if key is None else f',"partitionkey":"{key}"'
    return (
        f'{{"specversion":"{SPECVERSION}","id":"{event_id}","source":{json.dumps(source)},'
        f'"type":"{event_type}","time":"{time}","datacontenttype":"{JSON}"{keyed},'
        f'"data":{data_text}}}'
    )


def batched(bodies: Sequence[str]) -> str:
    """Structured-mode bodies as one batched-mode body."""
    return "[" + ",".join(bodies) + "]"


def media_type(content_type: str | None) -> str:
    """The media type of a Content-Type value, lower case, without parameters."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_json_media(media: str) -> bool:
    """Whether a media type is JSON (application/json or any application/*+json)."""
    return _JSON_MEDIA.fullmatch(media) is not None


def from_structured(obj: object, at: str = "") -> dict[str, Any]:
    """The event `{id, type, key, data}` a parsed structured-mode CloudEvent carries,
    or InvalidEvent naming the attribute (a JSON pointer under `at`). The event's
    fields are validated by shared.event afterwards; this checks the envelope."""
    if not isinstance(obj, dict):
        raise InvalidEvent(at, "a CloudEvent must be a JSON object")
    return _event_of(obj, at, "data_base64" in obj)


def from_binary(headers: Mapping[str, str], data: object) -> dict[str, Any]:
    """The event of a binary-mode request: its `ce-*` headers and its parsed JSON body
    (the data). InvalidEvent names the header."""
    attributes: dict[str, object] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith(HEADER_PREFIX):
            attribute = lower.removeprefix(HEADER_PREFIX)
            if attribute in attributes:  # which one is meant cannot be told
                raise InvalidEvent(lower, "is given twice")
            attributes[attribute] = value
    attributes["data"] = data
    return _event_of(attributes, "", False, header=True)


def is_binary(headers: Mapping[str, str]) -> bool:
    """Whether a request is in binary mode (it names a spec version in a header)."""
    return "ce-specversion" in headers or "Ce-Specversion" in headers


def _event_of(
    attributes: Mapping[str, object], at: str, base64: bool, *, header: bool = False
) -> dict[str, Any]:
    def where(name: str) -> str:
        return f"{HEADER_PREFIX}{name}" if header else f"{at}/{name}"

    for name in _REQUIRED:
        if name not in attributes:
            raise InvalidEvent(where(name), "is a required CloudEvents attribute")
    if attributes["specversion"] != SPECVERSION:
        raise InvalidEvent(where("specversion"), f"must be {SPECVERSION!r}")
    if not is_source(attributes["source"]):
        raise InvalidEvent(where("source"), f"must be 1 to {SOURCE_MAX_CHARS} characters")
    if base64:
        raise InvalidEvent(where("data_base64"), "binary data is not taken: data must be JSON")
    content = attributes.get("datacontenttype")
    if content is not None and (
        not isinstance(content, str) or not is_json_media(media_type(content))
    ):
        raise InvalidEvent(where("datacontenttype"), "must be application/json")
    if "data" not in attributes:
        raise InvalidEvent(where("data"), "is required: an event's data is a JSON object")
    event: dict[str, Any] = {
        "id": attributes["id"],
        "type": attributes["type"],
        "data": attributes["data"],
    }
    if "partitionkey" in attributes:
        event["key"] = attributes["partitionkey"]
    return event
