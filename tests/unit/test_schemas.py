"""Per-type schemas of event data: loaded from real files in tmp_path, checked offline."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from shared import schemas as schemas_module
from shared.errors import InvalidEvent
from shared.schemas import DRAFT_2020_12, PROBLEM_MAX_CHARS, SchemaError, Schemas

PAYMENT = "payment.captured"
REFUND = "refund.issued"

PAYMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["amount", "currency"],
    "properties": {
        "amount": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "customer": {
            "type": "object",
            "properties": {"id": {"type": "string"}},
        },
        "items": {
            "type": "array",
            "items": {"type": "object", "required": ["sku"]},
        },
        "paths": {
            "type": "object",
            "properties": {"a/b": {"properties": {"m~n": {"type": "integer"}}}},
            "additionalProperties": {"type": "integer"},
        },
        "email": {"type": "string", "format": "email"},
        "legacy": False,
        "note": {"type": "string", "maxLength": 8},
        "refund": {"$ref": "#/$defs/refund"},
    },
    "$defs": {"refund": {"type": "object", "required": ["reason"]}},
}
REFUND_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT_2020_12,
    "type": "object",
    "required": ["payment"],
}
VALID: dict[str, Any] = {"amount": 250, "currency": "EUR", "customer": {"id": "c-9"}}


def write(folder: Path, name: str, content: object) -> Path:
    """A file `name` in `folder`: `content` as it is when it is text or bytes, else as
    JSON."""
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content), "utf-8")
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A schema directory with two schemas."""
    write(tmp_path, f"{PAYMENT}.json", PAYMENT_SCHEMA)
    write(tmp_path, f"{REFUND}.json", REFUND_SCHEMA)
    return tmp_path


@pytest.fixture
def schemas(folder: Path) -> Schemas:
    return Schemas.load(folder)


def refused(schemas: Schemas, data: object, event_type: str = PAYMENT) -> InvalidEvent:
    """The InvalidEvent that `schemas` raises for `data`."""
    with pytest.raises(InvalidEvent) as excinfo:
        schemas.check(event_type, data)
    return excinfo.value


def refused_at_load(folder: Path, *, strict: bool = False) -> str:
    """The message of the SchemaError that loading `folder` raises."""
    with pytest.raises(SchemaError) as excinfo:
        Schemas.load(folder, strict=strict)
    return str(excinfo.value)


