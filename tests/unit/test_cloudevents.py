"""Events as CloudEvents 1.0 over HTTP: structured, batched and binary mode, written
and read back. Pure functions, no I/O."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from shared import InvalidEvent, checked_event
from shared.cloudevents import (
    BATCHED,
    JSON,
    SPECVERSION,
    STRUCTURED,
    batched,
    from_binary,
    from_structured,
    is_binary,
    is_json_media,
    media_type,
    structured,
)
from shared.event import canonical_parts

SOURCE = "urn:outbox-relay:publisher"
TIME = "2025-01-02T03:04:05.678Z"
EVENT: dict[str, Any] = {
    "id": "evt-1",
    "type": "payment.captured",
    "key": "customer-7",
    "data": {"amount": 5, "note": 'say "caf\u00e9" \U0001d11e\n'},
}
KEYLESS: dict[str, Any] = {name: value for name, value in EVENT.items() if name != "key"}
ENVELOPE: dict[str, Any] = {
    "specversion": "1.0",
    "id": "evt-1",
    "source": SOURCE,
    "type": "payment.captured",
    "data": {"amount": 5},
}
HEADERS: dict[str, str] = {
    "ce-specversion": "1.0",
    "ce-id": "evt-1",
    "ce-source": SOURCE,
    "ce-type": "payment.captured",
}

ALPHABET = string.ascii_letters + string.digits + "._:-"
events = st.fixed_dictionaries(
    {
        "id": st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True),
        "type": st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True),
        "data": st.dictionaries(
            st.text(max_size=5),
            st.recursive(
                st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3)
                ),
                max_leaves=8,
            ),
            max_size=4,
        ),
    },
    optional={"key": st.text(alphabet=ALPHABET, min_size=1, max_size=20)},
)


def wire(event: dict[str, Any], source: str = SOURCE) -> str:
    """The structured-mode body the publisher sends for a valid event."""
    checked, _ = checked_event(event)
    data_text, _ = canonical_parts(checked)
    return structured(event["id"], event["type"], event.get("key"), data_text, source, TIME)


def refused_structured(obj: object, at: str = "") -> InvalidEvent:
    with pytest.raises(InvalidEvent) as excinfo:
        from_structured(obj, at)
    return excinfo.value


def refused_binary(headers: dict[str, str], data: object = None) -> InvalidEvent:
    with pytest.raises(InvalidEvent) as excinfo:
        from_binary(headers, {} if data is None else data)
    return excinfo.value


# ---------------------------------------------------------------- structured mode


def test_media_types_are_those_of_cloudevents_1_0() -> None:
    assert (SPECVERSION, STRUCTURED, BATCHED, JSON) == (
        "1.0",
        "application/cloudevents+json",
        "application/cloudevents-batch+json",
        "application/json",
    )


def test_a_structured_body_is_a_cloudevent_in_json() -> None:
    assert json.loads(wire(EVENT)) == {
        "specversion": "1.0",
        "id": "evt-1",
        "source": SOURCE,
        "type": "payment.captured",
        "time": TIME,
        "datacontenttype": "application/json",
        "partitionkey": "customer-7",
        "data": EVENT["data"],
    }


def test_an_event_without_key_has_no_partitionkey() -> None:
    assert "partitionkey" not in json.loads(wire(KEYLESS))


def test_the_data_is_written_as_the_canonical_data_text() -> None:
    body = wire({**KEYLESS, "data": {"b": 1, "a": [1.0, "\U0001d11e"]}})
    assert body.endswith(',"data":{"a":[1,"\U0001d11e"],"b":1}}')


@pytest.mark.parametrize("event", [EVENT, KEYLESS], ids=["keyed", "keyless"])
def test_a_structured_body_reads_back_as_its_event(event: dict[str, Any]) -> None:
    assert from_structured(json.loads(wire(event))) == event


@pytest.mark.parametrize(
    "source",
    [
        'urn:"quoted"',
        "back\\slash",
        "line\nbreak\ttab\x00nul",
        "caf\u00e9 \U0001d11e \u2028",
        "https://example.com/a?b=c&d=\u00e9",
        "x" * 1024,
    ],
)
def test_a_source_that_needs_escaping_is_written_as_json(source: str) -> None:
    body = wire(EVENT, source)
    parsed = json.loads(body)
    assert parsed["source"] == source
    assert from_structured(parsed) == EVENT


@given(event=events)
def test_any_event_survives_the_structured_round_trip(event: dict[str, Any]) -> None:
    _, canonical = checked_event(event)
    read = from_structured(json.loads(wire(event)))
    assert read == event
    assert checked_event(read)[1] == canonical


# ---------------------------------------------------------------- batched mode


def test_a_batch_is_a_json_array_of_structured_events() -> None:
    bodies = [wire(EVENT), wire(KEYLESS), wire({**EVENT, "id": "evt-2"})]
    parsed = json.loads(batched(bodies))
    assert parsed == [json.loads(body) for body in bodies]
    read = [from_structured(item, f"/{index}") for index, item in enumerate(parsed)]
    assert read == [EVENT, KEYLESS, {**EVENT, "id": "evt-2"}]


def test_a_batch_of_one_and_of_none() -> None:
    assert batched([wire(EVENT)]) == f"[{wire(EVENT)}]"
    assert batched([]) == "[]"


# ---------------------------------------------------------------- reading structured mode


@pytest.mark.parametrize("obj", [[], [ENVELOPE], "x", None, 1, True])
def test_a_cloudevent_that_is_not_an_object_is_refused(obj: object) -> None:
    assert refused_structured(obj, "/2").field == "/2"
    assert refused_structured(obj).field == ""


@pytest.mark.parametrize("name", ["specversion", "id", "source", "type"])
def test_a_missing_required_attribute_is_named(name: str) -> None:
    envelope = {key: value for key, value in ENVELOPE.items() if key != name}
    error = refused_structured(envelope)
    assert error.field == f"/{name}"
    assert error.problem == "is a required CloudEvents attribute"
    assert refused_structured(envelope, "/7").field == f"/7/{name}"


@pytest.mark.parametrize("version", ["0.3", "1", "1.0.0", " 1.0", 1.0, 1, None])
def test_another_specversion_is_refused(version: object) -> None:
    error = refused_structured({**ENVELOPE, "specversion": version})
    assert error.field == "/specversion"
    assert error.problem == "must be '1.0'"


@pytest.mark.parametrize("source", ["", "x" * 1025, 7, None, ["urn:a"]])
def test_a_bad_source_is_refused(source: object) -> None:
    assert refused_structured({**ENVELOPE, "source": source}).field == "/source"


def test_data_base64_is_refused() -> None:
    envelope = {key: value for key, value in ENVELOPE.items() if key != "data"}
    error = refused_structured({**envelope, "data_base64": "e30="})
    assert error.field == "/data_base64"
    assert refused_structured({**ENVELOPE, "data_base64": "e30="}).field == "/data_base64"


def test_missing_data_is_refused() -> None:
    envelope = {key: value for key, value in ENVELOPE.items() if key != "data"}
    assert refused_structured(envelope).field == "/data"


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/xml", "application/jsonp", "text/json", "", 7],
)
def test_data_that_is_not_json_is_refused(content_type: object) -> None:
    error = refused_structured({**ENVELOPE, "datacontenttype": content_type})
    assert error.field == "/datacontenttype"
    assert error.problem == "must be application/json"


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        "application/vnd.example+json",
        "application/cloudevents+json",
    ],
)
def test_json_data_of_any_json_media_type_is_taken(content_type: str) -> None:
    read = from_structured({**ENVELOPE, "datacontenttype": content_type})
    assert read["data"] == {"amount": 5}


def test_a_null_datacontenttype_is_as_if_absent() -> None:
    # CloudEvents JSON format: null for an optional attribute means it is not there.
    assert from_structured({**ENVELOPE, "datacontenttype": None}) == from_structured(ENVELOPE)


def test_other_attributes_are_ignored() -> None:
    extended = {**ENVELOPE, "time": "x", "subject": "s", "traceparent": "00-ab", "dataschema": 1}
    assert from_structured(extended) == from_structured(ENVELOPE)


def test_partitionkey_is_the_key() -> None:
    assert from_structured({**ENVELOPE, "partitionkey": "k-1"})["key"] == "k-1"
    assert "key" not in from_structured(ENVELOPE)


def test_the_event_fields_are_validated_afterwards_not_here() -> None:
    # The envelope passes id, type and partitionkey on as they are; validation of
    # the event names them by the event's pointers.
    read = from_structured({**ENVELOPE, "id": 7, "partitionkey": None, "data": []})
    assert read == {"id": 7, "type": "payment.captured", "key": None, "data": []}
    with pytest.raises(InvalidEvent) as excinfo:
        checked_event(read)
    assert excinfo.value.field == "/id"


# ---------------------------------------------------------------- binary mode


def test_a_binary_request_reads_as_its_event() -> None:
    headers = {**HEADERS, "ce-partitionkey": "customer-7", "Content-Type": "application/json"}
    assert from_binary(headers, {"amount": 5}) == {
        "id": "evt-1",
        "type": "payment.captured",
        "key": "customer-7",
        "data": {"amount": 5},
    }


def test_a_binary_request_without_partitionkey_has_no_key() -> None:
    assert "key" not in from_binary(HEADERS, {})


def test_header_names_are_case_insensitive() -> None:
    headers = {
        "CE-SPECVERSION": "1.0",
        "Ce-Id": "evt-1",
        "ce-Source": SOURCE,
        "cE-tYPE": "t",
        "Ce-PartitionKey": "k",
    }
    assert from_binary(headers, {"a": 1}) == {
        "id": "evt-1",
        "type": "t",
        "key": "k",
        "data": {"a": 1},
    }


def test_headers_as_aiohttp_gives_them_are_read() -> None:
    headers = CIMultiDictProxy(CIMultiDict({**HEADERS, "Ce-Partitionkey": "k"}))
    assert from_binary(headers, {})["key"] == "k"


@pytest.mark.parametrize("name", ["ce-id", "ce-partitionkey", "ce-type"])
def test_an_attribute_in_two_headers_is_refused_not_taken_at_its_last_value(name: str) -> None:
    headers = CIMultiDict({**HEADERS, "ce-partitionkey": "k1"})
    headers.add(name.upper(), "other-2")
    error = refused_binary(headers)
    assert (error.field, error.problem) == (name, "is given twice")


def test_the_body_is_the_data_not_a_header() -> None:
    assert from_binary({**HEADERS, "ce-data": "header"}, {"from": "body"})["data"] == {
        "from": "body"
    }


@pytest.mark.parametrize("name", ["specversion", "id", "source", "type"])
def test_a_missing_required_header_is_named(name: str) -> None:
    headers = {key: value for key, value in HEADERS.items() if key != f"ce-{name}"}
    error = refused_binary(headers)
    assert error.field == f"ce-{name}"
    assert error.problem == "is a required CloudEvents attribute"


def test_a_header_without_the_ce_prefix_is_not_an_attribute() -> None:
    headers = {key: value for key, value in HEADERS.items() if key != "ce-id"}
    assert refused_binary({**headers, "id": "evt-1", "ceid": "evt-1"}).field == "ce-id"


@pytest.mark.parametrize("version", ["0.3", "1", "", "1.0 "])
def test_another_specversion_header_is_refused(version: str) -> None:
    error = refused_binary({**HEADERS, "ce-specversion": version})
    assert error.field == "ce-specversion"
    assert error.problem == "must be '1.0'"


@pytest.mark.parametrize("content_type", ["text/plain", "application/octet-stream", ""])
def test_a_datacontenttype_header_that_is_not_json_is_refused(content_type: str) -> None:
    error = refused_binary({**HEADERS, "ce-datacontenttype": content_type})
    assert error.field == "ce-datacontenttype"


def test_an_empty_source_header_is_refused() -> None:
    assert refused_binary({**HEADERS, "ce-source": ""}).field == "ce-source"


@given(event=events)
def test_any_event_survives_binary_mode(event: dict[str, Any]) -> None:
    _, canonical = checked_event(event)
    headers = {**HEADERS, "ce-id": event["id"], "ce-type": event["type"]}
    if "key" in event:
        headers["ce-partitionkey"] = event["key"]
    data = json.loads(json.dumps(event["data"]))
    assert checked_event(from_binary(headers, data))[1] == canonical


@pytest.mark.parametrize(
    ("headers", "binary"),
    [
        ({"ce-specversion": "1.0"}, True),
        ({"Ce-Specversion": "1.0"}, True),
        ({"Content-Type": "application/json"}, False),
        ({"ce-id": "evt-1"}, False),
        ({}, False),
    ],
)
def test_is_binary_looks_for_the_specversion_header(headers: dict[str, str], binary: bool) -> None:
    assert is_binary(headers) is binary


@pytest.mark.parametrize("name", ["ce-specversion", "CE-SPECVERSION", "Ce-SpecVersion"])
def test_is_binary_on_aiohttp_headers_ignores_case(name: str) -> None:
    assert is_binary(CIMultiDictProxy(CIMultiDict({name: "1.0"})))


# ---------------------------------------------------------------- media types


@pytest.mark.parametrize(
    ("content_type", "media"),
    [
        ("application/json", "application/json"),
        ("Application/JSON; charset=utf-8", "application/json"),
        (" application/cloudevents+json ;charset=UTF-8", "application/cloudevents+json"),
        ("text/plain;a=b;c=d", "text/plain"),
        ("", ""),
        (None, ""),
    ],
)
def test_media_type_is_lower_case_without_parameters(content_type: str | None, media: str) -> None:
    assert media_type(content_type) == media


@pytest.mark.parametrize(
    ("media", "is_json"),
    [
        ("application/json", True),
        ("APPLICATION/JSON", True),
        ("application/cloudevents+json", True),
        ("application/cloudevents-batch+json", True),
        ("application/vnd.api+json", True),
        ("application/x+json", True),
        ("application/+json", False),
        ("application/jsonp", False),
        ("application/json-seq", False),
        ("application/json; charset=utf-8", False),  # parameters are media_type's to cut
        ("text/json", False),
        ("text/plain", False),
        ("application/xml", False),
        ("json", False),
        ("", False),
    ],
)
def test_is_json_media(media: str, is_json: bool) -> None:
    assert is_json_media(media) is is_json
