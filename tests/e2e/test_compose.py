"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

No engine runs where these tests run, so nothing here builds an image. What can be
checked is checked for real: the compose file's structure; every service command
started as a real process with the same flags, rewriting only what cannot work
outside a container (mount paths, the listen address, ports, the sink's service
name); the health check commands run against those processes; and the Dockerfile's
install steps compared with pyproject.toml.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from support import LOOPBACK, POLL_S, WAIT_S, http_request, listening, spawn, stop_process

from plumbing.cli import ENV_PREFIX, env_name

if TYPE_CHECKING:
    from conftest import Query

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"

ANY_ADDRESS = "0.0.0.0"
SERVICES = ("sink", "publisher")
PG_SERVICES = ("sink-postgres", "publisher-postgres")
PG_SERVER = "postgres"  # the compose service; in the tests, the session's pg_server
PG_DATABASES = {"sink-postgres": "sink", "publisher-postgres": "source"}
TOKEN_SECRET = "outbox_token"
PGPASS_SECRET = "pgpass"
SECRETS_DIR = PurePosixPath("/run/secrets")
HEALTHCHECK_TIMEOUT_S = 10.0
LISTENING = re.compile(r"(\w+) listening on http://127\.0\.0\.1:(\d+)/\S*")


# ---------------------------------------------------------------- reading the compose file


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), "docker-compose.yml is not a mapping"
    return data


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def split_flags(argv: list[str]) -> list[str]:
    """`--flag=value` as two tokens, so each value can be looked at on its own."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--") and "=" in arg:
            out.extend(arg.split("=", 1))
        else:
            out.append(arg)
    return out


def command_of(service: dict[str, Any]) -> list[str]:
    raw = service.get("command") or []  # none: the image's own (PostgreSQL's)
    argv = shlex.split(raw) if isinstance(raw, str) else [str(arg) for arg in raw]
    return split_flags(argv)


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {str(k): "" if v is None else str(v) for k, v in raw.items()}


def option(service: dict[str, Any], flag: str) -> list[str]:
    """Values of `flag` in the command, else from its OUTBOX_* variable (as the CLI reads it)."""
    argv = command_of(service)
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]
    if values:
        return values
    value = environment_of(service).get(env_name(flag))
    return [] if value is None else [value]


def one_option(service: dict[str, Any], flag: str) -> str:
    values = option(service, flag)
    assert len(values) == 1, f"expected one {flag}, got {values}"
    return values[0]


def container_port(service: dict[str, Any]) -> int:
    return int(one_option(service, "--port"))


def published_ports(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) for each published port."""
    out: list[tuple[str, str, str]] = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            out.append(
                (str(entry.get("host_ip", "")), str(entry["published"]), str(entry["target"]))
            )
            continue
        parts = str(entry).split(":")
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
        else:
            out.append(("", parts[0], parts[-1]))
    return [(host, published, target.split("/")[0]) for host, published, target in out]


