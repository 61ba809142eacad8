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

One kind of failure is dropped, and only that one; each drop is written as a JSON
line to the file named by OPENAPI_FUZZ_DROPPED, which the test checks: a schema-valid
event refused because its `qty` is written 7.0. JSON Schema calls that an integer,
the services refuse it on purpose (both documents say so in words, which is all JSON
Schema allows).
"""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis

from shared import LEASE_HEADER, PREDECESSOR_HEADER, InvalidEvent, parse_lease, validate_event_id

DROPPED_ENV = "OPENAPI_FUZZ_DROPPED"
PREDECESSORS_ENV = "OPENAPI_FUZZ_PREDECESSORS"
QTY_NOT_INTEGER = {"field": "qty", "detail": "must be an integer, not a number"}


def integral_float_qty(body: object) -> bool:
    """Whether the body is an event (or a batch of them) whose `qty` is a float like 7.0."""
    items = body.get("events", [body]) if isinstance(body, dict) else []
    return any(
        isinstance(item, dict) and isinstance(item.get("qty"), float) and item["qty"].is_integer()
        for item in (items if isinstance(items, list) else [])
    )


def refused_as_float_qty(content: bytes) -> bool:
    try:
        reply = json.loads(content)
    except ValueError:
        return False
    return isinstance(reply, dict) and all(reply.get(k) == v for k, v in QTY_NOT_INTEGER.items())


def float_qty_refused(failure: Any, case: Any, response: Any) -> bool:
    return bool(
        failure.code == "ST202"
        and response.status_code == 400
        and integral_float_qty(case.body)
        and refused_as_float_qty(response.content)
    )


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but the kind above; record each one dropped."""
    dropped = float_qty_refused(failure, case, response)
    if dropped:
        with open(os.environ[DROPPED_ENV], "a", encoding="utf-8") as out:
            line = {
                "code": failure.code,
                "method": case.method.upper(),
                "path": case.path,
                "status": response.status_code,
                "body": case.body,
            }
            out.write(json.dumps(line, default=repr) + "\n")
    return not dropped


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
