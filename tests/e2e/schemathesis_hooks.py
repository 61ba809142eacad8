"""Hooks for the schemathesis runs of test_openapi_fuzz.py (loaded by the fuzzer's CLI).

Predecessors: a well-formed Outbox-After value the fuzzer made up is replaced, just
before the request goes out, by one of the IDs in OPENAPI_FUZZ_PREDECESSORS, which
the test has prepared (one in the inbox, one the sink has seen refused). A made-up
ID would be one the sink never saw, and each such request waits the documented 5 s
before its 412: a few dozen of them would take minutes. The replacement is
well-formed too, so the case stays schema-valid; malformed values are sent as
generated (400). The wait itself is covered by
tests/integration/test_sink_predecessor_check.py.

Leases: the fuzzer's coverage phase cannot make a value for the Outbox-Lease pattern
(it has spaces) and sends "0" in a case it calls schema-valid; in a positive case a
value the sink cannot parse becomes a well-formed lease, so the case is what the
fuzzer meant. Negative cases keep theirs (400).

Three kinds of failure are dropped, and only those; each drop is written as a JSON
line (with its `rule`) to the file named by OPENAPI_FUZZ_DROPPED, which the test checks:

- "qty-float": a schema-valid order refused because its `qty` is written 7.0. JSON
  Schema calls that an integer, the services refuse it on purpose (both documents
  say so in words, which is all JSON Schema allows).
- "i-json-number": a schema-valid event refused because a number in its data is a
  whole number outside +/-(2^53-1): an integer, or a number written otherwise (1e16)
  that RFC 8785 writes as that integer. I-JSON (RFC 7493) rules the documents state
  in words, at any depth of data that JSON Schema leaves open; the reply must point
  at exactly that number.
- "concrete-path": a path parameter that makes a templated path one of the document's
  concrete paths (the ID "batch" makes /events/{id} the sink's /events/batch, which
  the fuzzer learns from GET /events/batch's reply). The fuzzer then holds the
  methods of that URL to the template's operations only: it calls POST an
  undeclared method and Allow's POST undocumented. Dropped only when the URL's own
  path documents the method (ST204), or exactly the methods Allow lists (ST205).
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import unquote, urlsplit

import schemathesis

from shared import LEASE_HEADER, PREDECESSOR_HEADER, InvalidEvent, parse_lease, validate_event_id

DROPPED_ENV = "OPENAPI_FUZZ_DROPPED"
PREDECESSORS_ENV = "OPENAPI_FUZZ_PREDECESSORS"
QTY_NOT_INTEGER = {"field": "qty", "detail": "must be an integer, not a number"}
MAX_SAFE_INTEGER = 2**53 - 1  # I-JSON: the integers a double holds exactly
EXPONENT_FROM = 1e21  # RFC 8785 (ECMAScript) writes numbers this large with an exponent
IMPLICIT_METHODS = frozenset({"head", "options"})  # as the fuzzer's Allow check has them
HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


# ---------------------------------------------------------------- qty written 7.0


def integral_float_qty(body: object) -> bool:
    """Whether the body is an order (or a batch of them) whose `qty` is a float like 7.0."""
    items = body.get("events", [body]) if isinstance(body, dict) else []
    return any(
        isinstance(item, dict) and isinstance(item.get("qty"), float) and item["qty"].is_integer()
        for item in (items if isinstance(items, list) else [])
    )


def reply_of(content: bytes) -> dict[str, Any]:
    try:
        reply = json.loads(content)
    except ValueError:
        return {}
    return reply if isinstance(reply, dict) else {}


def refused_as_float_qty(content: bytes) -> bool:
    reply = reply_of(content)
    return all(reply.get(k) == v for k, v in QTY_NOT_INTEGER.items())


def float_qty_refused(failure: Any, case: Any, response: Any) -> bool:
    return bool(
        failure.code == "ST202"
        and response.status_code == 400
        and integral_float_qty(case.body)
        and refused_as_float_qty(response.content)
    )


# ---------------------------------------------------------------- I-JSON numbers


def whole_beyond_safe(value: object) -> bool:
    """Whether a JSON number is a whole number outside +/-(2^53-1) as RFC 8785 writes
    it: an integer, or a float below 1e21 in magnitude (written without an exponent,
    so as that integer)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, float):
        return value.is_integer() and MAX_SAFE_INTEGER < abs(value) < EXPONENT_FROM
    return abs(value) > MAX_SAFE_INTEGER


