"""schemathesis against both running services, each judged by its own OpenAPI document.

A real sink process and a real `publisher serve` process on loopback, each fuzzed
through the document it serves at /openapi.json: a fixed seed, a bounded number of
examples per operation, every built-in check (no 5xx; status, content type, headers
and body as documented; schema-valid data accepted, schema-violating data refused;
undocumented methods answered 405 with Allow). Then both database files are read with
sqlite3 connections of this process: every row must be one a 2xx reply accounted
for, so no rejected request changed either database.

One relaxation, in tests/e2e/schemathesis_hooks.py, each drop recorded and checked
to be exactly its case: a `qty` written as 7.0 is schema-valid for JSON Schema and
refused by the services on purpose.

Predecessors: a request whose Outbox-After names an event the sink never saw waits
up to 5 s before its 412 (as documented). So the fuzzer's well-formed Outbox-After
values are swapped for two IDs prepared here, one applied and one seen but refused
(see the hooks): both outcomes, predecessor present and missing, without the wait
per example.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import LOOPBACK, http_request

if TYPE_CHECKING:
    from conftest import Query, StartPublisher, StartSink

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SEED = 20261201
MAX_EXAMPLES = 100  # per operation and phase: about 10 s per service here
WORKERS = 1  # several threads trip a CPython 3.11 bug in ast.parse (hypothesis uses it)
REQUEST_TIMEOUT_S = 10.0  # above the sink's 5 s predecessor wait
RUN_TIMEOUT_S = 180.0
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
FUZZER = (sys.executable, "-m", "schemathesis.cli")

# Applied before the run:
PREDECESSOR_PRESENT = {"id": "predecessor-present", "sku": "predecessor", "qty": 1}
# Refused: seen, not there:
PREDECESSOR_MISSING = {"id": "predecessor-missing", "sku": "predecessor", "qty": 0}
# GET /events/batch is the inbox record of the event "batch": let it be there.
NAMED_BATCH = {"id": "batch", "sku": "predecessor", "qty": 2}
PREPARED = (PREDECESSOR_PRESENT, NAMED_BATCH)

CONFIG = """\
# A warning (a reference that does not resolve, an operation never reached past
# 404) means part of the document went untested: it fails the run.
[warnings]
fail-on = true