@pytest.fixture
def network_used(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every connection and name lookup tried while the test runs: each is recorded,
    then refused (recorded first, since a library may turn the refusal into an error
    that looks like any other)."""
    attempts: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise OSError("a unit test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


# ---------------------------------------------------------------------- loading


def test_load_reads_every_schema_of_the_directory(folder: Path) -> None:
    schemas = Schemas.load(str(folder))
    assert schemas.types == {PAYMENT, REFUND}
    assert schemas.strict is False
    assert Schemas.load(folder, strict=True).strict is True


def test_hidden_files_are_ignored(folder: Path) -> None:
    write(folder, ".gitkeep", "")
    write(folder, ".payment.captured.json.swp", "not JSON")
    assert Schemas.load(folder).types == {PAYMENT, REFUND}


def test_an_empty_directory_has_no_schemas(tmp_path: Path) -> None:
    assert Schemas.load(tmp_path).types == frozenset()


def test_an_empty_name_is_no_directory_not_the_current_one(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(folder)  # schemas here, which an empty name must not find
    with pytest.raises(SchemaError, match="empty path"):
        Schemas.load("")


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("payment captured.json", {}, "is not an event type (1-128 of A-Z a-z 0-9 . _ -)"),
        ("payment:captured.json", {}, "is not an event type"),
        ("x" * 129 + ".json", {}, "is not an event type"),
        ("payment.captured.jsn", {}, "not a schema file: schema files are named TYPE.json"),
        ("README.md", "# schemas", "not a schema file"),
        ("payment.captured.json", '{"type": "object",}', "not JSON: Expecting property name"),
        ("payment.captured.json", b'{"title": "\xff"}', "not JSON: 'utf-8' codec can't decode"),
        ("payment.captured.json", {"type": "strin"}, "not a valid JSON Schema 2020-12: at /type"),
        ("payment.captured.json", {"required": "amount"}, "at /required: type:"),
        ("payment.captured.json", {"pattern": "(["}, "at /pattern: format:"),
        ("payment.captured.json", [], "not a valid JSON Schema 2020-12: at the top: type:"),
        (
            "payment.captured.json",
            {"$schema": "http://json-schema.org/draft-07/schema#"},
            "$schema is 'http://json-schema.org/draft-07/schema#': only 2020-12 is used",
        ),
        ("payment.captured.json", {"$schema": 2020}, "$schema is 2020: only 2020-12 is used"),
        # Python's `re` reads these; ECMA-262, the patterns of 2020-12, does not.
        (
            "payment.captured.json",
            {"pattern": "\\Z"},
            '(jsonschema-rs): at /pattern: "\\\\Z" is not a "regex"',
        ),
        (
            "payment.captured.json",
            {"properties": {"a/b": {"pattern": "a{,3}"}}},
            "(jsonschema-rs): at /properties/a~1b/pattern: ",
        ),
    ],
)
def test_a_file_that_cannot_be_used_is_refused_by_name(
    tmp_path: Path, name: str, content: object, says: str
) -> None:
    write(tmp_path, f"{REFUND}.json", REFUND_SCHEMA)
    path = write(tmp_path, name, content)
    message = refused_at_load(tmp_path)
    assert message.startswith(f"{path}: ")
    assert says in message
    assert "\n" not in message


def test_a_subdirectory_is_refused(folder: Path) -> None:
    (folder / "old").mkdir()
    assert (
        refused_at_load(folder)
        == f"{folder / 'old'}: not a schema file: schema files are named TYPE.json"
    )


def test_a_file_that_cannot_be_read_is_refused(folder: Path) -> None:
    (folder / "order.placed.json").mkdir()  # named like a schema, read like none
    assert (
        refused_at_load(folder) == f"{folder / 'order.placed.json'}: cannot be read: Is a directory"
    )


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "schemas"
    assert refused_at_load(missing) == (
        f"{missing}: cannot read the schema directory: No such file or directory"
    )


def test_a_file_is_no_schema_directory(folder: Path) -> None:
    path = folder / f"{PAYMENT}.json"
    assert refused_at_load(path) == f"{path}: cannot read the schema directory: Not a directory"


@pytest.mark.parametrize(
    "content",
    [
        {"$ref": "#"},
        {
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
            "$ref": "#/$defs/a",
        },
        '{"allOf": [' * 5_000 + "{}" + "]}" * 5_000,
    ],
    ids=["ref-loop", "ref-loop-through-defs", "deep"],
)
def test_a_schema_without_end_is_refused(tmp_path: Path, content: object) -> None:
    path = write(tmp_path, f"{PAYMENT}.json", content)
    assert refused_at_load(tmp_path) == f"{path}: nested too deeply, or a $ref loops without end"


def test_a_recursive_schema_that_follows_the_data_is_loaded(tmp_path: Path) -> None:
    write(
        tmp_path,
        f"{PAYMENT}.json",
        {"type": "object", "properties": {"parent": {"$ref": "#"}, "n": {"type": "integer"}}},
    )
    schemas = Schemas.load(tmp_path)
    schemas.check(PAYMENT, {"parent": {"parent": {"n": 1}}})
    assert refused(schemas, {"parent": {"parent": {"n": "1"}}}).field == "/data/parent/parent/n"


def test_the_2020_12_draft_may_be_named_with_its_empty_fragment(tmp_path: Path) -> None:
    write(tmp_path, f"{REFUND}.json", {**REFUND_SCHEMA, "$schema": DRAFT_2020_12 + "#"})
    assert Schemas.load(tmp_path).types == {REFUND}


# ---------------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"$ref": "https://example.com/money.json"}, "$ref 'https://example.com/money.json'"),
        ({"properties": {"a": {"$ref": "money.json#/$defs/eur"}}}, "$ref 'money.json#/$defs/eur'"),
        ({"$defs": {"unused": {"$ref": "urn:example:money"}}}, "$ref 'urn:example:money'"),
        ({"items": {"$dynamicRef": "https://example.com/x#node"}}, "$dynamicRef"),
        # The base of a relative reference is the nearest $id: here another URL.
        (
            {"$id": "https://example.com/p.json", "$ref": "money.json"},
            "$ref 'money.json' is outside the file",
        ),
        # ... also an $id further down: root.json here is https://example.com/sub/root.json.
        (
            {
                "$id": "https://example.com/root.json",
                "$defs": {"a": {"$id": "sub/a.json", "items": {"$ref": "root.json"}}},
            },
            "$ref 'root.json' is outside the file",
        ),
    ],
)
def test_a_reference_outside_the_file_is_refused_without_touching_the_network(
    tmp_path: Path, network_used: list[object], schema: dict[str, Any], says: str
) -> None:
    path = write(tmp_path, f"{PAYMENT}.json", schema)
    message = refused_at_load(tmp_path)
    assert message.startswith(f"{path}: {says}")
    assert message.endswith(
        "is outside the file: references are resolved within their own file and never fetched"
    )
    assert network_used == []


def test_the_network_guard_sees_a_connection(network_used: list[object]) -> None:
    """The guard of the test above would notice a connection (to loopback here, in
    case the guard itself fails)."""
    with socket.socket() as sock, pytest.raises(OSError):
        sock.connect(("127.0.0.1", 9))
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    assert len(network_used) == 2


@pytest.fixture
def schema_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on loopback that serves `{"type": "integer"}` at every path: its
    URL, and the path of each request it gets. jsonschema-rs fetches with a client of
    its own in Rust, which the socket guard of Python (`network_used`) never sees."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = b'{"type": "integer"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    for proxy in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)  # the request must come here
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", asked
    server.shutdown()
    server.server_close()
    thread.join()


def test_the_fast_validator_never_fetches(
    tmp_path: Path, schema_server: tuple[str, list[str]]
) -> None:
    """Behind the reference check of `load` (above), jsonschema-rs is built offline: a
    remote reference that reached it would be refused, not fetched."""
    url, asked = schema_server
    path = tmp_path / f"{PAYMENT}.json"
    with pytest.raises(SchemaError) as excinfo:
        schemas_module._fast(path, {"$ref": f"{url}/money.json"})
    assert str(excinfo.value).startswith(f"{path}: not a valid JSON Schema 2020-12 (jsonschema-rs)")
    assert "Retrieval is disabled" in str(excinfo.value)
    assert asked == []


def test_the_schema_server_sees_what_jsonschema_rs_fetches_by_default(
    schema_server: tuple[str, list[str]], network_used: list[object]
) -> None:
    """The guard of the test above would notice a fetch, which Python's cannot."""
    url, asked = schema_server
    validator = jsonschema_rs.Draft202012Validator({"$ref": f"{url}/money.json"})
    assert (validator.is_valid(1), validator.is_valid("1")) == (True, False)
    assert asked == ["/money.json"]
    assert network_used == []


@pytest.mark.parametrize("ref", ["#/$defs/nothing", "#no-such-anchor"])
def test_a_reference_to_nothing_in_the_file_is_refused(tmp_path: Path, ref: str) -> None:
    path = write(
        tmp_path, f"{PAYMENT}.json", {"$defs": {"a": {}}, "properties": {"a": {"$ref": ref}}}
    )
    assert refused_at_load(tmp_path) == f"{path}: $ref {ref!r} points to nothing in the file"


def test_references_inside_the_file_are_followed(
    tmp_path: Path, network_used: list[object]
) -> None:
    write(
        tmp_path,
        f"{PAYMENT}.json",
        {
            "$id": "https://schemas.example/payment.json",
            "$defs": {
                "id": {"$anchor": "id", "type": "string"},
                "amount": {"$id": "amount.json", "type": "integer"},
            },
            "properties": {
                "customer": {"$ref": "#id"},
                "amount": {"$ref": "amount.json"},
                "self": {"$ref": "https://schemas.example/payment.json#/$defs/id"},
            },
        },
    )
    schemas = Schemas.load(tmp_path)
    schemas.check(PAYMENT, {"customer": "c-9", "amount": 5, "self": "x"})
    assert refused(schemas, {"amount": "5"}).field == "/data/amount"
    assert refused(schemas, {"self": 1}).field == "/data/self"
    assert network_used == []


# ---------------------------------------------------------------------- checking


def test_valid_data_passes(schemas: Schemas) -> None:
    schemas.check(PAYMENT, VALID)
    schemas.check(PAYMENT, {**VALID, "items": [{"sku": "a"}], "paths": {"a/b": {"m~n": 1}}})
    schemas.check(REFUND, {"payment": "p-123"})


def test_a_missing_required_property_is_named_at_data(schemas: Schemas) -> None:
    error = refused(schemas, {"amount": 250})
    assert error.field == "/data"
    assert error.problem == (
        "does not match the schema of 'payment.captured': required:"
        " 'currency' is a required property"
    )
    assert str(error) == f"/data: {error.problem}"


def test_a_nested_wrong_type_is_named_by_its_pointer(schemas: Schemas) -> None:
    error = refused(schemas, {**VALID, "customer": {"id": 9}})
    assert error.field == "/data/customer/id"
    assert error.problem == (
        "does not match the schema of 'payment.captured': type: 9 is not of type 'string'"
    )


def test_the_rule_is_the_keyword_that_failed(schemas: Schemas) -> None:
    assert refused(schemas, {**VALID, "amount": 1_000_001}).problem.endswith(
        ": maximum: 1000001 is greater than the maximum of 1000000"
    )
    assert (
        ": pattern: 'eur' does not match " in refused(schemas, {**VALID, "currency": "eur"}).problem
    )


def test_the_false_schema_is_named_as_the_rule(schemas: Schemas) -> None:
    error = refused(schemas, {**VALID, "legacy": 1})
    assert (error.field, error.problem) == (
        "/data/legacy",
        "does not match the schema of 'payment.captured': false: False schema does not allow 1",
    )


@pytest.mark.parametrize(
    ("schema", "data", "pointer"),
    [
        ({"properties": {"a": {"allOf": [False]}}}, {"a": 1}, "/data/a"),
        ({"patternProperties": {"^x-": False}}, {"ok": 1, "x-a": 1}, "/data/x-a"),
        (
            {"properties": {"pair": {"prefixItems": [True, False]}}},
            {"pair": [1, 2]},
            "/data/pair/1",
        ),
        ({"prefixItems": [{"type": "integer"}, False]}, [1, 2, 3], "/data/1"),
    ],
)
def test_a_false_schema_is_named_at_its_place(
    tmp_path: Path, schema: dict[str, Any], data: object, pointer: str
) -> None:
    write(tmp_path, f"{PAYMENT}.json", schema)
    error = refused(Schemas.load(tmp_path), data)
    assert (error.field, error.problem.split(": ")[1]) == (pointer, "false")


def test_beside_a_false_schema_the_others_are_checked(tmp_path: Path) -> None:
    write(
        tmp_path,
        f"{PAYMENT}.json",
        {
            "properties": {"legacy": False, "n": {"type": "integer"}},
            "patternProperties": {"^x-": False, "^y-": {"type": "string"}},
            "prefixItems": [{"type": "string"}, False],
        },
    )
    schemas = Schemas.load(tmp_path)
    schemas.check(PAYMENT, {"n": 1, "y-a": "text"})
    schemas.check(PAYMENT, ["a"])  # no second item for the `false` to refuse
    assert refused(schemas, {"n": "1"}).field == "/data/n"
    assert refused(schemas, {"y-a": 1}).field == "/data/y-a"
    assert refused(schemas, [1]).field == "/data/0"
    assert refused(schemas, ["a", "b"]).field == "/data/1"


# `false` under each keyword whose failures schemas.py places itself, beside other rules,
# and again in each item and each other property.
FALSES: dict[str, Any] = {
    "properties": {
        "legacy": False,
        "n": {"type": "integer"},
        "pair": {"prefixItems": [{"type": "string"}, False]},
    },
    "patternProperties": {"^x-": False, "^y-": {"type": "string"}},
    "additionalProperties": {"$ref": "#"},
    "items": {"$ref": "#"},
}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(["", "s"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["legacy", "n", "pair", "x-a", "y-b", "a/b"]), inner)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def falses(tmp_path_factory: pytest.TempPathFactory) -> Schemas:
    folder = tmp_path_factory.mktemp("falses")
    write(folder, f"{PAYMENT}.json", FALSES)
    return Schemas.load(folder)


@given(data=json_values)
def test_a_false_schema_changes_no_verdict_and_names_a_place_in_the_data(
    falses: Schemas, data: object
) -> None:
    valid = Draft202012Validator(FALSES).is_valid(data)
    try:
        falses.check(PAYMENT, data)
    except InvalidEvent as error:
        assert not valid
        place: Any = {"data": data}
        for escaped in error.field.split("/")[1:]:
            token = escaped.replace("~1", "/").replace("~0", "~")
            place = place[int(token)] if isinstance(place, list) else place[token]
    else:
        assert valid


def test_a_reference_is_checked_at_the_place_of_the_data(schemas: Schemas) -> None:
    error = refused(schemas, {**VALID, "refund": {}})
    assert error.field == "/data/refund"
    assert error.problem.endswith(": required: 'reason' is a required property")


@pytest.mark.parametrize(
    ("paths", "pointer"),
    [
        ({"a/b": {"m~n": "x"}}, "/data/paths/a~1b/m~0n"),
        # `~` is escaped before `/`: the other order would make `~1` of `/`, then `~01`.
        ({"x~/y": "x"}, "/data/paths/x~0~1y"),
        ({"~1": "x"}, "/data/paths/~01"),
        ({"": "x"}, "/data/paths/"),
    ],
)
def test_pointer_tokens_are_escaped(schemas: Schemas, paths: object, pointer: str) -> None:
    error = refused(schemas, {**VALID, "paths": paths})
    assert (error.field, error.problem.split(": ")[1]) == (pointer, "type")


def test_an_array_index_is_a_pointer_token(schemas: Schemas) -> None:
    error = refused(schemas, {**VALID, "items": [{"sku": "a"}, {"sku": "b"}, {"qty": 1}]})
    assert error.field == "/data/items/2"
    assert error.problem.endswith(": required: 'sku' is a required property")


def test_of_several_failures_the_same_one_is_named_every_time(schemas: Schemas) -> None:
    data = {"amount": "many", "customer": {"id": 9}, "items": [{}]}
    named = {str(refused(schemas, data)) for _ in range(5)}
    # best_match ranks a failure nearer the top of the data first.
    assert named == {
        "/data: does not match the schema of 'payment.captured': required:"
        " 'currency' is a required property"
    }


def test_the_nearest_failure_to_the_top_is_named_not_the_first_found(tmp_path: Path) -> None:
    write(
        tmp_path,
        f"{PAYMENT}.json",
        {
            "properties": {"customer": {"properties": {"id": {"type": "string"}}}},
            "required": ["amount"],
        },
    )
    error = refused(Schemas.load(tmp_path), {"customer": {"id": 9}})
    assert (error.field, error.problem.split(": ")[1]) == ("/data", "required")


def test_inside_any_of_the_most_precise_failure_is_named(tmp_path: Path) -> None:
    amount = {
        "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": "^[0-9]+$"}]
    }
    write(tmp_path, f"{PAYMENT}.json", {"properties": {"amount": amount}})
    error = refused(Schemas.load(tmp_path), {"amount": 0})
    assert (error.field, error.problem) == (
        "/data/amount",
        "does not match the schema of 'payment.captured': minimum: 0 is less than the minimum of 1",
    )


