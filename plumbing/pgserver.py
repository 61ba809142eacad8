"""A throwaway PostgreSQL server: initdb in a temporary directory, a free loopback
port, fsync on, removed when stopped.

The test suite, `python -m chaos --backend postgres` without a URL, `python -m bench
--backend postgres` and `make demo-postgres` start one. It listens on 127.0.0.1 only
(no Unix socket), trusts connections from loopback (nothing else can reach it) and
runs as an unprivileged user: PostgreSQL refuses to run as root, so as root it runs
as the `postgres` user that Debian's package creates.

`listen=(address, network)` adds one address to listen on and trusts connections from
`network` too: the partition test's database host in a network namespace of its own
(nothing outside that namespace's test network reaches the address).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

SUPERUSER: Final = "outbox"  # the role initdb creates; trusted on loopback only
START_TIMEOUT_S: Final = 60
RUN_AS_WHEN_ROOT: Final = "postgres"


class ServerUnavailable(RuntimeError):
    """No PostgreSQL server binaries here, or the server would not start."""


def find_bindir() -> Path:
    """Where `initdb` and `pg_ctl` are: on PATH, or the newest Debian install
    (/usr/lib/postgresql/VERSION/bin). ServerUnavailable if neither."""
    on_path = shutil.which("initdb")
    if on_path is not None and shutil.which("pg_ctl") is not None:
        return Path(os.path.realpath(on_path)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_of)
    if not found:
        raise ServerUnavailable(
            "PostgreSQL's server programs (initdb, pg_ctl) are not installed:"
            " install Debian's postgresql package (make test does)"
        )
    return Path(found[-1]).parent


def _version_of(initdb: str) -> int:
    name = Path(initdb).parent.parent.name  # /usr/lib/postgresql/15/bin/initdb -> 15
    return int(name) if name.isdigit() else 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ThrowawayServer:
    """One PostgreSQL server of our own. `start()`, then `url(dbname)`; `stop()` ends it,
    `start()` again brings it back on the same data and port (a restart), and
    `remove()` deletes everything."""

    def __init__(
        self, settings: Mapping[str, str] | None = None, listen: tuple[str, str] | None = None
    ) -> None:
        self.bindir = find_bindir()
        self.listen = listen
        self.host = "127.0.0.1" if listen is None else listen[0]
        self.settings = {"fsync": "on", "synchronous_commit": "on", **(settings or {})}
        self._user = _run_as()
        self.root = Path(tempfile.mkdtemp(prefix="outbox-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        self._initdb()

    # ------------------------------------------------------------------ lifecycle

    def _initdb(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",  # the cluster is new and throwaway; its running server fsyncs
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# set by the throwaway server\n")
            addresses = "127.0.0.1" if self.listen is None else f"127.0.0.1,{self.listen[0]}"
            conf.write(f"listen_addresses = '{addresses}'\n")
            conf.write("unix_socket_directories = ''\n")
            conf.write("max_connections = 300\n")
            for name, value in self.settings.items():
                conf.write(f"{name} = '{value}'\n")
        if self.listen is not None:
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.listen[1]} trust\n")

    def start(self) -> None:
        """Start the server and wait until it takes connections (ServerUnavailable if
        it does not, with the end of its log)."""
        for _ in range(3):
            try:
                self._run(
                    "pg_ctl",
                    "start",
                    "-w",
                    "-t",
                    str(START_TIMEOUT_S),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    f"-p {self.port}",
                )
                return
            except ServerUnavailable:
                if "could not bind" not in self.log_tail() and "in use" not in self.log_tail():
                    raise
                self.port = free_port()  # the port was taken meanwhile: another one
        raise ServerUnavailable(f"PostgreSQL would not start: {self.log_tail()}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: "fast" (clean), or "immediate" (no checkpoint, as a crash)."""
        if self.running():
            self._run("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data))

    def pid(self) -> int | None:
        """The postmaster's process ID while the server runs (None when it cannot be read)."""
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        result = self._run("pg_ctl", "status", "-D", str(self.data), check=False)
        return result.returncode == 0

    def remove(self) -> None:
        with contextlib.suppress(ServerUnavailable):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ reaching it

    def url(self, dbname: str = "postgres", **params: str) -> str:
        """A libpq URI for `dbname` as the trusted superuser."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{dbname}" + (
            f"?{query}" if query else ""
        )

    def create_database(self, name: str) -> str:
        """Create an empty database and return its URI."""
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def sql(self, statement: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        """Run one statement in autocommit on a connection of its own; its rows."""
        import psycopg  # only where a server is started

        with psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=10) as conn:
            cursor = conn.execute(statement.encode())
            return cursor.fetchall() if cursor.description is not None else []

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def _run(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        path = self.bindir / program
        command = [str(path if path.exists() else program), *args]
        uid = gid = None
        if self._user is not None:
            uid, gid = self._user.pw_uid, self._user.pw_gid
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=self.root,
            env={**_clean_env(), "HOME": str(self.root)},
            timeout=START_TIMEOUT_S + 30,
            check=False,
            user=uid,
            group=gid,
            extra_groups=None if uid is None else [],
        )
        if check and result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            raise ServerUnavailable(
                f"{program} failed: {message[-1] if message else result.returncode}"
            )
        return result


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as: None when not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(RUN_AS_WHEN_ROOT)
    except KeyError:
        raise ServerUnavailable(
            f"PostgreSQL does not run as root, and there is no {RUN_AS_WHEN_ROOT!r} user"
            " to run it as: install Debian's postgresql package, which creates it"
        ) from None


def _clean_env() -> dict[str, str]:
    """This environment without libpq's variables, so that none of them points the
    server's tools elsewhere."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


@contextlib.contextmanager
def throwaway_server(settings: Mapping[str, str] | None = None) -> Iterator[ThrowawayServer]:
    """A started ThrowawayServer, removed on the way out."""
    server = ThrowawayServer(settings)
    try:
        server.start()
        yield server
    finally:
        server.remove()