def volume_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) for each volume mount."""
    out: list[tuple[str, str]] = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            out.append((str(entry["source"]), str(entry["target"])))
        else:
            source, target = str(entry).split(":")[:2]
            out.append((source, target))
    return out


def secret_mounts(service: dict[str, Any]) -> list[tuple[str, PurePosixPath]]:
    """(secret name, path in the container) for each secret the service gets."""
    out: list[tuple[str, PurePosixPath]] = []
    for entry in service.get("secrets") or []:
        if isinstance(entry, dict):
            name = str(entry["source"])
            target = str(entry.get("target", name))
        else:
            name = target = str(entry)
        out.append((name, SECRETS_DIR / target))
    return out


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {str(name): {"condition": "service_started"} for name in raw}
    return {str(name): dict(spec or {}) for name, spec in raw.items()}


def healthcheck_command(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    assert isinstance(test, list) and test[:1] == ["CMD"], f"expected exec form: {test!r}"
    return [str(arg) for arg in test[1:]]


def healthz_url(port: int) -> str:
    return f"http://{LOOPBACK}:{port}/healthz"


# ---------------------------------------------------------------- 1. the file's structure


def test_compose_file_has_the_services_volumes_checks_and_secret(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) >= {"sink", "publisher", "chaos"}
    assert services["chaos"].get("profiles") == ["chaos"]
    for name in SERVICES:
        service = services[name]
        assert not service.get("profiles"), f"{name} must start with a plain `docker compose up`"

        build = service["build"]
        context, dockerfile = (
            (build, "Dockerfile")
            if isinstance(build, str)
            else (build.get("context", "."), build.get("dockerfile", "Dockerfile"))
        )
        assert (ROOT / context / dockerfile).resolve() == DOCKERFILE

        assert service.get("restart") == "unless-stopped", name

        # The DB file lives on a named volume mounted where --db points.
        mounts = volume_mounts(service)
        assert mounts == [(f"{name}-data", "/data")], mounts
        assert f"{name}-data" in (compose.get("volumes") or {}), "volume must be a named one"
        assert PurePosixPath(one_option(service, "--db")).parent == PurePosixPath("/data")

        port = container_port(service)
        assert one_option(service, "--host") == ANY_ADDRESS
        check = service["healthcheck"]
        command = healthcheck_command(service)
        assert command[:2] == ["python", "-c"], command
        assert healthz_url(port) in command[2], f"{name} health check must hit its own /healthz"
        assert {"interval", "timeout", "retries"} <= set(check)

        # Published on the host's loopback only, for the port the service listens on.
        published = published_ports(service)
        assert published, f"{name} publishes no port"
        for host, _, target in published:
            assert host == LOOPBACK, f"{name} publishes on {host or 'every address'}"
            assert int(target) == port

        # The bearer token comes from the compose secret, never from the command line.
        assert secret_mounts(service) == [(TOKEN_SECRET, SECRETS_DIR / TOKEN_SECRET)]
        assert one_option(service, "--token-file") == str(SECRETS_DIR / TOKEN_SECRET)
        assert env_name("--token") not in environment_of(service)

    for host, _, _ in published_ports(services["chaos"]):
        assert host == LOOPBACK

    publisher, sink = services["publisher"], services["sink"]
    assert one_option(publisher, "--sink") == f"http://sink:{container_port(sink)}/events"
    assert one_option(publisher, "--sink") == "http://sink:8080/events"
    assert option(publisher, "--allow-host") == ["sink"]
    assert depends_on(publisher) == {"sink": {"condition": "service_healthy"}}

    assert compose["secrets"][TOKEN_SECRET] == {"file": "./secrets/outbox_token"}
    assert set(compose["volumes"]) == {"sink-data", "publisher-data", "postgres-data"}


def test_the_postgres_services_keep_the_password_out_of_the_file(compose: dict[str, Any]) -> None:
    services = compose["services"]
    server = services[PG_SERVER]
    # Not part of a plain `docker compose up`: only with --profile postgres (or chaos-postgres).
    assert set(server["profiles"]) == {"postgres", "chaos-postgres"}
    assert str(server["image"]).startswith("postgres:")
    env = environment_of(server)
    assert "POSTGRES_PASSWORD" not in env
    assert env["POSTGRES_PASSWORD_FILE"] == str(SECRETS_DIR / "pg_password")
    assert secret_mounts(server) == [("pg_password", SECRETS_DIR / "pg_password")]
    assert volume_mounts(server) == [("postgres-data", "/var/lib/postgresql/data")]
    assert not server.get("ports"), "the server is reached over the compose network only"
    assert healthcheck_command(server)[0] == "pg_isready"
    # The init creates the sink's database; POSTGRES_DB is the publisher's.
    assert "CREATE DATABASE sink;" in " ".join(server["entrypoint"])
    assert env["POSTGRES_DB"] == "source"
    assert compose["secrets"]["pg_password"] == {"file": "./secrets/pg_password"}
    assert compose["secrets"][PGPASS_SECRET] == {"file": "./secrets/pgpass"}

    for name in (*PG_SERVICES, "chaos-postgres"):
        service = services[name]
        assert set(service["profiles"]) <= set(server["profiles"]), name
        assert depends_on(service)[PG_SERVER] == {"condition": "service_healthy"}, name
        assert environment_of(service)["PGPASSFILE"] == str(SECRETS_DIR / PGPASS_SECRET)
        assert (PGPASS_SECRET, SECRETS_DIR / PGPASS_SECRET) in secret_mounts(service), name
        urls = [a for a in command_of(service) if a.startswith("postgresql://")]
        assert len(urls) == 1, (name, urls)
        parts = urlsplit(urls[0])
        assert (parts.hostname, parts.port, parts.username) == (PG_SERVER, 5432, "outbox")
        assert parts.password is None and "password" not in parts.query, name
        for host, _, _ in published_ports(service):
            assert host == LOOPBACK, name
    for name in PG_SERVICES:
        service = services[name]
        database = urlsplit(one_option(service, "--db")).path.lstrip("/")
        assert database == PG_DATABASES[name]
        assert service.get("restart") == "unless-stopped"
        assert not volume_mounts(service), f"{name} keeps its data in PostgreSQL"
    publisher = services["publisher-postgres"]
    assert one_option(publisher, "--sink") == "http://sink-postgres:8080/events"
    assert option(publisher, "--allow-host") == ["sink-postgres"]
    assert depends_on(publisher)["sink-postgres"] == {"condition": "service_healthy"}
    # Next to the SQLite pair: other host ports.
    sqlite_ports = {p for n in SERVICES for _, p, _ in published_ports(services[n])}
    assert not sqlite_ports & {p for n in PG_SERVICES for _, p, _ in published_ports(services[n])}
    chaos = command_of(services["chaos-postgres"])
    assert chaos[:3] == ["python", "-m", "chaos"], chaos
    from chaos.cli import build_parser

    parsed = build_parser().parse_args(chaos[3:])
    assert (parsed.backend, urlsplit(parsed.db_url).hostname) == ("postgres", PG_SERVER)


# ---------------------------------------------------------------- 2. and 3. the commands, run


@dataclass
class Running:
    """One compose service started locally as its own OS process."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    container_port: int
    port: int = 0

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it does not end in time. Returns the exit status."""
        return stop_process(self.proc)


@dataclass
class Stack:
    compose: dict[str, Any]
    token: str
    env: dict[str, str]
    mounts: dict[str, dict[PurePosixPath, Path]] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)
    databases: dict[str, str] = field(default_factory=dict)  # compose database -> local URI


def localize(value: str, flag: str, mounts: dict[PurePosixPath, Path], stack: Stack) -> str:
    """The value as it must be outside a container; anything else stays as it is."""
    if flag == "--host" and value == ANY_ADDRESS:
        return LOOPBACK
    if flag == "--port":
        return "0"
    parts = urlsplit(value)
    if parts.scheme == "postgresql" and parts.hostname == PG_SERVER:
        local = stack.databases.get(parts.path.lstrip("/"))
        assert local is not None, f"{value}: no such database on the {PG_SERVER} service"
        return local
    if parts.scheme in ("http", "https") and parts.hostname in stack.compose["services"]:
        target = stack.running.get(parts.hostname)
        assert target is not None, f"{value}: {parts.hostname} must start first (depends_on)"
        assert parts.port == target.container_port, f"{value}: not the port it listens on"
        return urlunsplit(parts._replace(netloc=f"{LOOPBACK}:{target.port}"))
    if value.startswith("/"):
        path = PurePosixPath(value)
        for target_path, local in mounts.items():
            if path == target_path or target_path in path.parents:
                return str(local / path.relative_to(target_path))
        assert not value.startswith(("/data", str(SECRETS_DIR))), f"{value} is on no mount"
    return value


def local_mounts(
    name: str, service: dict[str, Any], tmp: Path, token_file: Path
) -> dict[PurePosixPath, Path]:
    mounts: dict[PurePosixPath, Path] = {}
    for source, target in volume_mounts(service):
        local = tmp / "volumes" / source
        local.mkdir(parents=True, exist_ok=True)
        mounts[PurePosixPath(target)] = local
    for secret, target in secret_mounts(service):
        assert secret in (TOKEN_SECRET, PGPASS_SECRET), f"{name}: unknown secret {secret}"
        if secret == PGPASS_SECRET:  # the throwaway server trusts loopback: any password
            pgpass = tmp / "secrets" / PGPASS_SECRET
            pgpass.write_text(f"127.0.0.1:*:*:outbox:{secrets.token_urlsafe(16)}\n")
            pgpass.chmod(0o600)
            mounts[target] = pgpass
        else:
            mounts[target] = token_file
    return mounts


def start_order(services: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    """Dependencies first, as compose starts them."""
    ordered: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"dependency cycle: {path}"
        for dependency in depends_on(services[name]):
            if dependency not in ordered:
                visit(dependency, (*path, name))
        if name not in ordered:
            ordered.append(name)

    for name in names:
        visit(name, ())
    return ordered


def start_service(stack: Stack, name: str, tmp: Path) -> Running:
    service = stack.compose["services"][name]
    mounts = stack.mounts[name]
    original = command_of(service)
    assert original[:2] == ["python", "-m"], f"{name}: {original}"
    argv = list(original)
    for i in range(1, len(argv)):
        if argv[i - 1].startswith("--"):
            argv[i] = localize(argv[i], argv[i - 1], mounts, stack)
    changed = {
        original[i - 1] for i, (a, b) in enumerate(zip(original, argv, strict=True)) if a != b
    }
    assert changed <= {"--host", "--port", "--sink", "--db", "--token-file"}, changed

    env = dict(stack.env)
    for key, value in environment_of(service).items():
        flag = "--" + key.removeprefix(ENV_PREFIX).lower().replace("_", "-")
        localized = key.startswith(ENV_PREFIX) or value.startswith(str(SECRETS_DIR))
        env[key] = localize(value, flag, mounts, stack) if localized else value

    log = tmp / f"{name}.log"
    proc = spawn(argv[1:], log, env, mounts.get(PurePosixPath("/data"), tmp))
    running = Running(name, proc, log, container_port(service))
    stack.running[name] = running
    match = listening(proc, log, LISTENING, name)
    assert match[1] == original[2], f"{name}: {match[0]!r}"
    running.port = int(match[2])
    return running


def started_stack(
    compose: dict[str, Any],
    env: dict[str, str],
    tmp_path: Path,
    names: tuple[str, ...],
    databases: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """The named services started from their compose commands, on loopback; a
    PostgreSQL server they depend on is provided (`databases`), not started."""
    token = secrets.token_urlsafe(24)
    assert len(token) == 32
    token_file = tmp_path / "secrets" / TOKEN_SECRET
    token_file.parent.mkdir()
    token_file.write_text(token + "\n")
    started = Stack(compose, token, env, databases=databases or {})
    services = compose["services"]
    for name in names:
        started.mounts[name] = local_mounts(name, services[name], tmp_path, token_file)
    try:
        for name in start_order(services, names):
            if name == PG_SERVER:
                assert databases, f"{names} need the {PG_SERVER} service"
                continue
            start_service(started, name, tmp_path)
        yield started
    finally:
        for service in reversed(list(started.running.values())):
            service.stop()


@pytest.fixture
def stack(compose: dict[str, Any], child_env: dict[str, str], tmp_path: Path) -> Iterator[Stack]:
    """sink and publisher started from their compose commands, on loopback."""
    yield from started_stack(compose, child_env, tmp_path, SERVICES)


@pytest.fixture
def pg_stack(
    compose: dict[str, Any], child_env: dict[str, str], tmp_path: Path, databases: Any
) -> Iterator[Stack]:
    """sink-postgres and publisher-postgres from their compose commands, on two
    databases of the session's PostgreSQL server in place of the postgres service."""
    if databases.backend != "postgres":
        pytest.skip("the compose services on PostgreSQL")
    local = {"sink": str(databases.sink), "source": str(databases.source)}
    yield from started_stack(compose, child_env, tmp_path, PG_SERVICES, local)