def test_the_validators_message_is_bounded(schemas: Schemas) -> None:
    error = refused(schemas, {**VALID, "note": "x" * 10_000})
    assert error.problem.startswith(
        "does not match the schema of 'payment.captured': maxLength: 'xxxx"
    )
    assert error.problem.endswith("x...")
    assert (
        len(error.problem)
        == len("does not match the schema of 'payment.captured': maxLength: ") + PROBLEM_MAX_CHARS
    )


def test_data_that_is_not_an_object_is_named_at_data(schemas: Schemas) -> None:
    error = refused(schemas, [VALID])
    assert (error.field, error.problem.split(": ")[1]) == ("/data", "type")


def test_formats_are_annotations_only(schemas: Schemas) -> None:
    schemas.check(PAYMENT, {**VALID, "email": "not an address"})


def test_strict_refuses_a_type_without_a_schema(folder: Path) -> None:
    error = refused(Schemas.load(folder, strict=True), VALID, event_type="x.y")
    assert (error.field, error.problem) == ("/type", "has no schema (strict types): 'x.y'")


def test_strict_still_checks_the_types_with_a_schema(folder: Path) -> None:
    strict = Schemas.load(folder, strict=True)
    strict.check(REFUND, {"payment": "p-1"})
    assert refused(strict, {}, event_type=REFUND).field == "/data"


