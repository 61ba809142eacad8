"""The OpenAPI documents against the apps that serve them.

Every route an app registers is in its document with its method, and every operation
of the document is served by a route with that method; each operation's statuses
are the ones pinned here, so a new status has to be added to both; the event rules
of the document are the ones `shared` enforces; the sink's token and the
publisher's intake token guard exactly the operations the documents say; and
GET /openapi.json serves the package's document.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from hypothesis import given, settings
from hypothesis import strategies as st

from plumbing.openapi import OPENAPI_PATH, document_bytes, load_document
from publisher.app import ServiceSettings
from publisher.app import create_app as create_publisher
from shared import MAX_BATCH, InvalidEvent, validate_event_id, validate_sku
from shared.event import (
    EVENT_FIELDS,
    FIELDS,
    ID_MAX_CHARS,
    KEY_MAX_CHARS,
    QTY_MAX,
    QTY_MIN,
    SKU_MAX_CHARS,
    TYPE_MAX_CHARS,
    validate_order,
)
from sink import create_app as create_sink

if TYPE_CHECKING:
    from conftest import Serve

TOKEN = "openapi-token-0123456789"
GUARD = {403, 421}  # Origin and Host checks: every operation
POST = {408, 413, 415}  # a body too slow, too large, not plain JSON
SINK_AUTH = {401}  # only when the sink runs with a token
STORAGE = {503}
CONSOLE_ACTION = {200, 400, 403, 404, 409} | POST | GUARD | STORAGE

# method, path -> statuses. The document must say exactly these.
PINNED: dict[str, dict[tuple[str, str], set[int]]] = {
    "sink": {
        ("POST", "/events"): {200, 400, 409, 412, 422} | SINK_AUTH | POST | GUARD | STORAGE,
        ("POST", "/events/batch"): {200, 400, 409, 412} | SINK_AUTH | POST | GUARD | STORAGE,
        ("GET", "/events/batch"): {200, 404} | SINK_AUTH | GUARD | STORAGE,
        ("GET", "/events/{id}"): {200, 400, 404} | SINK_AUTH | GUARD | STORAGE,
        ("GET", "/inventory/{sku}"): {200, 400} | SINK_AUTH | GUARD | STORAGE,
        ("GET", "/metrics"): {200} | GUARD | STORAGE,
        ("GET", "/healthz"): {200} | GUARD,
        ("GET", "/readyz"): {200} | GUARD | STORAGE,
        ("GET", "/openapi.json"): {200} | GUARD,
    },
    "publisher": {
        ("POST", "/orders"): {200, 201, 400, 401, 409} | POST | GUARD | STORAGE,
        ("POST", "/orders/batch"): {200, 400, 401} | POST | GUARD | STORAGE,
        ("POST", "/events"): {200, 201, 400, 401, 409} | POST | GUARD | STORAGE,
        ("POST", "/events/batch"): {200, 400, 401} | POST | GUARD | STORAGE,
        ("GET", "/status"): {200} | GUARD | STORAGE,
        ("GET", "/metrics"): {200} | GUARD | STORAGE,
        ("GET", "/healthz"): {200} | GUARD,
        ("GET", "/readyz"): {200} | GUARD | STORAGE,
        ("GET", "/openapi.json"): {200} | GUARD,
        # The operator console (publisher.console): its page, and the JSON routes it uses.
        ("GET", "/console"): {200} | GUARD,
        ("GET", "/console/static/console.js"): {200} | GUARD,
        ("GET", "/console/static/console.css"): {200} | GUARD,
        ("GET", "/console/api/session"): {200} | GUARD,
        ("POST", "/console/api/sign-in"): {200, 400, 403, 429} | POST | GUARD,
        ("POST", "/console/api/sign-out"): {200, 403} | POST | GUARD,
        ("GET", "/console/api/overview"): {200} | GUARD | STORAGE,
        ("GET", "/console/api/stream"): {200} | GUARD | STORAGE,
        ("GET", "/console/api/entries"): {200, 400} | GUARD | STORAGE,
        ("GET", "/console/api/events/{id}"): {200, 400, 404} | GUARD | STORAGE,
        ("POST", "/console/api/events/{id}/quarantine"): CONSOLE_ACTION,
        ("POST", "/console/api/events/{id}/redrive"): CONSOLE_ACTION,
    },
}
# Replies that are not JSON: Prometheus text, and the console's page, assets and stream.
NOT_JSON = {
    "/metrics": "text/plain",
    "/console": "text/html",
    "/console/static/console.js": "text/javascript",
    "/console/static/console.css": "text/css",
    "/console/api/stream": "text/event-stream",
}
# A concrete path of the document that no route names, but a template route serves.
ALIASES = {("sink", "GET", "/events/batch"): "/events/{id}"}
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
PARAM = re.compile(r"\{[^}]+\}")
SERVICES = ("sink", "publisher")


def pinned(name: str) -> dict[tuple[str, str], set[int]]:
    """The pinned statuses, HEAD beside each GET (aiohttp adds it to every GET route)."""
    out = dict(PINNED[name])
    out.update(
        {("HEAD", path): statuses for (m, path), statuses in PINNED[name].items() if m == "GET"}
    )
    return out


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                yield method.upper(), path, operation


def make_app(name: str, tmp_path: Path, token: str | None = None) -> web.Application:
    if name == "sink":
        return create_sink(tmp_path / "sink.db", token=token)
    # The relay's sink is never reached here: these tests stop before it sends.
    settings = ServiceSettings(
        db=str(tmp_path / "source.db"), sink="http://127.0.0.1:9/events", intake_token=token
    )
    return create_publisher(settings)


@pytest.fixture(params=SERVICES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_every_route_is_documented_with_its_methods(name: str, tmp_path: Path) -> None:
    app = make_app(name, tmp_path)
    registered = {(route.method, route.resource.canonical) for route in app.router.routes()}
    documented = {(method, path) for method, path, _ in operations(load_document(name))}
    missing = registered - documented
    assert not missing, f"routes the {name} document leaves out: {sorted(missing)}"
    extra = {(name, m, p) for m, p in documented - registered}
    aliases = {(name, m, p) for (n, m, p) in ALIASES if n == name}
    aliases |= {(n, "HEAD", p) for (n, m, p) in aliases if m == "GET"}
    assert extra == aliases, f"operations of the {name} document no route has: {sorted(extra)}"


async def test_every_documented_operation_reaches_a_route_with_its_method(
    name: str, tmp_path: Path
) -> None:
    app = make_app(name, tmp_path)
    for method, path, _ in operations(load_document(name)):
        concrete = PARAM.sub("x", path)
        match = await app.router.resolve(make_mocked_request(method, concrete, app=app))
        assert match.http_exception is None, (method, path, match.http_exception)
        assert match.route.method == method, (method, path)
        expected = ALIASES.get((name, "GET" if method == "HEAD" else method, path), path)
        assert match.route.resource is not None
        assert match.route.resource.canonical == expected, (method, path)


def test_every_operation_documents_the_pinned_statuses(name: str) -> None:
    document = load_document(name)
    statuses = {
        (method, path): {int(status) for status in operation["responses"]}
        for method, path, operation in operations(document)
    }
    assert statuses == pinned(name)


def test_errors_and_replies_are_json_as_documented(name: str) -> None:
    """Every response but HEAD and the NOT_JSON ones has a JSON body; every error one
    with `error`."""
    document = load_document(name)
    schemas = document["components"]["schemas"]
    for method, path, operation in operations(document):
        for status, response in operation["responses"].items():
            content = response.get("content")
            if method == "HEAD":
                assert content is None, (method, path, status)
                continue
            if path in NOT_JSON and status == "200":
                assert list(content) == [NOT_JSON[path]], (method, path)
                continue
            assert list(content) == ["application/json"], (method, path, status)
            if int(status) >= 400:
                schema = resolve(schemas, content["application/json"]["schema"])
                variants = [resolve(schemas, v) for v in schema.get("oneOf", [schema])]
                assert all("error" in v["required"] for v in variants), (method, path, status)


def references(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            yield from references(value)
    elif isinstance(node, list):
        for value in node:
            yield from references(value)


def test_every_reference_resolves(name: str) -> None:
    document = load_document(name)
    for ref in set(references(document)):
        node: Any = document
        for part in ref.removeprefix("#/").split("/"):
            assert isinstance(node, dict) and part in node, f"{name}: {ref} does not resolve"
            node = node[part]


def test_only_the_sink_says_outbox_fencing_on_every_reply(name: str) -> None:
    for method, path, operation in operations(load_document(name)):
        for status, response in operation["responses"].items():
            says = "Outbox-Fencing" in response.get("headers", {})
            assert says == (name == "sink"), (name, method, path, status)


def resolve(schemas: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return schema if ref is None else resolve(schemas, schemas[ref.rsplit("/", 1)[1]])


# ---------------------------------------------------------------- the event rules


def event_schemas(name: str) -> dict[str, Any]:
    return dict(load_document(name)["components"]["schemas"])


def test_the_event_schema_is_the_one_shared_enforces(name: str) -> None:
    schemas = event_schemas(name)
    order = schemas["Order"]
    assert order["required"] == list(FIELDS) and list(order["properties"]) == list(FIELDS)
    assert order["additionalProperties"] is False
    event = schemas["Event"]
    assert event["required"] == ["id", "type", "data"] and event["additionalProperties"] is False
    assert list(event["properties"]) == list(EVENT_FIELDS)
    for schema, most in (("EventType", TYPE_MAX_CHARS), ("Key", KEY_MAX_CHARS)):
        assert (schemas[schema]["minLength"], schemas[schema]["maxLength"]) == (1, most)
    qty = order["properties"]["qty"]
    assert (qty["type"], qty["minimum"], qty["maximum"]) == ("integer", QTY_MIN, QTY_MAX)
    assert (schemas["EventId"]["minLength"], schemas["EventId"]["maxLength"]) == (1, ID_MAX_CHARS)
    assert (schemas["Sku"]["minLength"], schemas["Sku"]["maxLength"]) == (1, SKU_MAX_CHARS)
    if name == "sink":
        events = schemas["Batch"]["properties"]["events"]
        assert (events["minItems"], events["maxItems"]) == (1, MAX_BATCH)
        assert schemas["BatchReply"]["properties"]["acks"]["maxItems"] == MAX_BATCH


def accepts(validate: Callable[[object], object], value: object) -> bool:
    try:
        validate(value)
    except InvalidEvent:
        return False
    return True


def matches(schema: dict[str, Any], value: str) -> bool:
    """JSON Schema's string rules: length in code points, `pattern` searched (ECMA)."""
    fits = schema["minLength"] <= len(value) <= schema["maxLength"]
    # ECMA's `$` ends the string; Python's would also take a final newline.
    return fits and re.search(schema["pattern"].removesuffix("$") + r"\Z", value) is not None


