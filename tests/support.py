"""Helpers the tests share: service processes started and stopped, small HTTP and CLI calls.

Starting and stopping goes through chaos.procs, so the tests, the chaos runner and the
benchmark handle their child processes in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from chaos.procs import ChaosError, read_first_line, terminate
from shared import Event, Order, Receipt, make_ack, order_event, payload_digest, validate_order

if TYPE_CHECKING:
    from conftest import RunCli

    from publisher import Outbox
    from sink import Inbox

LOOPBACK = "127.0.0.1"
STARTUP_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
WAIT_S = 10.0
POLL_S = 0.05
ASYNC_POLL_S = 0.01  # in-process waits: nothing is started or stopped
JSON_BODY = {"Content-Type": "application/json"}


# ---------------------------------------------------------------- service processes


def spawn(
    args: Sequence[str], log: Path, env: dict[str, str], cwd: Path
) -> subprocess.Popen[bytes]:
    """`python args...`: stdout piped for the listening line, stderr written to `log`."""
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=cwd,
        )


def listening(
    proc: subprocess.Popen[bytes], log: Path, pattern: re.Pattern[str], name: str
) -> re.Match[str]:
    """The process's first line, which must match `pattern` whole, within the startup time."""
    try:
        line = read_first_line(proc, name, log, STARTUP_TIMEOUT_S, exit_timeout_s=STOP_TIMEOUT_S)
    except ChaosError as exc:
        raise AssertionError(f"{exc}; log: {log.read_text()!r}") from None
    match = pattern.fullmatch(line)
    assert match is not None, f"{name}: unexpected first line {line!r}"
    return match


