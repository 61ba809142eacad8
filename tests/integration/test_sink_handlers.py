"""A sink with handlers of its own, over real HTTP on loopback: what each outcome of
a handler is answered with (200 and an ACK, 422 naming the type or the reason, 503
"handler failed" with no traceback over the wire and one in the log), in a batch and
alone, what the metrics count, and `python -m sink --handlers MODULE:ATTR` as a real
process. The same behaviour on every backend is tests/behaviour/test_inbox_handlers.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
from aiohttp import web
from jsonschema import Draft202012Validator
from relay_lines import MODES, Mode, relay_for, running, sender_for
from support import (
    eventually,
    get_json,
    in_progress,
    post_events,
    query,
    scrape,
    sent_ids,
    value,
)

import sink
from plumbing.storage import StorageError
from publisher import Outbox
from shared import Receipt, payload_digest
from sink import HandledEvent, Handlers, Inbox, Reject, Statement, create_app
from sink.backends.sqlite import SqliteInbox
from sink.store import Incoming

LEDGER: Final = "CREATE TABLE ledger (payment_id TEXT PRIMARY KEY, cents INTEGER NOT NULL)"
ADD: Final = "INSERT INTO ledger (payment_id, cents) VALUES (:payment_id, :cents)"


def ledger_handlers() -> Handlers:
    handlers = Handlers("payments")
    handlers.schema(LEDGER)

    @handlers.on("payment.captured")
    def captured(event: HandledEvent) -> list[Statement]:
        cents = event.data["amount_cents"]
        if cents <= 0:
            raise Reject("amount must be positive")
        if event.data.get("explode"):
            raise KeyError("secret-detail-of-the-bug")
        return [(ADD, {"payment_id": event.id, "cents": cents})]

    return handlers


def payment(
    payment_id: str, cents: int = 1999, customer: str = "c-9", **more: object
) -> dict[str, Any]:
    return {
        "id": payment_id,
        "type": "payment.captured",
        "key": customer,
        "data": {"amount_cents": cents, **more},
    }


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "consumer.db"


@pytest.fixture
async def base(serve: Any, db: Path) -> str:
    url: str = await serve(create_app(db, handlers=ledger_handlers()))
    return url


def ledger(db: Path) -> list[tuple[Any, ...]]:
    return query(db, "SELECT payment_id, cents FROM ledger ORDER BY payment_id")


def inbox(db: Path) -> list[str]:
    return [row[0] for row in query(db, "SELECT id FROM inbox_events ORDER BY id")]


async def test_an_event_its_handler_takes_is_acknowledged_with_its_effect_committed(
    base: str, client: aiohttp.ClientSession, db: Path
) -> None:
    status, ack = await post_events(client, base, "event", [payment("p-1")])

    assert status == 200, ack
    assert (ack["ack"], ack["status"]) == ("p-1", "applied")
    assert ack["sha256"] == payload_digest(payment("p-1"))
    assert ledger(db) == [("p-1", 1999)]
    assert inbox(db) == ["p-1"]


@pytest.mark.parametrize(
    ("one", "error", "detail"),
    [
        (
            {"id": "s-1", "type": "shipment.sent", "data": {}},
            "no handler",
            "no handler for type shipment.sent",
        ),
        (payment("p-0", 0), "rejected", "amount must be positive"),
    ],
    ids=["no-handler", "reject"],
)
async def test_an_event_no_handler_takes_or_rejected_is_422_naming_why_and_records_nothing(
    base: str, client: aiohttp.ClientSession, db: Path, one: dict[str, Any], error: str, detail: str
) -> None:
    status, reply = await post_events(client, base, "event", [one])

    assert status == 422, reply
    assert reply == {"error": error, "id": one["id"], "type": one["type"], "detail": detail}
    assert inbox(db) == []
    samples = await scrape(client, f"{base}/metrics")
    assert value(samples, "sink_inbox_received_total", result="rejected") == 1


async def test_a_failing_handler_is_503_without_its_traceback_which_goes_to_the_log_once(
    base: str, client: aiohttp.ClientSession, db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="sink.app"):
        replies = [
            await post_events(client, base, "event", [payment(f"p-{n}", explode=True)])
            for n in range(3)
        ]

    for status, reply in replies:
        assert status == 503, reply
        assert reply["error"] == "handler failed" and reply["type"] == "payment.captured"
        assert reply["detail"] == "KeyError"
        assert "secret-detail-of-the-bug" not in json.dumps(reply)
    assert inbox(db) == [] and ledger(db) == []
    logged = [r for r in caplog.records if "handler of payment.captured failed" in r.message]
    assert len(logged) == 1, [r.message for r in caplog.records]  # throttled
    assert logged[0].exc_info is not None and logged[0].exc_info[0] is KeyError
    samples = await scrape(client, f"{base}/metrics")
    assert value(samples, "sink_inbox_received_total", result="failed") == 3


async def test_a_batch_is_answered_up_to_the_event_its_handler_does_not_take(
    base: str, client: aiohttp.ClientSession, db: Path
) -> None:
    events = [payment("p-1"), payment("p-2", 0), payment("p-3")]

    status, reply = await post_events(client, base, "batch", events)

    assert status == 200, reply
    assert [ack["ack"] for ack in reply["acks"]] == ["p-1"]
    assert reply["rejected"] == {
        "index": 1,
        "status": 422,
        "error": "rejected",
        "id": "p-2",
        "type": "payment.captured",
        "detail": "amount must be positive",
    }
    assert inbox(db) == ["p-1"] and ledger(db) == [("p-1", 1999)]

    status, reply = await post_events(client, base, "batch", [payment("p-2", explode=True)])
    assert status == 200 and reply["acks"] == [], reply
    assert (reply["rejected"]["status"], reply["rejected"]["error"]) == (503, "handler failed")


async def test_a_duplicate_is_acknowledged_without_the_handler(
    base: str, client: aiohttp.ClientSession, db: Path
) -> None:
    await post_events(client, base, "event", [payment("p-1")])

    status, ack = await post_events(client, base, "event", [payment("p-1")])

    assert status == 200 and ack["status"] == "duplicate", ack
    status, record = await get_json(client, f"{base}/events/p-1")
    assert status == 200 and record["deliveries"] == 2
    assert ledger(db) == [("p-1", 1999)]


# ---------------------------------------------------------------- the command

MODULE: Final = f'''
from sink import Handlers, Reject

handlers = Handlers("payments")
handlers.schema("{LEDGER}")

@handlers.on("payment.captured")
def captured(event):
    if event.data["amount_cents"] <= 0:
        raise Reject("amount must be positive")
    return [("{ADD}", {{"payment_id": event.id, "cents": event.data["amount_cents"]}})]
'''


async def test_the_command_loads_a_registry_from_a_module_of_the_users_own(
    sink_process: Any, tmp_path: Path, client: aiohttp.ClientSession
) -> None:
    (tmp_path / "consumer_handlers.py").write_text(MODULE)  # the process's directory
    db = tmp_path / "consumer.db"
    sink = sink_process(db, "--handlers", "consumer_handlers:handlers")
    base = sink.url.removesuffix("/events")

    assert (await post_events(client, base, "event", [payment("p-1")]))[0] == 200
    status, reply = await post_events(
        client, base, "event", [{"id": "o-1", "type": "x", "data": {}}]
    )

    assert status == 422 and reply["error"] == "no handler", reply
    assert ledger(db) == [("p-1", 1999)]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("no_such_module:handlers", "cannot import no_such_module"),
        ("json:dumps", "json:dumps is a function, not a sink.Handlers registry"),
        ("json", "--handlers wants MODULE:ATTR"),
        ("json:nothing_here", "json has no attribute nothing_here"),
    ],
)
def test_the_command_refuses_a_registry_it_cannot_load_in_one_line(
    tmp_path: Path, child_env: dict[str, str], spec: str, said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sink", "--db", str(tmp_path / "s.db"), "--handlers", spec],
        capture_output=True,
        text=True,
        env=child_env,
        cwd=tmp_path,
        timeout=30,
        check=False,
    )

    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"outbox-sink: {said}"), done.stderr
    assert not (tmp_path / "s.db").exists()


# ---------------------------------------------------------------- mounted


async def test_mounted_in_an_app_of_ones_own_its_guards_keep_to_its_own_routes(
    serve: Any, db: Path, client: aiohttp.ClientSession
) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"hello": "yours"})

    mine = web.Application()
    mine.router.add_get("/hello", hello)
    mine.add_subapp("/outbox/", create_app(db, handlers=ledger_handlers(), token="s3cret"))
    base = await serve(mine)
    bearer = {"Authorization": "Bearer s3cret"}

    # The user's route: no token, and a Host the sink's own routes would refuse.
    async with client.get(f"{base}/hello", headers={"Host": "app.example"}) as response:
        assert response.status == 200 and await response.json() == {"hello": "yours"}
    async with client.get(f"{base}/outbox/events/p-1", headers={"Host": "app.example"}) as reply:
        assert reply.status == 421, await reply.text()
    # The sink's routes under the prefix: its probes open, its writes behind the token.
    async with client.get(f"{base}/outbox/healthz") as response:
        assert response.status == 200
    status, reply = await post_events(client, f"{base}/outbox", "event", [payment("p-1")])
    assert status == 401, reply
    status, ack = await post_events(client, f"{base}/outbox", "event", [payment("p-1")], bearer)
    assert status == 200 and ack["ack"] == "p-1", ack
    status, reply = await post_events(
        client, f"{base}/outbox", "batch", [payment("p-2", 0)], bearer
    )
    assert status == 200 and reply["rejected"]["status"] == 422, reply
    assert ledger(db) == [("p-1", 1999)]


# ---------------------------------------------------------------- as documented


def documented(status: str, path: str = "/events") -> Draft202012Validator:
    """The validator of the sink's OpenAPI document for the reply of POST `path`."""
    document = json.loads((Path(sink.__file__).parent / "openapi.json").read_text())
    response = document["paths"][path]["post"]["responses"][status]
    schema = response["content"]["application/json"]["schema"]
    return Draft202012Validator({**schema, "components": document["components"]})


