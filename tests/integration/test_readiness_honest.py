"""GET /readyz tells whether the real writes succeed, not only the probe, on both backends.

The probe updates one row of a health table in place: that needs no new page, no
privilege on the real tables and fires none of their triggers. So a trigger that
raises on the real table, or INSERT and UPDATE revoked from the service's role,
failed every write while /readyz said ready. Now a failed real write makes /readyz
503 (with the reason) until a real write succeeds again or the side's writes, tried
on the real tables and rolled back, pass; a request refused before it reached the
database (an invalid order) does not count either way. Checked with connections of
the test's own; the trial leaves nothing behind. A revoked privilege is PostgreSQL's
alone (SQLite has none).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest
from pg_faults import PgAccess
from sqlite_faults import SqliteFileAccess
from support import get_json, post_json

from publisher.app import ServiceSettings
from publisher.app import create_app as create_publisher
from publisher.retry import RetryPolicy
from publisher.settings import RelaySettings
from sink import create_app as create_sink

if TYPE_CHECKING:
    from conftest import PgSchemas, Serve

REFUSAL = "writes refused by a trigger of the test"
FAST = RelaySettings(poll_interval_s=0.1, retry=RetryPolicy(base_s=0.05, cap_s=0.3))
_ROLES = itertools.count(1)


async def ready(client: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    """/readyz's status, and its reason when it is not ready."""
    status, body = await get_json(client, f"{base}/readyz")
    return status, "" if status == 200 else body["reason"]


@dataclass(frozen=True)
class Side:
    """A database of one side, as `--db` takes it, and the test's own access to it."""

    db: str
    access: SqliteFileAccess | PgAccess


@dataclass(frozen=True)
class Sides:
    source: Side
    sink: Side


@pytest.fixture(params=["sqlite", "postgres"])
def sides(request: pytest.FixtureRequest, tmp_path: Path) -> Sides:
    """A source and a sink database on each backend in turn: two SQLite files, or two
    schemas of the session's PostgreSQL server."""
    if request.param == "sqlite":
        source, sink = tmp_path / "source.db", tmp_path / "sink.db"
        return Sides(
            Side(str(source), SqliteFileAccess(source)), Side(str(sink), SqliteFileAccess(sink))
        )
    schemas: PgSchemas = request.getfixturevalue("pg_schemas")
    source, sink_db = schemas.first, schemas.new()
    return Sides(
        Side(source, PgAccess(source, "outbox_health")),
        Side(sink_db, PgAccess(sink_db, "inbox_health")),
    )


async def test_publisher_is_not_ready_while_intake_fails_and_ready_once_its_writes_pass(
    sides: Sides, serve: Serve, client: aiohttp.ClientSession
) -> None:
    sink = await serve(create_sink(sides.sink.db))
    publisher = await serve(
        create_publisher(ServiceSettings(db=sides.source.db, sink=f"{sink}/events", relay=FAST))
    )
    access = sides.source.access
    orders = f"{publisher}/orders"
    assert await ready(client, publisher) == (200, "")
    with access.refusing("outbox_entries", ("INSERT",), REFUSAL):
        assert not access.others_cannot_write()  # the probe's row is writable
        status, _ = await post_json(client, orders, {"id": "a", "sku": "snack", "qty": 1})
        assert status == 503
        status, reason = await ready(client, publisher)
        assert (status, REFUSAL in reason) == (503, True), reason
        # A request refused before the database proves nothing: still not ready.
        assert (await post_json(client, orders, {"id": "bad id", "sku": "snack"}))[0] == 400
        assert (await ready(client, publisher))[0] == 503
    # No real write since, but the trial of intake's and the relay's writes passes.
    assert await ready(client, publisher) == (200, "")
    status, _ = await post_json(client, orders, {"id": "a", "sku": "snack", "qty": 1})
    assert status == 201
    assert access.query("SELECT id FROM outbox_entries") == [("a",)]
    assert access.query("SELECT id FROM outbox_orders") == [("a",)]


async def test_sink_is_not_ready_while_events_fail_and_ready_once_its_writes_pass(
    sides: Sides, serve: Serve, client: aiohttp.ClientSession
) -> None:
    sink = await serve(create_sink(sides.sink.db))
    access = sides.sink.access
    event = {"id": "e1", "sku": "snack", "qty": 2}
    assert await ready(client, sink) == (200, "")
    with access.refusing("inbox_events", ("INSERT",), REFUSAL):
        assert (await post_json(client, f"{sink}/events", event))[0] == 503
        status, reason = await ready(client, sink)
        assert (status, REFUSAL in reason) == (503, True), reason
        assert (await post_json(client, f"{sink}/events", {"id": "e2"}))[0] == 400
        assert (await ready(client, sink))[0] == 503
    assert await ready(client, sink) == (200, "")
    assert (await post_json(client, f"{sink}/events", event))[0] == 200
    assert access.query("SELECT id, deliveries FROM inbox_events") == [("e1", 1)]
    assert access.query("SELECT sku, qty FROM inbox_inventory") == [("snack", 2)]


@pytest.fixture
def service_role(pg_schemas: PgSchemas) -> Iterator[str]:
    """A role of this test's own, not a superuser: a URI of the test's first schema as
    that role, its tables made first by the superuser and granted to it."""
    role = f"svc_readyz_{next(_ROLES)}"
    admin = PgAccess(pg_schemas.first, "outbox_health")
    schema = admin.query("SELECT current_schema()")[0][0]
    admin.execute(
        f"CREATE ROLE {role} LOGIN", f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO {role}'
    )
    try:
        yield pg_schemas.first.replace("://outbox@", f"://{role}@", 1)
    finally:
        pg_schemas.database.clean()  # its sessions ended, its schema (and grants) gone
        admin_url = pg_schemas.database.url
        PgAccess(admin_url, "outbox_health").execute(f"DROP OWNED BY {role}", f"DROP ROLE {role}")


async def test_publisher_is_not_ready_while_insert_and_update_are_revoked(
    pg_schemas: PgSchemas, service_role: str, serve: Serve, client: aiohttp.ClientSession
) -> None:
    from publisher import Outbox

    admin = PgAccess(pg_schemas.first, "outbox_health")
    async with Outbox.open(pg_schemas.first):  # the tables, made by the superuser
        pass
    role = service_role.split("://", 1)[1].split("@", 1)[0]
    grants = "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}"
    schema = admin.query("SELECT current_schema()")[0][0]
    admin.execute(
        "GRANT " + grants.format(f'"{schema}"', role),
        f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO {role}',
    )
    sink = await serve(create_sink(pg_schemas.new()))
    publisher = await serve(
        create_publisher(ServiceSettings(db=service_role, sink=f"{sink}/events", relay=FAST))
    )
    orders = f"{publisher}/orders"
    assert await ready(client, publisher) == (200, "")
    admin.execute(f"REVOKE INSERT, UPDATE ON outbox_entries, outbox_orders FROM {role}")
    assert (await post_json(client, orders, {"id": "a", "sku": "snack", "qty": 1}))[0] == 503
    status, reason = await ready(client, publisher)
    assert (status, "permission denied" in reason) == (503, True), reason
    admin.execute(f"GRANT INSERT, UPDATE ON outbox_entries, outbox_orders TO {role}")
    assert await ready(client, publisher) == (200, "")
    assert (await post_json(client, orders, {"id": "a", "sku": "snack", "qty": 1}))[0] == 201