# Schema-valid requests may still be refused for the state they meet: an unknown ID
# (404), a known ID with another payload (409), a missing predecessor (412). The status
# conformance check still holds each operation to the statuses it documents.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "404", "409", "412"]
"""


@dataclass(frozen=True)
class Exchange:
    """One request the fuzzer made and the reply it got, from its HAR report."""

    method: str
    path: str
    status: int
    request: object  # the parsed JSON body, None if there was none or it was not JSON
    reply: object


def fuzz(
    base: str, tmp_path: Path, name: str, child_env: dict[str, str], *options: str
) -> list[Exchange]:
    """Run schemathesis against `base` (with more of its `options`); fail with its
    report unless it passed."""
    har = tmp_path / f"{name}.har"
    dropped = tmp_path / f"{name}-dropped.jsonl"
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    # The children's environment: no proxy settings, names other than loopback
    # do not resolve.
    env = dict(child_env)
    env.update(
        {
            "SCHEMATHESIS_HOOKS": str(HOOKS),
            "OPENAPI_FUZZ_DROPPED": str(dropped),
            "OPENAPI_FUZZ_PREDECESSORS": f"{PREDECESSOR_PRESENT['id']},{PREDECESSOR_MISSING['id']}",
        }
    )
    command = [
        *FUZZER,
        "--config-file",
        str(config),
        "run",
        f"{base}/openapi.json",
        f"--seed={SEED}",
        f"--max-examples={MAX_EXAMPLES}",
        f"--workers={WORKERS}",
        f"--request-timeout={REQUEST_TIMEOUT_S}",
        "--checks=all",
        "--continue-on-failure",  # every failure of every operation in one report
        "--generation-database=none",
        "--no-shrink",  # bounded time even when something fails
        "--report=har",
        f"--report-har-path={har}",
        "--no-color",
        *options,
    ]
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, f"schemathesis found failures against {name}:\n{report}"
    check_dropped(dropped)
    return list(read_har(har))


def check_dropped(dropped: Path) -> None:
    """Every dropped failure is the one kind the hooks name, nothing else."""
    if not dropped.exists():
        return
    for line in dropped.read_text().splitlines():
        record = json.loads(line)
        if record["code"] == "ST202":  # qty written 7.0, refused on purpose
            assert (record["method"], record["status"]) == ("POST", 400), record
            assert record["path"] in ("/events", "/orders"), record
        else:
            raise AssertionError(f"a failure was dropped that no rule names: {record}")


def read_har(har: Path) -> Iterator[Exchange]:
    for entry in json.loads(har.read_text())["log"]["entries"]:
        request, response = entry["request"], entry["response"]
        path = "/" + request["url"].split("/", 3)[3]
        yield Exchange(
            request["method"],
            path.split("?", 1)[0],
            response["status"],
            parsed(request.get("postData", {}).get("text")),
            parsed(response.get("content", {}).get("text")),
        )


def parsed(text: str | None) -> object:
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def no_server_error(exchanges: list[Exchange]) -> None:
    assert exchanges, "the fuzzer made no request"
    errors = [(e.method, e.path, e.status) for e in exchanges if e.status >= 500]
    assert not errors, errors


# ---------------------------------------------------------------- the sink


def acknowledged(exchanges: list[Exchange]) -> Iterator[tuple[dict[str, Any], str]]:
    """(event sent, ACK status) for every ACK in a 200 reply to a POST."""
    for e in exchanges:
        if e.method != "POST" or e.status != 200:
            continue
        assert isinstance(e.request, dict) and isinstance(e.reply, dict), e
        if e.path == "/events":
            assert e.reply["ack"] == e.request["id"], e
            yield e.request, e.reply["status"]
        elif e.path == "/events/batch":
            for event, ack in zip(e.request["events"], e.reply["acks"], strict=False):
                assert ack["ack"] == event["id"], e
                yield event, ack["status"]


def test_sink_conforms_and_only_acknowledged_events_change_the_inbox(
    sink_process: StartSink, db_rows: Query, child_env: dict[str, str], tmp_path: Path
) -> None:
    db = tmp_path / "sink.db"
    sink = sink_process(db)
    assert sink.base.startswith(f"http://{LOOPBACK}:")
    for event in PREPARED:
        assert http_request(sink.port, "POST", "/events", event, timeout_s=10)[0] == 200
    assert http_request(sink.port, "POST", "/events", PREDECESSOR_MISSING, timeout_s=10)[0] == 400
    exchanges = fuzz(sink.base, tmp_path, "sink", child_env)
    no_server_error(exchanges)
    sink.stop()

    applied: dict[str, dict[str, Any]] = {event["id"]: event for event in PREPARED}
    deliveries = collections.Counter(event["id"] for event in PREPARED)
    for event, status in acknowledged(exchanges):
        deliveries[event["id"]] += 1
        if status == "applied":
            assert event["id"] not in applied, f"applied twice: {event}"
            applied[event["id"]] = event
    assert len(applied) > len(PREPARED), (
        "the fuzzer never had an event applied: nothing was checked"
    )

    inbox = {row[0]: row[1:] for row in db_rows(db, "SELECT id, payload, deliveries FROM inbox")}
    assert set(inbox) == set(applied), "inbox rows that no ACK accounts for, or ACKs not on disk"
    # A refused request (a conflict, say) left the payload as it was applied.
    assert {k: json.loads(payload) for k, (payload, _) in inbox.items()} == applied
    assert {k: n for k, (_, n) in inbox.items()} == dict(deliveries), "deliveries no 200 explains"
    expected = collections.Counter[str]()
    for event in applied.values():
        expected[event["sku"]] += event["qty"]
    assert dict(db_rows(db, "SELECT sku, qty FROM inventory")) == dict(expected)


# ---------------------------------------------------------------- the publisher


def test_publisher_conforms_and_only_accepted_orders_change_the_outbox(
    publisher_process: StartPublisher,
    closed_port: int,
    db_rows: Query,
    child_env: dict[str, str],
    tmp_path: Path,
) -> None:
    db = tmp_path / "source.db"
    # The relay's sink refuses connections: every accepted order stays in the outbox,
    # and GET /status reports a failing head.
    sink = f"http://{LOOPBACK}:{closed_port}/events"
    publisher = publisher_process("--db", str(db), "--sink", sink, "--port", "0")
    # The console's routes are left out: its actions need a session and its CSRF token,
    # which no generated case can hold (tests/integration/test_console_http.py), and
    # its stream lasts minutes per request.
    exchanges = fuzz(
        f"http://{LOOPBACK}:{publisher.port}",
        tmp_path,
        "publisher",
        child_env,
        "--exclude-path-regex=^/console",
    )
    no_server_error(exchanges)
    publisher.stop()

    accepted: dict[str, tuple[str, int]] = {}
    for e in exchanges:
        if e.method == "POST" and e.path == "/orders/batch" and e.status == 200:
            assert isinstance(e.request, dict) and isinstance(e.reply, dict), e
            for item, result in zip(e.request["orders"], e.reply["results"], strict=True):
                if result["result"] == "accepted":
                    assert item["id"] not in accepted, f"accepted twice: {e}"
                    accepted[item["id"]] = (item["sku"], item["qty"])
                elif result["result"] == "duplicate":
                    assert accepted.get(item["id"]) == (item["sku"], item["qty"]), e
        if e.method == "POST" and e.path == "/orders" and e.status in (200, 201):
            assert isinstance(e.request, dict) and isinstance(e.reply, dict), e
            assert e.reply == {
                "id": e.request["id"],
                "result": "accepted" if e.status == 201 else "duplicate",
            }
            if e.status == 201:
                assert e.request["id"] not in accepted, f"accepted twice: {e}"
                accepted[e.request["id"]] = (e.request["sku"], e.request["qty"])
            else:
                assert accepted.get(e.request["id"]) == (e.request["sku"], e.request["qty"]), e
    assert accepted, "the fuzzer never had an order accepted: nothing was checked"

    orders = {row[0]: (row[1], row[2]) for row in db_rows(db, "SELECT id, sku, qty FROM orders")}
    assert orders == accepted, "orders that no 201 accounts for, or 201s not on disk"
    outbox = {row[0]: json.loads(row[1]) for row in db_rows(db, "SELECT id, payload FROM outbox")}
    assert outbox == {k: {"id": k, "sku": sku, "qty": qty} for k, (sku, qty) in accepted.items()}
