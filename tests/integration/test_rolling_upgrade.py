"""Rolling upgrade, sinks first: a publisher of the previous release delivers to this
release's sink, then this release's publisher takes over the same outbox.

The previous release is the code of commit PREVIOUS_RELEASE, taken out of this
repository's history with `git archive` into a temporary directory and run as its own
process with this virtualenv's python, that directory first on PYTHONPATH (its
dependencies are the ones installed here). The sink is `python -m sink` of this tree.
Orders go in over the old publisher's own HTTP API, duplicates among them; the test
waits until its outbox has nothing pending, then reads both databases with connections
of its own: each order is in the inbox once and counted once in the inventory, and the
old publisher verified every ACK at the first attempt (a failure would have left its
entry with a last_error, which that release never clears).

Between the old publisher and the sink a forwarder in the test process passes each
request on unchanged and notes its route and its Outbox-After and Outbox-Lease headers,
so each case shows that it exercised what it is about: the old release pipelines only
once the sink's replies say it enforces Outbox-After, and would otherwise fall back,
silently, to one request at a time. The forwarder holds the first requests until all
the orders are in, so the old publisher meets a backlog (as after a sink restart) and
batches and pipelines it; posted one by one, each order would be sent on its own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypedDict

import aiohttp
import pytest
from aiohttp import web
from support import (
    LOOPBACK,
    POLL_S,
    deliveries,
    eventually,
    inventory,
    post_json,
    query,
    run_module,
    serve_args,
)

from plumbing.schema import VERSIONS_TABLE
from publisher.backends import sqlite_sql

if TYPE_CHECKING:
    from conftest import PgSchemas, PublisherProcess, Serve, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

PREVIOUS_RELEASE: Final = "7ca1374873a014a00041b316c478ce5040069ddc"
PREVIOUS_VERSION: Final = 4  # its SQLite outbox's schema, kept in user_version
REPOSITORY: Final = Path(__file__).resolve().parents[2]
GIT_TIMEOUT_S: Final = 60.0
DRAIN_TIMEOUT_S: Final = 30.0
FORWARD_TIMEOUT_S: Final = 20.0
CLI_TIMEOUT_S: Final = 30.0
# The outbox's entries as each release names them: the previous release's tables
# keep their names until this release opens them (and renames them outbox_*).
OLD_ENTRIES: Final = "outbox"
ENTRIES: Final = "outbox_entries"

SKUS: Final = ("snack", "juice", "tea", "coffee", "bread")
ORDERS: Final = 60
# The wire names of the previous release's headers, spelled out: the test pins what
# that release sends, whatever this tree's constants come to be called.
AFTER: Final = "Outbox-After"
LEASE: Final = "Outbox-Lease"
# Not passed on by the forwarder: they belong to one connection, or aiohttp sets them.
HOP_BY_HOP: Final = frozenset(
    {"connection", "content-length", "host", "keep-alive", "transfer-encoding", "upgrade"}
)


# ---------------------------------------------------------------- the previous release


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's tree, out of this repository's history. Missing history
    fails the test: the promise is not checked by skipping it."""
    commit = git("cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}")
    if commit.returncode != 0:
        pytest.fail(
            f"the previous release, commit {PREVIOUS_RELEASE}, is not in the git history of"
            f" {REPOSITORY} ({commit.stderr.decode(errors='replace').strip()}): the rolling"
            " upgrade test needs it; fetch the full history (git fetch --unshallow)",
            pytrace=False,
        )
    tree = tmp_path_factory.mktemp("previous-release")
    archive = git("archive", PREVIOUS_RELEASE)
    assert archive.returncode == 0, archive.stderr.decode(errors="replace")
    subprocess.run(
        ["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=GIT_TIMEOUT_S
    )
    return tree


def git(*args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["git", "-C", str(REPOSITORY), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        pytest.fail(
            "git is not installed: the rolling upgrade test takes the previous"
            " release out of the repository's history with it",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def old_env(
    previous_release: Path, child_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """What a child process needs to run the previous release: its tree first on
    PYTHONPATH, ahead of this tree's editable install. Checked once: a process started
    so, in an empty directory as publisher_process starts them (python puts its working
    directory first on the path), imports those packages from there."""
    path = os.pathsep.join([str(previous_release), child_env["PYTHONPATH"]])
    env = {**child_env, "PYTHONPATH": path}
    code = "import publisher, shared, plumbing; print(publisher.__file__, shared.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path_factory.mktemp("old-release-check"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    for module in found.stdout.split():
        assert Path(module).is_relative_to(previous_release), found.stdout
    return {"PYTHONPATH": path}


# ---------------------------------------------------------------- the forwarder


@dataclass(frozen=True)
class Seen:
    """One request the forwarder passed on, and the sink's status for it."""

    method: str
    path: str
    after: str | None
    lease: str | None
    status: int


SESSION: Final = web.AppKey("session", aiohttp.ClientSession)


def forwarder(upstream: str, seen: list[Seen], opened: asyncio.Event) -> web.Application:
    """An app that passes every request on to `upstream` (a sink's base URL) and its
    reply back, bodies and headers as they are, and notes each in `seen`. Requests
    wait until `opened` is set (a sink slow to answer at first: a backlog builds up)."""

    async def session(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)
        async with aiohttp.ClientSession(auto_decompress=False, timeout=timeout) as client:
            app[SESSION] = client
            yield

    async def forward(request: web.Request) -> web.Response:
        await asyncio.wait_for(opened.wait(), FORWARD_TIMEOUT_S)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with request.app[SESSION].request(
            request.method,
            f"{upstream}{request.path_qs}",
            data=await request.read(),
            headers=headers,
            allow_redirects=False,
        ) as reply:
            body = await reply.read()
            back = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_BY_HOP}
        after, lease = request.headers.get(AFTER), request.headers.get(LEASE)
        seen.append(Seen(request.method, request.path, after, lease, reply.status))
        return web.Response(status=reply.status, body=body, headers=back)

    app = web.Application()
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


@dataclass
class Route:
    """This release's sink process, and the forwarder the old publisher reaches it by."""

    sink_db: Path | str
    sink_url: str  # the sink's own /events
    url: str  # /events through the forwarder
    seen: list[Seen]
    opened: asyncio.Event

    def open(self) -> None:
        """Let the requests held so far, and all later ones, through."""
        self.opened.set()

    def requests(self, path: str) -> list[Seen]:
        """The requests passed on, once checked: each a POST to `path`, under a lease
        (the old release leases its lines even alone on SQLite), answered 200, or 412
        (its predecessor not in yet, which that release resends without a failure)."""
        assert {(s.method, s.path) for s in self.seen} == {("POST", path)}, self.seen
        assert all(s.lease for s in self.seen), f"a request without {LEASE}: {self.seen}"
        assert {s.status for s in self.seen} <= {200, 412}, self.seen
        return self.seen


@pytest.fixture(params=["sqlite", "postgres"])
def sink_location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """The new sink's database: a SQLite file, or a schema on the session's PostgreSQL
    server (pg_database)."""
    if request.param == "sqlite":
        return tmp_path / "sink.db"
    location: str = request.getfixturevalue("pg_database")
    return location


@pytest.fixture
async def route(sink_location: Path | str, sink_process: StartSink, serve: Serve) -> Route:
    sink = sink_process(sink_location)
    seen: list[Seen] = []
    opened = asyncio.Event()
    base = await serve(forwarder(sink.base, seen, opened))
    return Route(sink_location, sink.url, f"{base}/events", seen, opened)


# ---------------------------------------------------------------- orders and reads


class Order(TypedDict):
    """An order as the intake of either release takes it."""

    id: str
    sku: str
    qty: int


def orders(prefix: str, count: int = ORDERS) -> list[Order]:
    """`count` orders over the SKUs, quantities 1 to 7."""
    return [Order(id=f"{prefix}-{n}", sku=SKUS[n % len(SKUS)], qty=1 + n % 7) for n in range(count)]


def totals(placed: list[Order]) -> dict[str, int]:
    """SKU -> the sum of its orders' quantities: the inventory each order counted once."""
    found: Counter[str] = Counter()
    for order in placed:
        found[order["sku"]] += order["qty"]
    return dict(found)


async def place(client: aiohttp.ClientSession, port: int, placed: list[Order]) -> None:
    """POST each order to a publisher's intake, then every third one again: accepted
    first (201), a duplicate the second time (200)."""
    url = f"http://{LOOPBACK}:{port}/orders"
    for order in placed:
        status, reply = await post_json(client, url, order)
        assert (status, reply["result"]) == (201, "accepted"), reply
    for order in placed[::3]:
        status, reply = await post_json(client, url, order)
        assert (status, reply["result"]) == (200, "duplicate"), reply


async def drained(source: Path | str, publisher: PublisherProcess, entries: str) -> None:
    """Wait, bounded, until the outbox has nothing pending in its table `entries`. A
    failure recorded on an entry (an ACK that did not verify, a status that is retried)
    ends the wait at once; the message shows the first entries pending or failed, and
    how the log ends."""

    def done() -> bool:
        assert publisher.proc.poll() is None, f"publisher exited: {publisher.log.read_text()}"
        [(pending, failed)] = query(
            source, f"SELECT coalesce(sum(1 - sent), 0), count(last_error) FROM {entries}"
        )
        assert failed == 0, "a delivery failed"
        return bool(pending == 0)

    try:
        await eventually(done, DRAIN_TIMEOUT_S, POLL_S, what="the outbox has nothing pending")
    except AssertionError as exc:
        first = query(
            source,
            f"SELECT id, attempts, last_error FROM {entries}"
            " WHERE sent = 0 OR last_error IS NOT NULL ORDER BY seq LIMIT 5",
        )
        log = publisher.log.read_text()[-3000:]
        raise AssertionError(f"{exc}; first entries: {first}; publisher log: {log}") from None


def delivered_once(source: Path | str, sink: Path | str, placed: list[Order], entries: str) -> None:
    """Every order is in the inbox once, received once, counted once in the inventory;
    every outbox entry (in the table `entries`) was marked sent at its first attempt,
    with no error recorded (the old release checked each ACK's digest before marking)."""
    ids = [order["id"] for order in placed]
    assert deliveries(sink) == dict.fromkeys(ids, 1)
    assert inventory(sink) == totals(placed)
    rows = query(source, f"SELECT id, sent, attempts, last_error FROM {entries} ORDER BY seq")
    assert sorted(e[0] for e in rows) == sorted(ids)
    assert [e for e in rows if e[1:] != (1, 1, None)] == []


def tables(source: Path) -> set[str]:
    """The tables of a SQLite file."""
    return {
        name for (name,) in query(source, "SELECT name FROM sqlite_master WHERE type = 'table'")
    }


# ---------------------------------------------------------------- the cases


async def test_batches_pipelined_by_the_old_publisher_are_applied_once(
    route: Route,
    old_env: dict[str, str],
    publisher_process: StartPublisher,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    source = tmp_path / "source.db"
    old = publisher_process(*serve_args(source, route.url), env=old_env)
    placed = orders("batch")

    await place(client, old.port, placed)
    route.open()
    await drained(source, old, OLD_ENTRIES)

    delivered_once(source, route.sink_db, placed, OLD_ENTRIES)
    sent = route.requests("/events/batch")
    assert any(s.after for s in sent), f"no request named its predecessor ({AFTER})"


async def test_single_requests_of_the_old_publisher_are_applied_once(
    route: Route,
    old_env: dict[str, str],
    publisher_process: StartPublisher,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    source = tmp_path / "source.db"
    old = publisher_process(*serve_args(source, route.url, "--delivery", "single"), env=old_env)
    placed = orders("single")

    await place(client, old.port, placed)
    route.open()
    await drained(source, old, OLD_ENTRIES)

    delivered_once(source, route.sink_db, placed, OLD_ENTRIES)
    sent = route.requests("/events")
    assert len(sent) >= len(placed)
    assert any(s.after for s in sent), f"no request named its predecessor ({AFTER})"


async def test_then_this_release_takes_over_the_old_outbox(
    route: Route,
    old_env: dict[str, str],
    child_env: dict[str, str],
    publisher_process: StartPublisher,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """The old publisher delivers in SKU lanes (each its own leased line) and stops;
    this release's publisher opens the same file, renames its tables outbox_* and keeps
    its version in VERSIONS_TABLE, resends nothing of it, and delivers the orders it
    takes in. The old release then refuses the file: its user_version is raised too."""
    source = tmp_path / "source.db"
    old = publisher_process(*serve_args(source, route.url, "--ordering", "sku"), env=old_env)
    first = orders("before")
    await place(client, old.port, first)
    route.open()
    await drained(source, old, OLD_ENTRIES)
    delivered_once(source, route.sink_db, first, OLD_ENTRIES)
    lines = {str(s.lease).split(" ")[1] for s in route.requests("/events/batch")}
    assert lines == set(SKUS)
    old.stop()
    assert old.proc.returncode == 0, old.log.read_text()
    # The file as the old release left it: its names, its version in user_version.
    assert {"orders", OLD_ENTRIES, "quarantines", "line_leases"} <= tables(source)
    assert not {ENTRIES, VERSIONS_TABLE} & tables(source)
    assert query(source, "PRAGMA user_version") == [(PREVIOUS_VERSION,)]

    new = publisher_process(*serve_args(source, route.sink_url))
    newest = len(sqlite_sql.MIGRATIONS)
    assert query(source, f"SELECT side, version FROM {VERSIONS_TABLE}") == [("publisher", newest)]
    assert query(source, "PRAGMA user_version") == [(newest,)]
    assert {"outbox_orders", ENTRIES, "outbox_quarantines", "outbox_line_leases"} <= tables(source)
    assert not {"orders", OLD_ENTRIES, "quarantines", "line_leases"} & tables(source)
    then = orders("after", 25)
    await place(client, new.port, then)
    await drained(source, new, ENTRIES)

    delivered_once(source, route.sink_db, first + then, ENTRIES)
    new.stop()
    assert new.proc.returncode == 0, new.log.read_text()
    refused = run_module(
        "publisher",
        *("accept", "--db", str(source), "--id", "late", "--sku", "snack", "--qty", "1"),
        env={**child_env, **old_env},
        cwd=tmp_path,
        timeout=CLI_TIMEOUT_S,
    )
    assert refused.returncode != 0 and "newer" in refused.stderr, refused
    assert query(source, f"SELECT count(*) FROM {ENTRIES} WHERE id = 'late'") == [(0,)]


@pytest.mark.parametrize("sink_location", ["postgres"], indirect=True)
async def test_two_old_relay_workers_on_one_outbox_apply_each_order_once(
    pg_schemas: PgSchemas,
    route: Route,
    old_env: dict[str, str],
    publisher_process: StartPublisher,
    client: aiohttp.ClientSession,
) -> None:
    """On PostgreSQL the previous release runs several relay workers on one outbox,
    each line delivered by the worker holding its lease, under the lease's epoch. (Which
    worker delivers which lane is theirs to agree: a worker takes any number of lines
    until its first renewal.)"""
    source = pg_schemas.new()
    workers = [
        publisher_process(
            *serve_args(source, route.url, "--ordering", "sku", "--worker-id", name),
            env=old_env,
        )
        for name in ("old-a", "old-b")
    ]
    placed = orders("workers")
    await place(client, workers[0].port, placed[::2])
    await place(client, workers[1].port, placed[1::2])
    route.open()
    for worker in workers:
        await drained(source, worker, OLD_ENTRIES)

    delivered_once(source, route.sink_db, placed, OLD_ENTRIES)
    leases = [str(s.lease).split(" ") for s in route.requests("/events/batch")]
    assert len({origin for origin, _, _ in leases}) == 1  # one outbox, whichever worker
    assert {line for _, line, _ in leases} == set(SKUS)