def test_not_strict_passes_a_type_without_a_schema(schemas: Schemas) -> None:
    schemas.check("x.y", {"anything": ["at", "all"]})
    schemas.check("x.y", "not even an object")


def test_none_passes_anything() -> None:
    schemas = Schemas.none()
    assert (schemas.types, schemas.strict) == (frozenset(), False)
    for event_type in (PAYMENT, "x.y", ""):
        schemas.check(event_type, {"amount": "many"})
        schemas.check(event_type, None)


# ---------------------------------------------------------------------- the two validators


def test_valid_data_never_reaches_the_precise_validator(
    schemas: Schemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jsonschema-rs alone passes valid data (the ~500 us of jsonschema are not spent)."""

    def unreachable(*args: object) -> Iterator[object]:
        raise AssertionError("the precise validator was asked")

    monkeypatch.setattr(schemas_module._Validator, "iter_errors", unreachable)
    schemas.check(PAYMENT, VALID)
    schemas.check(REFUND, {"payment": "p-123"})
    with pytest.raises(AssertionError, match="precise validator was asked"):
        schemas.check(PAYMENT, {"amount": 250})


@pytest.mark.parametrize(
    ("schema", "data", "place"),
    [
        # Python's `$` also matches before a final newline; ECMA-262's only at the end.
        (PAYMENT_SCHEMA, {**VALID, "currency": "EUR\n"}, "/data/currency"),
        # Python's `\d` and `\w` are Unicode; ECMA-262's are ASCII.
        (
            {"properties": {"n": {"pattern": "^\\d+$"}}},
            {"n": "\u0663"},
            "/data/n",
        ),  # ARABIC-INDIC 3
        ({"properties": {"n": {"pattern": "^\\w+$"}}}, {"n": "caf\u00e9"}, "/data/n"),
    ],
    ids=["dollar-before-newline", "unicode-digit", "unicode-word"],
)
def test_where_only_pythons_re_accepts_the_data_the_pattern_is_named(
    tmp_path: Path, schema: dict[str, Any], data: object, place: str
) -> None:
    """Patterns are matched by jsonschema-rs's engine in both validators, so a string
    only Python's re would take is refused at its place, by its rule."""
    assert Draft202012Validator(schema).is_valid(data)  # jsonschema's own `pattern`
    write(tmp_path, f"{PAYMENT}.json", schema)
    error = refused(Schemas.load(tmp_path), data)
    assert error.field == place and "pattern" in error.problem


def test_multiple_of_a_fraction_is_decided_as_decimals(tmp_path: Path) -> None:
    """0.07 / 0.01 is 7.000000000000001 in binary floating point: jsonschema alone
    refuses 0.07, jsonschema-rs accepts it, and its verdict stands."""
    schema = {"properties": {"price": {"multipleOf": 0.01}}}
    assert not Draft202012Validator(schema).is_valid({"price": 0.07})
    write(tmp_path, f"{PAYMENT}.json", schema)
    schemas = Schemas.load(tmp_path)
    schemas.check(PAYMENT, {"price": 0.07})
    error = refused(schemas, {"price": 0.071})
    assert (error.field, error.problem.split(": ")[1]) == ("/data/price", "multipleOf")


@pytest.mark.parametrize(
    ("data", "failure"),
    [
        ({**VALID, 1: "x"}, None),
        ({**VALID, "paths": {"\ud800": 1}}, None),
        ({**VALID, "currency": "E\ud800"}, ("/data/currency", "pattern")),
        ({**VALID, "paths": {"a": {1, 2}}}, ("/data/paths/a", "type")),
        ({**VALID, "customer": {"id": b"c-9"}}, ("/data/customer/id", "type")),
    ],
    ids=["key-not-a-string", "lone-surrogate-key", "lone-surrogate", "set", "bytes"],
)
def test_a_value_jsonschema_rs_cannot_read_is_judged_by_jsonschema(
    schemas: Schemas, data: dict[Any, Any], failure: tuple[str, str] | None
) -> None:
    """Not JSON, where jsonschema-rs must read it: it raises ValueError, and the verdict
    and the failure are jsonschema's, as before it was added."""
    with pytest.raises(ValueError):
        jsonschema_rs.Draft202012Validator(PAYMENT_SCHEMA).is_valid(data)
    if failure is None:
        schemas.check(PAYMENT, data)
    else:
        error = refused(schemas, data)
        assert (error.field, error.problem.split(": ")[1]) == failure


# Keywords of every kind beside those of PAYMENT_SCHEMA and FALSES.
MIXED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["a", "b", 1, None]},
        "count": {"type": "integer", "multipleOf": 3, "exclusiveMinimum": -7},
        "ratio": {"type": "number", "minimum": -1.5, "exclusiveMaximum": 2.5},
        "tags": {"uniqueItems": True, "contains": {"type": "string"}, "maxContains": 2},
        "pair": {"prefixItems": [{"type": "integer"}, {"const": "s"}], "items": False},
        "choice": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "integer"}, {}]},
        "either": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["n"]}]},
        "not_list": {"not": {"type": "array"}},
        "nested": {"$ref": "#"},
    },
    "if": {"required": ["kind"], "properties": {"kind": {"const": "a"}}},
    "then": {"required": ["count"]},
    "else": {"minProperties": 1},
    "dependentRequired": {"ratio": ["count"]},
    "propertyNames": {"maxLength": 8},
    "unevaluatedProperties": {"type": ["string", "integer"]},
}
AGREEING: dict[str, dict[str, Any]] = {PAYMENT: PAYMENT_SCHEMA, "mixed": MIXED, "falses": FALSES}
PRECISE = {event_type: Draft202012Validator(schema) for event_type, schema in AGREEING.items()}
_NAMES = sorted({*PAYMENT_SCHEMA["properties"], *MIXED["properties"], "x-a", "y-b", "a/b"})
# I-JSON, as intake lets through (shared.event): finite numbers, integers within
# +/-(2^53-1), text without lone surrogates. No newline in text: `$` before a final
# newline is a difference of the validators (above), not a disagreement to find.
_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\n"), max_size=6)
i_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["EUR", "eur", "s", "", "p-1"])
    | _text,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(_NAMES) | _text, inner, max_size=5)
    ),
    max_leaves=16,
)


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory: pytest.TempPathFactory) -> Schemas:
    folder = tmp_path_factory.mktemp("agreeing")
    for event_type, schema in AGREEING.items():
        write(folder, f"{event_type}.json", schema)
    return Schemas.load(folder)