async def test_the_replies_of_handlers_are_the_ones_the_openapi_document_describes(
    base: str, client: aiohttp.ClientSession
) -> None:
    unknown = {"id": "s-1", "type": "shipment.sent", "data": {}}
    for one, status in [
        (unknown, 422),
        (payment("p-0", 0), 422),
        (payment("p-x", explode=True), 503),
    ]:
        got, reply = await post_events(client, base, "event", [one])
        assert got == status, reply
        documented(str(status)).validate(reply)

    got, reply = await post_events(client, base, "batch", [payment("p-1"), payment("p-2", 0)])
    assert got == 200 and reply["rejected"]["status"] == 422, reply
    documented("200", "/events/batch").validate(reply)
    got, reply = await post_events(client, base, "batch", [payment("p-3", explode=True)])
    assert got == 200 and reply["rejected"]["status"] == 503, reply
    documented("200", "/events/batch").validate(reply)


# ---------------------------------------------------------------- what the relay does


@pytest.mark.parametrize("mode", MODES)
async def test_the_relay_blocks_a_line_on_a_422_and_retries_a_503_until_a_fix_is_deployed(
    serve: Any, outbox: Outbox, db: Path, tmp_path: Path, mode: Mode
) -> None:
    deployed = {"fixed": False}  # what a redeploy of the consumer would change
    handlers = Handlers("payments")
    handlers.schema(LEDGER)

    @handlers.on("payment.captured")
    def captured(event: HandledEvent) -> list[Statement]:
        if event.data.get("buggy") and not deployed["fixed"]:
            raise ZeroDivisionError("a bug fixed by the next release")
        return [(ADD, {"payment_id": event.id, "cents": event.data["amount_cents"]})]

    consumer = tmp_path / "consumer.db"
    url = await serve(create_app(consumer, handlers=handlers))
    failing, after = payment("p-1", 10, buggy=True), payment("p-2", 20)
    unknown = {"id": "u-1", "type": "refund.issued", "key": "c-1", "data": {}}
    for one in (failing, after, unknown, payment("p-3", 30, customer="c-1")):
        await outbox.publish(one)

    async with sender_for(f"{url}/events") as sender:
        relay = relay_for(outbox, sender, mode, ordering="key", pipeline=1)
        async with running(relay):
            # c-9's line retries its head (503: retryable); c-1's is blocked for good
            # at the type no handler takes (422: permanent).
            await eventually(lambda: attempts(db, "p-1") >= 3 and attempts(db, "u-1") >= 1)
            lanes = relay.blocked_lanes
            assert lanes["c-9"].permanent is False and "503" in lanes["c-9"].reason
            assert lanes["c-1"].permanent is True and "422" in lanes["c-1"].reason
            assert sent_ids(db) == [] and ledger(consumer) == []
            deployed["fixed"] = True
            await eventually(lambda: set(sent_ids(db)) == {"p-1", "p-2"})

    assert ledger(consumer) == [("p-1", 10), ("p-2", 20)]
    assert inbox(consumer) == ["p-1", "p-2"]  # nothing of the line behind refund.issued