def stop_process(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL if it does not end in time; close the pipe. The exit status."""
    status = terminate(proc, STOP_TIMEOUT_S)
    if proc.stdout is not None:
        proc.stdout.close()
    return status


# ---------------------------------------------------------------- test data


def event(event_id: str, sku: str = "snack", qty: int = 1) -> Order:
    """An order as a client sends it to the order intake (POST /orders, accept)."""
    return {"id": event_id, "sku": sku, "qty": qty}


def as_event(one: Event | Order) -> Event:
    """`one` as the event the relay sends: an order becomes its order.placed event."""
    return one if "type" in one else order_event(validate_order(one))  # type: ignore[return-value]


def ack(one: Event | Order, receipt: Receipt = Receipt.APPLIED) -> dict[str, str]:
    """The ACK a sink gives for `one` (an event, or an order as the event it is sent
    as): applied unless `receipt` says otherwise."""
    return make_ack(one["id"], receipt, payload_digest(as_event(one)))


def padded(document: object, size: int) -> bytes:
    """`document` as JSON, padded with whitespace to exactly `size` bytes."""
    body = json.dumps(document).encode()
    assert len(body) <= size
    return body + b" " * (size - len(body))


def sent_events(body: Any) -> list[Event]:
    """The events a parsed request body of the publisher carries: a CloudEvent
    (structured mode), an array of them (batched mode), or the previous release's
    `{"events": [...]}` of orders."""
    if isinstance(body, dict) and "events" in body:
        return [as_event(one) for one in body["events"]]
    envelopes = body if isinstance(body, list) else [body]
    events: list[Event] = []
    for envelope in envelopes:
        one: Event = {"id": envelope["id"], "type": envelope["type"], "data": envelope["data"]}
        if "partitionkey" in envelope:
            one["key"] = envelope["partitionkey"]
        events.append(one)
    return events


def placed(event_id: str, sku: str = "snack", qty: int = 1) -> Event:
    """The order.placed event the order `event(event_id, sku, qty)` is recorded as:
    what the relay sends and the sink stores."""
    return order_event(validate_order(event(event_id, sku, qty)))


def numbered_event(n: int, sku: str = "snack", qty: int = 1) -> Event:
    """The `n`th order: ID order-<n>."""
    return event(f"order-{n}", sku, qty)


async def accept(outbox: Outbox, *ids: str, qty: int = 1) -> None:
    """Accept event(id, qty=qty) for each of `ids`, in that order; each must be new."""
    for event_id in ids:
        assert await outbox.accept(event(event_id, qty=qty)) == "accepted"


async def accept_events(outbox: Outbox, events: Sequence[Event]) -> list[str]:
    """Accept each of `events`, in that order; each must be new. Their IDs."""
    for one in events:
        assert await outbox.accept(dict(one)) == "accepted"
    return [one["id"] for one in events]


async def accept_numbered(outbox: Outbox, count: int) -> list[str]:
    """Accept `count` new orders, e00 onwards; their IDs."""
    ids = [f"e{n:02d}" for n in range(count)]
    await accept(outbox, *ids)
    return ids


@contextlib.contextmanager
def in_progress(inbox: Inbox, requests: int) -> Iterator[None]:
    """What the sink reports while `requests` write requests are in progress."""
    with contextlib.ExitStack() as stack:
        for _ in range(requests):
            stack.enter_context(inbox.arriving())
        yield


# ---------------------------------------------------------------- independent reads


def query(db: Path | str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows read through a fresh connection of this test process, closed afterwards:
    a SQLite file, or a PostgreSQL database by its URI (`?` placeholders either way)."""
    if isinstance(db, str) and db.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(db, autocommit=True, connect_timeout=5) as pg:
            found = pg.execute(sql.replace("?", "%s") if params else sql, params or None)
            return [tuple(row) for row in found.fetchall()]
    conn = sqlite3.connect(db, timeout=5)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


# An outbox entry's canonical event over `outbox_entries`, on SQLite: a large event's
# row holds '' and its text is in outbox_payloads (PostgreSQL keeps it in `payload`).
SQLITE_ENTRY_PAYLOAD = (
    "coalesce(nullif(payload, ''),"
    " (SELECT p.payload FROM outbox_payloads AS p WHERE p.seq = outbox_entries.seq))"
)


def entry_payload(db: Path | str) -> str:
    """The SQL, over `outbox_entries`, of each entry's canonical event in `db`."""
    is_pg = isinstance(db, str) and db.startswith(("postgresql://", "postgres://"))
    return "payload" if is_pg else SQLITE_ENTRY_PAYLOAD


def sent_ids(source: Path | str) -> list[str]:
    """The outbox's entries marked sent, in seq order."""
    return [
        r[0] for r in query(source, "SELECT id FROM outbox_entries WHERE sent = 1 ORDER BY seq")
    ]


def sent_flags(source: Path | str) -> dict[str, int]:
    """ID -> its sent flag (1 once marked sent), for every outbox entry."""
    return dict(query(source, "SELECT id, sent FROM outbox_entries ORDER BY seq"))


def inbox_ids(sink: Path | str) -> list[str]:
    """The inbox's IDs in the order the sink applied them."""
    return [r[0] for r in query(sink, "SELECT id FROM inbox_events ORDER BY applied_seq")]


def inventory(sink: Path | str) -> dict[str, int]:
    """SKU -> quantity, as the sink's inventory holds them."""
    return dict(query(sink, "SELECT sku, qty FROM inbox_inventory"))


def deliveries(sink: Path | str) -> dict[str, int]:
    """ID -> how many times the sink received it."""
    return dict(query(sink, "SELECT id, deliveries FROM inbox_events"))


def snapshot(sink: Path | str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every row of the sink's inbox and inventory, in a fixed order: equal before and
    after a request only if it changed nothing."""
    return (
        query(sink, "SELECT * FROM inbox_events ORDER BY id"),
        query(sink, "SELECT * FROM inbox_inventory ORDER BY sku"),
    )


async def pending_ids(outbox: Outbox) -> list[str]:
    """The IDs of the outbox's pending entries (the first 16), in the order it gives them."""
    return [entry["id"] for entry in await outbox.pending(16)]


# The sqlite_tx tests' own schema: one table of named items.
ITEMS_SCHEMA = ("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)",)


def try_write_lock(path: Path) -> None:
    """Take and release the write lock from another connection, without waiting."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    finally:
        conn.close()


# ---------------------------------------------------------------- small calls


def http_request(
    port: int,
    method: str,
    path: str,
    body: object = None,
    *,
    token: str | None = None,
    timeout_s: float = 5.0,
) -> tuple[int, Any]:
    """One request to a service on loopback, `body` (if any) as JSON and `token` (if
    any) as its bearer token; (status, the parsed JSON reply, None if it is empty)."""
    headers = dict(JSON_BODY)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout_s)
    try:
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def raw_get(host: str, path: str) -> bytes:
    """The bytes of a GET request to `host` (host:port), for a socket of the test's own."""
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()


def post_order(port: int, order: dict[str, Any], timeout_s: float = 5.0) -> tuple[int, Any]:
    """POST /orders to a publisher on loopback; (status, parsed JSON body)."""
    return http_request(port, "POST", "/orders", order, timeout_s=timeout_s)


def post_event(port: int, event: dict[str, Any], timeout_s: float = 5.0) -> int:
    """POST one event straight to a sink on loopback; the status."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout_s)
    try:
        conn.request("POST", "/events", json.dumps(event), {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def wait_until(check: Callable[[], bool], timeout_s: float = WAIT_S) -> float:
    """Poll `check` until it holds; the seconds that took. Fails after `timeout_s`."""
    started = time.monotonic()
    for _ in range(int(timeout_s / POLL_S) + 10):
        if check():
            return time.monotonic() - started
        if time.monotonic() - started >= timeout_s:
            break
        time.sleep(POLL_S)
    raise AssertionError(f"condition not met within {timeout_s}s")


async def eventually(
    check: Callable[[], object],
    timeout_s: float = WAIT_S,
    poll_s: float = ASYNC_POLL_S,
    what: str = "condition",
) -> float:
    """`wait_until` for a test on the event loop: sleeps without blocking it. `what`
    names the condition in the failure."""
    started = time.monotonic()
    for _ in range(int(timeout_s / poll_s) + 10):
        if check():
            return time.monotonic() - started
        if time.monotonic() - started >= timeout_s:
            break
        await asyncio.sleep(poll_s)
    raise AssertionError(f"{what} not met within {timeout_s}s")


async def settle(*tasks: asyncio.Task[Any]) -> None:
    """Cancel what is still running and wait for it: no task outlives its test."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def run_module(
    module: str, *args: str, env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`python -m module args...` run to completion within `timeout`; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def serve_args(db: Path | str, sink_url: str, *extra: str) -> tuple[str, ...]:
    """`publisher serve`'s arguments: `db` relayed to `sink_url`, listening on a free
    loopback port, then `extra`."""
    return ("--db", str(db), "--sink", sink_url, "--host", LOOPBACK, "--port", "0", *extra)


def dispatch(run_cli: RunCli, source: Path | str, url: str, *extra: str) -> tuple[int, str, str]:
    """`publisher dispatch` run to completion; (exit status, stdout, stderr), no traceback."""
    result = run_cli("publisher", "dispatch", "--db", str(source), "--sink", url, *extra)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout, result.stderr


def json_of_python(code: str, timeout_s: float = 30.0) -> Any:
    """Run `code` in a fresh interpreter from the repository root; the JSON it prints.
    What a fresh process imports is seen only there, not in this test process."""
    root = Path(__file__).resolve().parents[1]
    found = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    return json.loads(found.stdout)


# ---------------------------------------------------------------- over a test's HTTP client


async def request_json(
    client: aiohttp.ClientSession,
    method: str,
    url: str,
    body: object = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, Any]:
    """One request, `body` (if any) sent as JSON; (status, the JSON reply, which it must be)."""
    async with client.request(method, url, json=body, headers=headers) as response:
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json()


async def post_json(
    client: aiohttp.ClientSession, url: str, body: object, headers: Mapping[str, str] | None = None
) -> tuple[int, Any]:
    return await request_json(client, "POST", url, body, headers)


async def get_json(client: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    return await request_json(client, "GET", url)


async def post_events(
    client: aiohttp.ClientSession,
    base: str,
    route: str,
    events: Sequence[object],
    headers: Mapping[str, str] | None = None,
) -> tuple[int, Any]:
    """One event to a sink's /events (route "event") or a batch to /events/batch (route
    "batch"); (status, the JSON reply)."""
    if route == "event":
        (one,) = events
        return await post_json(client, f"{base}/events", one, headers)
    return await post_json(client, f"{base}/events/batch", {"events": list(events)}, headers)


async def post_body(
    client: aiohttp.ClientSession, url: str, body: bytes | object
) -> tuple[int, str, Any]:
    """POST `body` as a JSON document (bytes sent as they are, so a malformed one too);
    (status, the reply's content type, its JSON)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with client.post(url, data=data, headers=JSON_BODY) as response:
        return response.status, response.content_type, await response.json()


Samples = dict[tuple[str, tuple[Any, ...]], float]


async def scrape(client: aiohttp.ClientSession, url: str) -> Samples:
    """GET /metrics, parsed with prometheus_client's own parser: (sample name, sorted
    labels) -> value."""
    async with client.get(url) as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


class ManualClock:
    """A clock the test moves by hand (`now`, `advance`), for code that takes a clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Callables:
    """A Sender (publisher.driver) over a test's own functions: `one(event)` for one
    event per request and, for batch delivery, `many(events)`. `after` and `lease` are
    passed on only when a request has them, so a function that takes neither serves a
    line that needs neither. `checked(event_id)` says whether the sink is known to
    enforce the predecessor check (as HttpSender.predecessor_checked); without it the
    sink is trusted to from the start, so a pipelined line pipelines at once."""

    def __init__(
        self,
        one: Callable[..., Any],
        many: Callable[..., Any] | None = None,
        checked: Callable[[str], bool] | None = None,
    ) -> None:
        self.one, self.many, self.checked = one, many, checked

    async def deliver(self, event: Any, /, *, after: Any = None, lease: Any = None) -> Any:
        return await self.one(event, **_given(after=after, lease=lease))

    async def deliver_batch(self, events: Any, /, *, after: Any = None, lease: Any = None) -> Any:
        assert self.many is not None, "this sender delivers one event per request"
        return await self.many(events, **_given(after=after, lease=lease))

    def predecessor_checked(self, event_id: str | None) -> bool:
        if self.checked is None:
            return True
        return event_id is not None and self.checked(event_id)


def _given(**options: Any) -> dict[str, Any]:
    return {name: value for name, value in options.items() if value is not None}
