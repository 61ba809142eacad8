"""Shared fixtures: real sink processes, real loopback servers, independent DB reads."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import aiohttp
import psycopg
import pytest
from aiohttp import web
from cli_support import as_a_child_process, process_state_kept
from support import LOOPBACK, STOP_TIMEOUT_S, listening, query, run_module, spawn, stop_process

from plumbing.pgserver import ServerUnavailable, ThrowawayServer
from publisher import Outbox
from shared import MAX_BODY_BYTES
from sink import create_app
from sink.chaos import Chaos, chaos_app

CLI_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 20.0  # a bound on each request of a test's HTTP client

PROXY_VARIABLES = (
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
)

# Child processes get this as their sitecustomize: name resolution is limited to
# loopback, so a refused-target check that regressed cannot reach another host.
NETWORK_GUARD = """\
import ipaddress
import socket

_real_getaddrinfo = socket.getaddrinfo


def _loopback_only(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name and name.lower() != "localhost":
        try:
            allowed = ipaddress.ip_address(name.split("%")[0]).is_loopback
        except ValueError:
            allowed = False
        if not allowed:
            raise socket.gaierror(socket.EAI_NONAME, f"test guard: {name} is not loopback")
    return _real_getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _loopback_only
"""


def _is_loopback_name(host: object) -> bool:
    name = host.decode() if isinstance(host, bytes) else host
    if not name or not isinstance(name, str) or name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(scope="session", autouse=True)
def loopback_only() -> Iterator[None]:
    """In this process too, names other than loopback do not resolve."""
    real = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_loopback_name(host):
            raise socket.gaierror(socket.EAI_NONAME, f"test guard: {host} is not loopback")
        return real(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket, "getaddrinfo", guarded)
        yield


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterator[None]:
    """A CLI `main()` run in-process (tests/unit/test_sink_cli.py, say) sets up the
    service's logging: a handler on the sys.stderr of that moment, which is pytest's
    capture of that one test. Each test leaves the root logger as it found it, so no
    later test logs into a closed stream."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture
def like_a_child_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """For a module whose tests call a CLI's `main()` in this process
    (`pytestmark = pytest.mark.usefixtures("like_a_child_process")`): the environment
    and working directory a child process of these tests would get, and what `main()`
    changes for the whole process put back afterwards (cli_support)."""
    as_a_child_process(monkeypatch, tmp_path)
    with process_state_kept():
        yield


# ---------------------------------------------------------------- independent reads


Query = Callable[..., list[tuple[Any, ...]]]


@pytest.fixture
def db_rows() -> Query:
    """support.query: rows read through a fresh connection of the test's own."""
    return query


# ---------------------------------------------------------------- subprocesses


@pytest.fixture(scope="session")
def child_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for child processes: no OUTBOX_* or proxy settings, loopback guard on."""
    guard_dir = tmp_path_factory.mktemp("guard")
    (guard_dir / "sitecustomize.py").write_text(NETWORK_GUARD)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OUTBOX_") and k not in PROXY_VARIABLES
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(guard_dir), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


RunCli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_cli(child_env: dict[str, str], tmp_path: Path) -> RunCli:
    """Run `python -m <module> args...` to completion, bounded by a timeout."""

    def run(
        module: str, *args: str, timeout: float = CLI_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        return run_module(module, *args, env=child_env, cwd=tmp_path, timeout=timeout)

    return run


@dataclass
class SinkProcess:
    """A sink running as its own OS process."""

    proc: subprocess.Popen[bytes]
    db: Path | str
    url: str
    log: Path

    @property
    def base(self) -> str:
        return self.url.removesuffix("/events")

    @property
    def port(self) -> int:
        return int(self.base.rpartition(":")[2])

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it does not stop in time. Returns the exit status."""
        return stop_process(self.proc)

    def kill(self) -> int:
        """SIGKILL: no shutdown code runs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._close_pipe()
        return self.proc.returncode

    def _close_pipe(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()


_LISTENING = re.compile(r"sink listening on (http://127\.0\.0\.1:(\d+)/events)")


StartSink = Callable[..., SinkProcess]


@pytest.fixture
def sink_process(child_env: dict[str, str], tmp_path: Path) -> Iterator[StartSink]:
    """Start real sink processes on port 0 (`db`: a SQLite path or a PostgreSQL URI);
    all are stopped at teardown."""
    started: list[SinkProcess] = []

    def start(db: Path | str, *extra: str) -> SinkProcess:
        log = tmp_path / f"sink-{len(started)}.log"
        command = ["-m", "sink", "--db", str(db), "--host", LOOPBACK, "--port", "0", *extra]
        proc = spawn(command, log, child_env, tmp_path)
        sink = SinkProcess(proc, db, "", log)
        started.append(sink)
        sink.url = listening(proc, log, _LISTENING, "sink")[1]
        return sink

    yield start
    for sink in reversed(started):
        sink.stop()


_PUBLISHER_LISTENING = re.compile(r"publisher listening on (http://127\.0\.0\.1:(\d+)/orders)")


@dataclass
class PublisherProcess:
    """`publisher serve` running as its own OS process."""

    proc: subprocess.Popen[bytes]
    log: Path
    port: int = 0

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> int:
        self.signal(signal.SIGKILL)
        return self.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not end in time; close the pipe."""
        stop_process(self.proc)

    def log_lines(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if line.strip()]


StartPublisher = Callable[..., PublisherProcess]


@pytest.fixture
def publisher_process(child_env: dict[str, str], tmp_path: Path) -> Iterator[StartPublisher]:
    """Start `publisher serve` processes (give `--port 0`); all are stopped at teardown."""
    started: list[PublisherProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> PublisherProcess:
        log = tmp_path / f"publisher-{len(started)}.log"
        command = ["-m", "publisher", "serve", *args]
        proc = spawn(command, log, {**child_env, **(env or {})}, tmp_path)
        publisher = PublisherProcess(proc, log)
        started.append(publisher)
        publisher.port = int(listening(proc, log, _PUBLISHER_LISTENING, "publisher")[2])
        return publisher

    yield start
    for publisher in reversed(started):
        publisher.stop()


# ---------------------------------------------------------------- both backends


@dataclass(frozen=True)
class Databases:
    """A source and a sink database, as `--db` takes them, on one backend."""

    backend: str
    source: Path | str
    sink: Path | str


@pytest.fixture(params=["sqlite", "postgres"])
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Databases]:
    """Two fresh, separate databases for one test, on each backend in turn: two SQLite
    files in tmp_path, or two schemas (pg_schemas) in the process's database on the
    session's PostgreSQL server."""
    if request.param == "sqlite":
        yield Databases("sqlite", tmp_path / "source.db", tmp_path / "sink.db")
        return
    source: str = request.getfixturevalue("pg_database")
    schemas: PgSchemas = request.getfixturevalue("pg_schemas")
    yield Databases("postgres", source, schemas.new())


# ---------------------------------------------------------------- loopback servers

Serve = Callable[..., Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serve aiohttp applications on 127.0.0.1 with a free port; returns the base URL."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application, *, handler_cancellation: bool = False) -> str:
        runner = web.AppRunner(app, shutdown_timeout=1.0, handler_cancellation=handler_cancellation)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, LOOPBACK, 0).start()
        host, port = runner.addresses[0][:2]
        assert host == LOOPBACK
        return f"http://{host}:{port}"

    yield start
    for runner in reversed(runners):
        await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client for the loopback servers, each request bounded in time. No cookie
    jar: a test says which cookie a request carries."""
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    jar = aiohttp.DummyCookieJar()
    async with aiohttp.ClientSession(cookie_jar=jar, timeout=timeout) as session:
        yield session


ServeSink = Callable[..., Awaitable[str]]


@pytest.fixture
def serve_sink(serve: Serve) -> ServeSink:
    """The real sink application (create_app) on loopback; returns the base URL. Chaos
    settings (drop_after_commit=1, reject_skus=..., the fields of sink.chaos.Chaos)
    install those faults, as `--chaos` does."""

    async def start(
        db: Path, *, token: str | None = None, max_body_bytes: int = MAX_BODY_BYTES, **chaos: Any
    ) -> str:
        if chaos:
            app = chaos_app(db, Chaos(**chaos), token=token, max_body_bytes=max_body_bytes)
        else:
            app = create_app(db, token=token, max_body_bytes=max_body_bytes)
        return await serve(app)

    return start


RawMode = Literal["close-on-accept", "close-after-request", "silent"]


@dataclass
class RawServer:
    """A bare TCP server that counts connections and never answers."""

    port: int
    connections: int = 0
    requests: int = 0


StartRaw = Callable[[RawMode], Awaitable[RawServer]]


@pytest.fixture
async def raw_server() -> AsyncIterator[StartRaw]:
    servers: list[asyncio.Server] = []
    handlers: set[asyncio.Task[None]] = set()
    release = asyncio.Event()

    async def start(mode: RawMode) -> RawServer:
        info = RawServer(port=0)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            info.connections += 1
            try:
                if mode != "close-on-accept":
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                    length = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
                    if length is not None:
                        await asyncio.wait_for(reader.readexactly(int(length[1])), 5)
                    info.requests += 1
                    if mode == "silent":
                        await asyncio.wait_for(release.wait(), 10)
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

        server = await asyncio.start_server(handle, LOOPBACK, 0)
        servers.append(server)
        info.port = server.sockets[0].getsockname()[1]
        return info

    yield start
    release.set()
    if handlers:
        await asyncio.wait(handlers, timeout=5)
    for server in servers:
        server.close()
        await server.wait_closed()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that is bound but not listening: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


# ---------------------------------------------------------------- source DB set-up

AcceptOrders = Callable[..., None]


@pytest.fixture
def accept_orders() -> AcceptOrders:
    """Accept orders into a source DB in this process (for sync tests)."""

    def accept(db: Path, *events: dict[str, Any]) -> None:
        async def run() -> None:
            async with Outbox.open(db) as outbox:
                for event in events:
                    assert await outbox.accept(dict(event)) == "accepted"

        asyncio.run(run())

    return accept


# ---------------------------------------------------------------- PostgreSQL

REQUIRE_POSTGRES = "OUTBOX_REQUIRE_POSTGRES"  # set by CI: no server is a failure, not a skip


def postgres_unavailable(reason: str) -> None:
    """Skip where this machine has no PostgreSQL server programs; fail under CI."""
    if os.environ.get(REQUIRE_POSTGRES):
        pytest.fail(f"PostgreSQL is required here: {reason}")
    pytest.skip(f"no PostgreSQL server here: {reason}")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[ThrowawayServer]:
    """One throwaway PostgreSQL server for the whole run (fsync on, loopback only)."""
    try:
        server = ThrowawayServer()
        server.start()
    except ServerUnavailable as exc:
        postgres_unavailable(str(exc))
    try:
        yield server
    finally:
        server.remove()


# A test that asks for PostgreSQL gets schemas of its own (`pg_schemas`, `pg_database`)
# in the one database of its process (`pg_test_database`): CREATE SCHEMA and DROP
# SCHEMA take a few milliseconds where CREATE and DROP DATABASE took half a second.
# Before each test and after it the database is put back as a fresh one would be: no
# session of a previous test (so none of its LISTENs or advisory locks), no
# database-wide setting (ALTER DATABASE ... SET, ALLOW_CONNECTIONS), no schema but an
# empty public. Advisory locks and NOTIFY are database-wide, so this is what keeps one
# test's sessions from reaching another's: tests of one process run one at a time, and
# each worker process has its own server. Within a test, two schemas (`databases`)
# do not meet either: the outbox's intake and relay lock keys carry the OID of its
# table, the sink neither listens nor takes an advisory lock of its own, and the one lock
# that is the database's (migrations) only makes two sides starting together take turns.
# A test that needs a database or a server to itself (a server it stops or crashes)
# makes its own, and says why.
TEST_DATABASE = "tests"
CLEANUP_DEADLINE_S = 15.0  # for the tests' sessions to end and their schemas to go
CLEANUP_LOCK_TIMEOUT_MS = 1_000  # a DROP waits no longer, then sessions are ended again
CLEANUP_STATEMENT_TIMEOUT_MS = 10_000
CLEANUP_POLL_S = 0.02

_SCHEMA_NUMBERS = itertools.count(1)
_OTHER_SESSIONS = """
    SELECT pid, application_name FROM pg_stat_activity
    WHERE datname = current_database() AND backend_type = 'client backend'
        AND pid <> pg_backend_pid()
"""
_STATE = """
    SELECT
        ARRAY(SELECT nspname::text FROM pg_namespace
              WHERE nspname <> 'public' AND nspname <> 'information_schema'
                  AND nspname NOT LIKE 'pg\\_%'),
        to_regnamespace('public') IS NULL
            OR EXISTS (SELECT FROM pg_class WHERE relnamespace = to_regnamespace('public'))
            OR EXISTS (SELECT FROM pg_proc WHERE pronamespace = to_regnamespace('public'))
            OR EXISTS (SELECT FROM pg_type WHERE typnamespace = to_regnamespace('public')),
        EXISTS (SELECT FROM pg_db_role_setting WHERE setdatabase = d.oid AND setrole = 0),
        NOT d.datallowconn OR d.datconnlimit <> -1,
        EXISTS (SELECT FROM pg_stat_activity
                WHERE datname = d.datname AND backend_type = 'client backend'
                    AND pid <> pg_backend_pid())
    FROM pg_database AS d WHERE d.datname = current_database()
"""


def in_schema(url: str, schema: str) -> str:
    """`url` with `schema` as its search_path (libpq's `options`, URL-encoded as
    chaos/dbs.py writes it): both backends make and read their tables there."""
    joiner = "&" if urlsplit(url).query else "?"
    return f"{url}{joiner}options={quote(f'-csearch_path={schema}', safe='')}"


class PgTestDatabase:
    """The one database of this test process on the session's server, and the way
    back to the state of a fresh one (`clean`), bounded in time: RuntimeError past
    CLEANUP_DEADLINE_S, never a hang."""

    def __init__(self, server: ThrowawayServer, name: str) -> None:
        self.server = server
        self.name = name
        self.url = server.create_database(name)

    def new_schema(self) -> str:
        """A fresh, empty schema: its URI."""
        with self._session() as conn:
            return self._create_schema(conn)

    def clean(self) -> None:
        """End every other session on the database, undo its database-wide settings,
        and drop every schema but public (emptied too, if anything is in it)."""
        with self._session() as conn:
            self._clean(conn, time.monotonic() + CLEANUP_DEADLINE_S)

    def clean_and_new_schema(self) -> str:
        """`clean`, then `new_schema`, on one connection."""
        with self._session() as conn:
            self._clean(conn, time.monotonic() + CLEANUP_DEADLINE_S)
            return self._create_schema(conn)

    def _create_schema(self, conn: psycopg.Connection[Any]) -> str:
        name = f"t{next(_SCHEMA_NUMBERS)}"
        conn.execute(f'CREATE SCHEMA "{name}"'.encode())
        return in_schema(self.url, name)

    def _clean(self, conn: psycopg.Connection[Any], deadline: float) -> None:
        [(schemas, public_used, settings, limits, sessions)] = conn.execute(
            _STATE.encode()
        ).fetchall()
        if settings:
            conn.execute(f'ALTER DATABASE "{self.name}" RESET ALL'.encode())
        if limits:
            conn.execute(
                f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true CONNECTION LIMIT -1'.encode()
            )
        if not (schemas or public_used or sessions):
            return
        while True:
            self._end_sessions(conn, deadline)
            try:
                self._drop(conn, schemas, public_used)
            except psycopg.errors.LockNotAvailable:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL test database {self.name}: schemas {schemas} still"
                        f" locked after {CLEANUP_DEADLINE_S} s"
                    ) from None
                continue  # a session came back meanwhile and took a lock: end it again
            break
        self._end_sessions(conn, deadline)  # any that came while the schemas went

    def _drop(self, conn: psycopg.Connection[Any], schemas: list[str], public: bool) -> None:
        statements = []
        if schemas:
            names = ", ".join(f'"{schema}"' for schema in schemas)
            statements.append(f"DROP SCHEMA {names} CASCADE")
        if public:  # as initdb makes it (PostgreSQL 15 and later)
            statements += [
                "DROP SCHEMA IF EXISTS public CASCADE",
                "CREATE SCHEMA public AUTHORIZATION pg_database_owner",
                "GRANT USAGE ON SCHEMA public TO PUBLIC",
            ]
        with conn.transaction():
            for statement in statements:
                conn.execute(statement.encode())

    @staticmethod
    def _end_sessions(conn: psycopg.Connection[Any], deadline: float) -> None:
        """End every other client session on the database and wait until each is gone."""
        while True:
            left = conn.execute(_OTHER_SESSIONS.encode()).fetchall()
            if not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"PostgreSQL test database: sessions {left} still there after"
                    f" {CLEANUP_DEADLINE_S} s"
                )
            conn.execute(
                b"SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid",
                ([pid for pid, _ in left],),
            )
            time.sleep(CLEANUP_POLL_S)

    @contextlib.contextmanager
    def _session(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of our own to the database, in autocommit, writable and bounded
        whatever the database's settings; a database left refusing connections
        (ALLOW_CONNECTIONS false, a connection limit) is opened again first."""
        # Its own commits need not wait for a flush: the schemas are throwaway, and
        # the tests' commits, which do, flush these too.
        options = (
            "-c default_transaction_read_only=off -c synchronous_commit=off"
            f" -c lock_timeout={CLEANUP_LOCK_TIMEOUT_MS}"
            f" -c statement_timeout={CLEANUP_STATEMENT_TIMEOUT_MS}"
        )
        try:
            conn = self._connect(self.url, options)
        except psycopg.OperationalError:
            with self._connect(self.server.url(), options) as maintenance:
                maintenance.execute(
                    f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true'
                    " CONNECTION LIMIT -1".encode()
                )
            conn = self._connect(self.url, options)
        with conn:
            yield conn

    @staticmethod
    def _connect(url: str, options: str) -> psycopg.Connection[Any]:
        return psycopg.connect(url, autocommit=True, connect_timeout=5, options=options)


@pytest.fixture(scope="session")
def pg_test_database(pg_server: ThrowawayServer) -> PgTestDatabase:
    """This process's database on the session's server, made once (gone with the server)."""
    return PgTestDatabase(pg_server, TEST_DATABASE)


@dataclass
class PgSchemas:
    """This test's schemas in its process's database: `first` made with the fixture,
    `new()` for more."""

    database: PgTestDatabase
    first: str

    @property
    def database_url(self) -> str:
        """The database's URI without a search_path (as an operator gives one to a tool
        that makes schemas of its own: chaos --db-url)."""
        return self.database.url

    def new(self) -> str:
        """A fresh, empty schema of this test: its URI (search_path set to it)."""
        return self.database.new_schema()


@pytest.fixture
def pg_schemas(pg_test_database: PgTestDatabase) -> Iterator[PgSchemas]:
    """Schemas for one test in a database found as a fresh one would be; after the
    test, whatever connections are still open to it are ended and they are dropped."""
    # Cleaned first too: a previous test's leftovers, should its teardown have failed.
    first = pg_test_database.clean_and_new_schema()
    try:
        yield PgSchemas(pg_test_database, first)
    finally:
        try:
            pg_test_database.clean()
        except psycopg.OperationalError:
            if pg_test_database.server.running():  # else nothing is left to clean
                raise


@pytest.fixture
def pg_database(pg_schemas: PgSchemas) -> str:
    """A fresh, empty schema on the session's server, alone in its database: its libpq
    URI (search_path set to it). Dropped after the test, whatever connections are
    still open to it."""
    return pg_schemas.first