def attempts(db: Path, event_id: str) -> int:
    ((count,),) = query(db, "SELECT attempts FROM outbox_entries WHERE id = ?", (event_id,))
    return int(count)


# ---------------------------------------------------------------- SQLite's own


def blobs() -> Handlers:
    """A registry whose one handler writes a large row, and one that would end the
    transaction by its conflict clause."""
    handlers = Handlers("blobs")
    handlers.schema("CREATE TABLE blobs (id TEXT PRIMARY KEY, body BLOB NOT NULL)")

    @handlers.on("blob.stored")
    def stored(event: HandledEvent) -> list[Statement]:
        data = event.data
        params = {"id": data.get("blob", event.id), "body": b"x" * data["size"]}
        return [("INSERT OR ROLLBACK INTO blobs (id, body) VALUES (:id, :body)", params)]

    @handlers.on("blob.many")
    def many(event: HandledEvent) -> list[Statement]:
        # One statement that writes ten rows: SQLite undoes it alone when the disk is full.
        return [(TEN_BLOBS, {"id": event.id, "size": event.data["size"]})]

    return handlers


TEN_BLOBS: Final = (
    "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 10)"
    " INSERT INTO blobs (id, body) SELECT :id || '.' || x, zeroblob(:size) FROM n"
)


def blob(event_id: str, size: int = 10, kind: str = "stored", **data: object) -> Incoming:
    """A blob.stored event (one blob of `size` bytes) or blob.many (ten)."""
    body = {"size": size, **data}
    return Incoming.checked({"id": event_id, "type": f"blob.{kind}", "data": body})