@pytest.mark.parametrize("event_type", sorted(AGREEING))
@given(data=st.dictionaries(st.sampled_from(_NAMES), i_json, max_size=6) | i_json)
def test_the_fast_and_the_precise_validator_agree(
    agreeing: Schemas, event_type: str, data: object
) -> None:
    """check() passes only if jsonschema-rs finds the data valid, and names a rule only
    if jsonschema finds it invalid: passing where jsonschema refuses, or refusing
    without a rule, is a disagreement."""
    valid = PRECISE[event_type].is_valid(data)
    try:
        agreeing.check(event_type, data)
    except InvalidEvent as error:
        assert not valid, f"jsonschema-rs refused what jsonschema accepts: {error}"
    else:
        assert valid, "jsonschema-rs accepted what jsonschema refuses"


# ---------------------------------------------------------------------- patterns


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("schema", "data", "place"),
    [
        ({"properties": {"s": {"pattern": "^(a+)+$"}}}, {"s": "a" * 40 + "!"}, "/data/s"),
        (
            {"patternProperties": {"^(a+)+$": {"type": "integer"}}},
            {"a" * 40: "x", "a" * 40 + "!": "y"},
            "/data/" + "a" * 40,
        ),
        (
            {"patternProperties": {"^(a+)+$": {}}, "additionalProperties": False},
            {"a" * 40 + "!": 1},
            "/data",
        ),
        (  # jsonschema would match the names with Python's re: placed at /data only
            {"patternProperties": {"^(a+)+$": {}}, "unevaluatedProperties": False},
            {"a" * 40 + "!": 1},
            "/data",
        ),
        (
            {
                "properties": {"inner": {"patternProperties": {"^(a+)+$": {}}}},
                "unevaluatedProperties": False,
            },
            {"inner": {"a" * 40 + "!": 1}, "extra": 1},
            "/data",
        ),
    ],
)
def test_a_backtracking_pattern_refuses_in_linear_time(
    tmp_path: Path, schema: object, data: object, place: str
) -> None:
    # Python's re takes about 2^40 steps on these: jsonschema-rs's engine, a few.
    write(tmp_path, f"{PAYMENT}.json", schema)
    started = time.monotonic()
    error = refused(Schemas.load(tmp_path), data)
    assert time.monotonic() - started < 5
    assert error.field == place