def run_healthcheck(
    service: dict[str, Any], running: Running, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The compose health check command, run here against the started process."""
    command = healthcheck_command(service)
    assert command[0] == "python"
    inside, local = healthz_url(running.container_port), healthz_url(running.port)
    argv = [arg.replace(inside, local) for arg in command[1:]]
    assert argv != command[1:], f"{running.name}: health check does not hit {inside}"
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=HEALTHCHECK_TIMEOUT_S,
        check=False,
    )


def wait_for_inventory(port: int, sku: str, token: str, qty: int) -> None:
    deadline = time.monotonic() + WAIT_S
    seen: tuple[int, Any] = (0, None)
    for _ in range(int(WAIT_S / POLL_S) + 10):
        seen = http_request(port, "GET", f"/inventory/{sku}", token=token)
        if seen == (200, {"sku": sku, "qty": qty}) or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    assert seen == (200, {"sku": sku, "qty": qty}), f"sink inventory after {WAIT_S}s: {seen}"


def test_service_commands_run_locally_with_the_same_flags(stack: Stack, db_rows: Query) -> None:
    services = stack.compose["services"]
    sink, publisher = stack.running["sink"], stack.running["publisher"]
    for name, running in stack.running.items():
        result = run_healthcheck(services[name], running, stack.env)
        assert result.returncode == 0, f"{name} health check: {result.stderr}"

    order = {"id": "compose-order-1", "sku": "compose-widget", "qty": 3}
    assert http_request(publisher.port, "POST", "/orders", order) == (
        201,
        {"id": order["id"], "result": "accepted"},
    )
    # The token from the secret file is in force on the sink, and the publisher has it.
    status, _ = http_request(sink.port, "GET", f"/inventory/{order['sku']}")
    assert status == 401
    wait_for_inventory(sink.port, str(order["sku"]), stack.token, 3)

    # Both databases are where the named volumes are mounted.
    sink_db = stack.mounts["sink"][PurePosixPath("/data")] / "sink.db"
    source_db = stack.mounts["publisher"][PurePosixPath("/data")] / "source.db"
    assert db_rows(sink_db, "SELECT id FROM inbox_events") == [(order["id"],)]
    assert db_rows(source_db, "SELECT id FROM outbox_orders") == [(order["id"],)]

    for running in (publisher, sink):  # dependents first, as compose stops them
        status = running.stop()
        assert status == 0, f"{running.name} exited {status}: {running.log.read_text()!r}"


@pytest.mark.parametrize("databases", ["postgres"], indirect=True)
def test_the_postgres_service_commands_run_locally_with_the_same_flags(
    pg_stack: Stack, db_rows: Query
) -> None:
    services = pg_stack.compose["services"]
    sink, publisher = pg_stack.running["sink-postgres"], pg_stack.running["publisher-postgres"]
    for name, running in pg_stack.running.items():
        result = run_healthcheck(services[name], running, pg_stack.env)
        assert result.returncode == 0, f"{name} health check: {result.stderr}"

    order = {"id": "compose-pg-1", "sku": "compose-widget", "qty": 4}
    assert http_request(publisher.port, "POST", "/orders", order) == (
        201,
        {"id": order["id"], "result": "accepted"},
    )
    wait_for_inventory(sink.port, str(order["sku"]), pg_stack.token, 4)
    assert db_rows(pg_stack.databases["sink"], "SELECT id FROM inbox_events") == [(order["id"],)]
    assert db_rows(pg_stack.databases["source"], "SELECT id, sent FROM outbox_entries") == [
        (order["id"], 1)
    ]
    for running in (publisher, sink):
        status = running.stop()
        assert status == 0, f"{running.name} exited {status}: {running.log.read_text()!r}"


def test_healthchecks_pass_on_a_live_service_and_fail_on_a_stopped_one(
    stack: Stack, closed_port: int
) -> None:
    services = stack.compose["services"]
    # A proxy in the container's environment must not decide the service's health.
    proxy = f"http://{LOOPBACK}:{closed_port}"
    env = {**stack.env, "http_proxy": proxy, "HTTP_PROXY": proxy}
    for name, running in stack.running.items():
        result = run_healthcheck(services[name], running, env)
        assert result.returncode == 0, f"{name} health check: {result.stderr}"
    for name, running in reversed(list(stack.running.items())):
        assert running.stop() == 0, running.log.read_text()
        result = run_healthcheck(services[name], running, env)
        assert result.returncode != 0, f"{name} health check passed on a stopped service"


def test_chaos_command_parses_with_the_chaos_cli(compose: dict[str, Any]) -> None:
    argv = command_of(compose["services"]["chaos"])
    assert argv[:3] == ["python", "-m", "chaos"], argv
    assert argv[3:5] == ["run", "--events"] and "--json" in argv, argv
    try:
        from chaos.cli import build_parser
    except ImportError as exc:
        where = (
            "there is no chaos/ package in the project yet"
            if not (ROOT / "chaos").is_dir()
            else "chaos/ exists but is not importable from the installed package (is it in "
            "[tool.setuptools] packages, and was the environment reinstalled?)"
        )
        pytest.fail(
            f"the compose chaos service runs `python -m chaos`, but `from chaos.cli import "
            f"build_parser` failed: {where} ({exc})"
        )
    try:
        build_parser().parse_args(argv[3:])
    except SystemExit as exc:
        pytest.fail(f"the chaos CLI rejects the compose command {argv[3:]} (exit {exc.code})")


# ---------------------------------------------------------------- 4. the image


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, rest = (pending + stripped).partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "Dockerfile ends inside a continuation line"
    return out


def instruction_args(rest: str) -> list[str]:
    args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    return [arg for arg in args if not arg.startswith("--")]


def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))


def compose_modules() -> set[str]:
    """Top-level packages the compose services run with `python -m`."""
    modules = set()
    for service in load_compose()["services"].values():
        if "build" not in service:
            continue  # an image of its own (PostgreSQL), not ours
        argv = command_of(service)
        assert argv[:2] == ["python", "-m"], argv
        modules.add(argv[2].split(".")[0])
    return modules


@dataclass
class Image:
    base: str
    copied: dict[str, tuple[int, PurePosixPath]]  # source -> (step, where it lands)
    pip_install: tuple[int, PurePosixPath]  # (step, project directory)
    users: list[tuple[int, str]]
    runs: list[str]
    expose: set[int]
    entrypoint: bool


def read_image() -> Image:
    instructions = dockerfile_instructions()
    froms = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert len(froms) == 1, f"expected one build stage, got FROM {froms}"
    workdir = PurePosixPath("/")
    copied: dict[str, tuple[int, PurePosixPath]] = {}
    installs: list[tuple[int, PurePosixPath]] = []
    users: list[tuple[int, str]] = []
    runs: list[str] = []
    expose: set[int] = set()
    for step, (keyword, rest) in enumerate(instructions):
        if keyword == "WORKDIR":
            workdir = workdir / rest
        elif keyword in ("COPY", "ADD"):
            *sources, dest = instruction_args(rest)
            target = workdir / dest
            into_directory = dest.endswith("/") or dest == "." or len(sources) > 1
            for source in sources:
                name = source.rstrip("/")
                is_dir = (ROOT / name).is_dir() or source.endswith("/")
                landed = target if is_dir or not into_directory else target / Path(name).name
                copied[name] = (step, PurePosixPath(os.path.normpath(landed)))
        elif keyword == "RUN":
            runs.append(rest)
            for command in re.split(r"&&|;", rest):
                words = shlex.split(command)
                if "pip" in words[:3] and "install" in words:
                    targets = [w for w in words[words.index("install") + 1 :] if w[0] != "-"]
                    for project in targets:
                        installs.append((step, PurePosixPath(os.path.normpath(workdir / project))))
        elif keyword == "USER":
            users.append((step, rest))
        elif keyword == "EXPOSE":
            expose |= {int(port.split("/")[0]) for port in rest.split()}
    assert len(installs) == 1, f"expected one `pip install <project dir>`, got {installs}"
    entrypoint = any(keyword == "ENTRYPOINT" for keyword, _ in instructions)
    return Image(froms[0], copied, installs[0], users, runs, expose, entrypoint)


def test_dockerfile_installs_the_project_as_pyproject_describes_it() -> None:
    project = pyproject()
    image = read_image()

    match = re.fullmatch(r"python:(\d+)\.(\d+)-slim", image.base)
    assert match is not None, f"base image {image.base} is not python:X.Y-slim"
    version = f"{match[1]}.{match[2]}"
    requires = project["project"]["requires-python"]
    assert SpecifierSet(requires).contains(version), f"Python {version} vs {requires}"

    # Everything pip needs lands in the directory it installs from, before it runs.
    install_step, project_dir = image.pip_install
    needed = {
        "pyproject.toml": project_dir / "pyproject.toml",
        project["project"]["readme"]: project_dir / project["project"]["readme"],
    }
    # A sub-package (publisher.backends) comes with its top-level directory.
    packages = {name.split(".")[0] for name in project["tool"]["setuptools"]["packages"]}
    for package in {*packages, *compose_modules()}:
        needed[package] = project_dir / package
    for source, where in needed.items():
        assert source in image.copied, f"the Dockerfile does not COPY {source}"
        step, landed = image.copied[source]
        assert landed == where, f"{source} lands at {landed}, pip installs from {project_dir}"
        assert step < install_step, f"{source} is copied after `pip install`"

    # Runs as the user that owns /data, never as root.
    assert image.users, "no USER instruction: the services would run as root"
    user_step, user = image.users[-1]
    assert user_step > install_step
    assert user.split(":")[0] not in ("root", "0"), f"USER {user}"
    owners = [
        m[1]
        for run in image.runs
        if "mkdir" in run
        for m in re.finditer(r"chown\s+(?:-\S+\s+)*(\S+)\s+(?:\S+\s+)*/data\b", run)
    ]
    assert owners and owners[-1].split(":")[0] == user.split(":")[0], (owners, user)

    # Compose's commands are the whole command line: no ENTRYPOINT in front of them.
    assert not image.entrypoint

    ports = set()
    for service in load_compose()["services"].values():
        if option(service, "--port"):
            ports.add(container_port(service))
        ports |= {int(target) for _, _, target in published_ports(service)}
    assert ports <= image.expose, f"EXPOSE {sorted(image.expose)} misses {ports - image.expose}"


def test_every_command_compose_runs_is_installed_by_pyproject() -> None:
    """The image runs the installed packages, so each `python -m X` must be one of them."""
    packages = set(pyproject()["tool"]["setuptools"]["packages"])
    missing = compose_modules() - packages
    assert not missing, (
        f"docker-compose.yml runs `python -m` {sorted(missing)}, which pip does not install: "
        f"add them to [tool.setuptools] packages in pyproject.toml (now {sorted(packages)})"
    )


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex; a matched directory excludes its contents."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and "]" in pattern[i:]:
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1].replace("[!", "[^"), end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "(?:/.*)?")


def dockerignored(path: str) -> bool:
    ignored = False
    for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = os.path.normpath(pattern.lstrip("!").strip("/"))
        if _ignore_regex(pattern).fullmatch(path):
            ignored = not negated
    return ignored


def test_dockerignore_keeps_environments_databases_and_secrets_out() -> None:
    for path in (
        ".venv",
        ".venv/bin/python",
        ".git",
        ".git/config",
        "sink.db",
        "source.db-wal",
        "demo-data/sink.db",
        "secrets/outbox_token",
        "secrets/pgpass",
        "secrets/pg_password",
        "shared/__pycache__/net.cpython-311.pyc",
    ):
        assert dockerignored(path), f".dockerignore lets {path} into the build context"
    for source in read_image().copied:
        paths = [source, f"{source}/__init__.py"] if (ROOT / source).is_dir() else [source]
        for path in paths:
            assert not dockerignored(path), f".dockerignore hides {path}, which the image copies"