async def test_a_full_disk_under_a_handlers_statement_records_nothing_of_its_event(
    db: Path,
) -> None:
    async with Inbox.open(db, blobs()) as opened:
        assert isinstance(opened, SqliteInbox)
        await opened.receive_batch([blob("a")])
        pages = await opened._db.run(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        await opened._db.run(lambda c: c.execute(f"PRAGMA max_page_count = {pages + 2}"))

        # A redelivery first sends the batch event by event: the full disk is the
        # database's failure there too, not the handler's.
        with pytest.raises(StorageError, match="full"):
            await opened.receive_batch([blob("a"), blob("b", 20_000, "many")])

        await opened._db.run(lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
        again = await opened.receive_batch([blob("a"), blob("b", 20_000, "many")])

    assert [r.receipt for r in again.received] == [Receipt.DUPLICATE, Receipt.APPLIED]
    assert inbox(db) == ["a", "b"]
    assert query(db, "SELECT count(*), sum(length(body)) FROM blobs") == [(11, 200_010)]
    assert query(db, "SELECT count(*) FROM blobs WHERE id LIKE 'b.%'") == [(10,)]


async def test_a_statement_that_rolls_the_transaction_back_fails_it_whole(db: Path) -> None:
    async with Inbox.open(db, blobs()) as opened:
        await opened.receive_batch([blob("a")])
        with in_progress(opened, 2):
            got = await asyncio.gather(
                opened.receive_batch([blob("c")]),
                opened.receive_batch([blob("d"), blob("a-again", blob="a")]),
                return_exceptions=True,
            )
        # INSERT OR ROLLBACK of a known blob ID ends the transaction: nothing of the
        # group is kept, every call is told the database failed, and the inbox goes on.
        after = await opened.receive_batch([blob("e")])

    assert all(isinstance(one, StorageError) for one in got), got
    assert "ended the inbox's transaction" in str(got[1])
    assert [r.receipt for r in after.received] == [Receipt.APPLIED]
    assert inbox(db) == ["a", "e"]