def at_pointer(document: object, pointer: str) -> tuple[bool, object]:
    """(found, value) at an RFC 6901 JSON pointer into `document`."""
    if not pointer.startswith("/"):
        return False, None
    node = document
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False, None
    return True, node


def i_json_number_refused(failure: Any, case: Any, response: Any) -> bool:
    """A schema-valid event refused (400 invalid event) naming a place in its data
    that holds a whole number outside +/-(2^53-1)."""
    if failure.code != "ST202" or response.status_code != 400:
        return False
    reply = reply_of(response.content)
    field = reply.get("field")
    if reply.get("error") != "invalid event" or not isinstance(field, str):
        return False
    if not field.startswith("/data/") or "I-JSON" not in str(reply.get("detail")):
        return False
    found, value = at_pointer(case.body, field)
    return found and whole_beyond_safe(value)


# ---------------------------------------------------------------- concrete paths


def sent_path(response: Any) -> str:
    return unquote(urlsplit(str(response.request.url)).path)


def concrete_methods(case: Any, path: str) -> set[str] | None:
    """The methods the document lists for `path` as one of its concrete paths (None if
    it is not one, or is the operation's own)."""
    if path == case.path or "{" in path:
        return None
    item = case.operation.schema.raw_schema.get("paths", {}).get(path)
    return None if not isinstance(item, dict) else {m for m in item if m in HTTP_METHODS}


def concrete_path_judged_as_template(failure: Any, case: Any, response: Any) -> bool:
    """ST204/ST205 for a URL that a templated operation's parameters made one of the
    document's concrete paths, when that path's own methods answer for the reply."""
    declared = concrete_methods(case, sent_path(response))
    if declared is None:
        return False
    if failure.code == "ST204":  # "undeclared" method: declared at this URL's path
        return str(response.request.method).lower() in declared
    if failure.code == "ST205":  # Allow lists exactly the methods of this URL's path
        advertised = {m.strip().lower() for m in failure.allow_header.split(",") if m.strip()}
        return advertised - IMPLICIT_METHODS == declared - IMPLICIT_METHODS
    return False


# ---------------------------------------------------------------- the filter

RULES = (
    ("qty-float", float_qty_refused),
    ("i-json-number", i_json_number_refused),
    ("concrete-path", concrete_path_judged_as_template),
)


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but the kinds above; record each one dropped."""
    rule = next((name for name, applies in RULES if applies(failure, case, response)), None)
    if rule is not None:
        with open(os.environ[DROPPED_ENV], "a", encoding="utf-8") as out:
            line = {
                "rule": rule,
                "code": failure.code,
                "operation": f"{case.operation.method.upper()} {case.operation.path}",
                "method": str(response.request.method).upper(),
                "path": sent_path(response),
                "status": response.status_code,
                "body": case.body,
            }
            out.write(json.dumps(line, default=repr) + "\n")
    return rule is None


# ---------------------------------------------------------------- requests


def positive(case: Any) -> bool:
    meta = getattr(case, "meta", None)
    return meta is not None and bool(meta.generation.mode.is_positive)


def parsable(value: object) -> bool:
    try:
        parse_lease(str(value))
    except ValueError:
        return False
    return True


def well_formed(value: object) -> bool:
    try:
        validate_event_id(value)
    except InvalidEvent:
        return False
    return True


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """A well-formed Outbox-After becomes one of the prepared IDs (chosen by its length);
    an unparsable Outbox-Lease of a positive case, a well-formed one."""
    headers = case.headers or {}
    lease = next((key for key in headers if key.lower() == LEASE_HEADER.lower()), None)
    if lease is not None and positive(case) and not parsable(headers[lease]):
        headers[lease] = "fuzz * 1"
    name = next((key for key in headers if key.lower() == PREDECESSOR_HEADER.lower()), None)
    if name is None or not well_formed(headers[name]):
        return
    prepared = os.environ[PREDECESSORS_ENV].split(",")
    headers[name] = prepared[len(headers[name]) % len(prepared)]