TEXT = st.text(alphabet=st.sampled_from("aZ09._:-/ \n\u00e9"), max_size=140)


@settings(max_examples=300, deadline=None)
@given(value=TEXT | st.sampled_from(["a", "-a", ".", "0" * 128, "0" * 129, "a" * 65]))
def test_id_and_sku_patterns_agree_with_the_validators(value: str) -> None:
    schemas = event_schemas("sink")
    assert matches(schemas["EventId"], value) == accepts(validate_event_id, value)
    assert matches(schemas["Sku"], value) == accepts(validate_sku, value)


def test_a_qty_of_7_0_is_refused_although_json_schema_calls_it_an_integer() -> None:
    """The one rule JSON Schema cannot state; the documents say it in words."""
    assert not accepts(validate_order, {"id": "a", "sku": "b", "qty": 7.0})
    assert "7.0" in event_schemas("sink")["Order"]["description"]
    assert "7.0" in event_schemas("publisher")["Order"]["description"]


# ---------------------------------------------------------------- served, and guarded

ROOT = Path(__file__).resolve().parents[2]


def test_the_documents_are_package_data(tmp_path: Path) -> None:
    """What pip installs from pyproject.toml (the Docker image too) holds each document
    and the console's page and assets."""
    source, built = tmp_path / "src", tmp_path / "lib"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in setuptools["packages"]:
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / package.replace(".", "/"), source / package, ignore=ignore)
    build = [sys.executable, "-c", "import setuptools; setuptools.setup()", "build_py", "-d"]
    done = subprocess.run(
        [*build, str(built)], cwd=source, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for name in SERVICES:
        assert (built / name / "openapi.json").read_bytes() == document_bytes(name)
    # The operator console's page and assets travel the same way.
    static = Path("publisher", "console", "static")
    shipped = sorted(path.name for path in (built / static).iterdir())
    assert shipped == ["console.css", "console.js", "index.html"]
    for name in shipped:
        assert (built / static / name).read_bytes() == (ROOT / static / name).read_bytes()


async def test_the_document_is_served_from_the_package(
    name: str, serve: Serve, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    base = await serve(make_app(name, tmp_path))
    async with client.get(base + OPENAPI_PATH) as reply:
        assert reply.status == 200
        assert reply.content_type == "application/json"
        assert await reply.json() == load_document(name)
    assert load_document(name)["openapi"] == "3.1.0"


def needs_token(operation: dict[str, Any]) -> bool:
    return 401 in {int(status) for status in operation["responses"]}


async def test_the_token_guards_exactly_the_operations_documented_with_401(
    name: str, serve: Serve, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    base = await serve(make_app(name, tmp_path, token=TOKEN))
    headers = {"Content-Type": "application/json"}
    for method, path, operation in operations(load_document(name)):
        url = base + PARAM.sub("x", path)
        body = b"{}" if method == "POST" else None
        async with client.request(method, url, data=body, headers=headers) as reply:
            assert (reply.status == 401) == needs_token(operation), (method, path, reply.status)
            if reply.status == 401:
                assert reply.headers["WWW-Authenticate"] == "Bearer"
        # With the token, no operation answers 401.
        authorized = {**headers, "Authorization": f"Bearer {TOKEN}"}
        async with client.request(method, url, data=body, headers=authorized) as reply:
            assert reply.status != 401, (method, path)
