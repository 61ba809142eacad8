"""Safe by default across a network: refusals of the real CLIs, as OS processes.

Non-loopback addresses appear only as listen addresses or as URLs that must be
refused before any connection; every request goes to 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import listening, run_module, spawn, stop_process

if TYPE_CHECKING:
    from conftest import Query, RunCli, StartSink

pytestmark = pytest.mark.e2e

TOKEN = "e2e-shared-secret-7f3a9c1b55"
WRONG = "e2e-shared-secret-7f3a9c1b56"
CLI_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 5.0
LISTENING = re.compile(r"sink listening on http://(0\.0\.0\.0|127\.0\.0\.1|\[::\]):(\d+)/events")
ORDER = ["--id", "order-1", "--sku", "snack", "--qty", "7"]


def run(
    env: dict[str, str], cwd: Path, module: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return run_module(module, *args, env=env, cwd=cwd, timeout=CLI_TIMEOUT_S)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def token_file(tmp_path: Path, text: str = TOKEN, name: str = "token") -> Path:
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------- a sink on any address


@dataclass
class Listening:
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    stderr: Path

    @property
    def loopback_base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> int:
        return stop_process(self.proc)


@pytest.fixture
def start_sink(tmp_path: Path, child_env: dict[str, str]) -> Iterator[Any]:
    started: list[Listening] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Listening:
        stderr_path = tmp_path / f"sink-{len(started)}.err"
        command = ["-m", "sink", "--db", str(tmp_path / "sink.db"), *args]
        proc = spawn(command, stderr_path, child_env if env is None else env, tmp_path)
        sink = Listening(proc, "", 0, stderr_path)
        started.append(sink)
        match = listening(proc, stderr_path, LISTENING, "sink")
        sink.host, sink.port = match[1], int(match[2])
        return sink

    yield start
    for sink in reversed(started):
        sink.stop()


def request(
    method: str, url: str, body: object = None, token: str | None = None
) -> tuple[int, Any]:
    """One request to a loopback URL, proxies ignored."""
    assert url.startswith("http://127.0.0.1:"), url
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def environ_without_token(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != "OUTBOX_TOKEN"}


# ---------------------------------------------------------------- sink: refusals


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_sink_refuses_an_open_address_without_a_token(
    tmp_path: Path, child_env: dict[str, str], host: str
) -> None:
    db = tmp_path / "sink.db"
    started = time.monotonic()

    done = run(child_env, tmp_path, "sink", "--db", str(db), "--host", host, "--port", "0")

    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < CLI_TIMEOUT_S / 2
    line = one_line(done.stderr)
    assert line.startswith("outbox-sink: ")
    assert host in line and "--insecure" in line
    assert done.stdout == "", "it must not report listening"
    assert not db.exists(), "refused before the database was opened"


def test_sink_refuses_an_open_address_from_the_environment(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    db = tmp_path / "sink.db"
    env = {**child_env, "OUTBOX_HOST": "0.0.0.0", "OUTBOX_TOKEN": "  "}

    done = run(env, tmp_path, "sink", "--db", str(db), "--port", "0")

    assert done.returncode == 2, done.stderr
    one_line(done.stderr)
    assert done.stdout == ""
    assert not db.exists()


@pytest.mark.parametrize(
    ("host", "text"),
    [
        ("0.0.0.0", "short-token"),
        ("127.0.0.1", "x" * 15),
        ("0.0.0.0", "has a space in it somewhere"),
    ],
    ids=["short", "15-chars", "space"],
)
def test_sink_refuses_an_unusable_token_file(
    tmp_path: Path, child_env: dict[str, str], host: str, text: str
) -> None:
    db = tmp_path / "sink.db"
    path = token_file(tmp_path, text)

    done = run(
        child_env, tmp_path, "sink", "--db", str(db), "--host", host, "--port", "0",
        "--token-file", str(path),
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert text not in line, "the error must not echo the token"
    assert done.stdout == ""
    assert not db.exists()


def test_sink_refuses_a_missing_token_file(tmp_path: Path, child_env: dict[str, str]) -> None:
    db = tmp_path / "sink.db"
    missing = tmp_path / "no-such-token"

    done = run(
        child_env, tmp_path, "sink", "--db", str(db), "--port", "0", "--token-file", str(missing)
    )

    assert done.returncode == 2, done.stderr
    assert "no-such-token" in one_line(done.stderr)
    assert not db.exists()


def test_sink_takes_no_token_argument(tmp_path: Path, child_env: dict[str, str]) -> None:
    db = tmp_path / "sink.db"

    done = run(child_env, tmp_path, "sink", "--db", str(db), "--port", "0", "--token", TOKEN)

    assert done.returncode == 2, done.stderr
    one_line(done.stderr)
    assert done.stdout == ""
    assert not db.exists()


# ---------------------------------------------------------------- sink: accepted set-ups


def test_sink_insecure_on_an_open_address(start_sink: Any) -> None:
    sink = start_sink("--host", "0.0.0.0", "--port", "0", "--insecure")

    assert sink.host == "0.0.0.0"
    assert request("GET", f"{sink.loopback_base}/healthz") == (200, {"status": "ok"})
    status, ack = request("POST", f"{sink.loopback_base}/events", {"id": "a", "sku": "s", "qty": 1})
    assert status == 200 and ack["ack"] == "a"
    assert sink.stop() == 0


@pytest.mark.parametrize("via", ["env", "file"])
def test_sink_with_a_token_on_an_open_address(
    start_sink: Any, tmp_path: Path, child_env: dict[str, str], db_rows: Query, via: str
) -> None:
    if via == "env":
        sink = start_sink(
            "--host", "0.0.0.0", "--port", "0", env={**child_env, "OUTBOX_TOKEN": TOKEN}
        )
    else:
        path = token_file(tmp_path)
        sink = start_sink("--host", "0.0.0.0", "--port", "0", "--token-file", str(path))
    event = {"id": "order-1", "sku": "snack", "qty": 7}

    assert sink.host == "0.0.0.0"
    assert request("GET", f"{sink.loopback_base}/healthz")[0] == 200
    assert request("POST", f"{sink.loopback_base}/events", event)[0] == 401
    assert request("POST", f"{sink.loopback_base}/events", event, WRONG)[0] == 401
    assert db_rows(tmp_path / "sink.db", "SELECT * FROM inbox_events") == []
    status, ack = request("POST", f"{sink.loopback_base}/events", event, TOKEN)
    assert (status, ack["ack"]) == (200, "order-1")
    assert db_rows(tmp_path / "sink.db", "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]

    argv = cmdline(sink.proc.pid)
    assert not any(TOKEN in arg for arg in argv), argv
    assert sink.stop() == 0
    assert TOKEN not in sink.stderr.read_text(), "the token must not reach the logs"


@pytest.mark.parametrize(
    "command",
    [
        ["sink"],
        ["publisher", "dispatch"],
        ["publisher", "serve"],
    ],
    ids=lambda c: "-".join(c),
)
def test_the_token_never_appears_in_help(
    tmp_path: Path, child_env: dict[str, str], command: list[str]
) -> None:
    path = token_file(tmp_path)
    env = {**child_env, "OUTBOX_TOKEN": TOKEN, "OUTBOX_TOKEN_FILE": str(path)}

    done = run(env, tmp_path, *command, "--help")

    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    assert "--token-file" in done.stdout
    assert "OUTBOX_TOKEN" in done.stdout


# ---------------------------------------------------------------- publisher with a token


@pytest.fixture
def source(tmp_path: Path, run_cli: RunCli) -> Path:
    db = tmp_path / "source.db"
    accepted = run_cli("publisher", "accept", "--db", str(db), *ORDER)
    assert accepted.returncode == 0, accepted.stderr
    return db


@pytest.fixture
def guarded_sink(sink_process: StartSink, tmp_path: Path) -> Any:
    return sink_process(tmp_path / "sink.db", "--token-file", str(token_file(tmp_path)))


def unauthorized_total(base: str) -> float:
    url = f"{base}/metrics"
    assert url.startswith("http://127.0.0.1:")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=HTTP_TIMEOUT_S) as response:
        text = response.read().decode()
    match = re.search(r"^sink_unauthorized_requests_total (\S+)$", text, re.MULTILINE)
    assert match is not None, text
    return float(match[1])


@pytest.mark.parametrize("via", ["env", "file"])
def test_dispatch_with_the_token_delivers(
    tmp_path: Path,
    child_env: dict[str, str],
    source: Path,
    guarded_sink: Any,
    db_rows: Query,
    via: str,
) -> None:
    if via == "env":
        env, extra = {**child_env, "OUTBOX_TOKEN": TOKEN}, []
    else:
        env = child_env
        extra = ["--token-file", str(token_file(tmp_path, name="publisher-token"))]

    done = run(
        env,
        tmp_path,
        "publisher",
        "dispatch",
        "--db",
        str(source),
        "--sink",
        guarded_sink.url,
        *extra,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "delivered 1: order-1"
    assert db_rows(source, "SELECT sent FROM outbox_entries WHERE id = 'order-1'") == [(1,)]
    assert db_rows(guarded_sink.db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]
    assert unauthorized_total(guarded_sink.base) == 0


@pytest.mark.parametrize("token", [None, WRONG], ids=["no-token", "wrong-token"])
def test_dispatch_without_the_right_token_fails_and_keeps_the_entry(
    tmp_path: Path,
    child_env: dict[str, str],
    source: Path,
    guarded_sink: Any,
    db_rows: Query,
    token: str | None,
) -> None:
    env = child_env if token is None else {**child_env, "OUTBOX_TOKEN": token}

    done = run(
        env, tmp_path, "publisher", "dispatch", "--db", str(source), "--sink", guarded_sink.url
    )

    assert done.returncode == 1, done.stderr
    line = one_line(done.stderr)
    assert "401" in line
    assert WRONG not in line
    assert done.stdout == ""
    assert db_rows(source, "SELECT sent, attempts FROM outbox_entries WHERE id = 'order-1'") == [
        (0, 1)
    ]
    assert db_rows(guarded_sink.db, "SELECT * FROM inbox_events") == []
    assert db_rows(guarded_sink.db, "SELECT * FROM inbox_inventory") == []
    assert unauthorized_total(guarded_sink.base) == 1


def test_dispatch_with_a_missing_token_file_sends_nothing(
    tmp_path: Path,
    child_env: dict[str, str],
    source: Path,
    guarded_sink: Any,
    db_rows: Query,
) -> None:
    missing = tmp_path / "no-such-token"
    env = {**child_env, "OUTBOX_TOKEN": TOKEN}  # a bad file is not silently replaced by the env

    done = run(
        env, tmp_path, "publisher", "dispatch", "--db", str(source), "--sink", guarded_sink.url,
        "--token-file", str(missing),
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "no-such-token" in one_line(done.stderr)
    assert db_rows(source, "SELECT sent, attempts FROM outbox_entries WHERE id = 'order-1'") == [
        (0, 0)
    ]
    assert db_rows(guarded_sink.db, "SELECT * FROM inbox_events") == []
    assert unauthorized_total(guarded_sink.base) == 0


def test_dispatch_with_a_short_token_sends_nothing(
    tmp_path: Path, child_env: dict[str, str], source: Path, guarded_sink: Any, db_rows: Query
) -> None:
    env = {**child_env, "OUTBOX_TOKEN": "too-short"}

    done = run(
        env, tmp_path, "publisher", "dispatch", "--db", str(source), "--sink", guarded_sink.url
    )

    assert done.returncode == 2, done.stderr
    assert "too-short" not in one_line(done.stderr)
    assert db_rows(source, "SELECT sent, attempts FROM outbox_entries WHERE id = 'order-1'") == [
        (0, 0)
    ]
    assert unauthorized_total(guarded_sink.base) == 0


def test_trace_asks_the_sink_with_the_token(
    tmp_path: Path, child_env: dict[str, str], source: Path, guarded_sink: Any
) -> None:
    env = {**child_env, "OUTBOX_TOKEN": TOKEN}
    delivered = run(
        env, tmp_path, "publisher", "dispatch", "--db", str(source), "--sink", guarded_sink.url
    )
    assert delivered.returncode == 0, delivered.stderr
    args = ["trace", "order-1", "--db", str(source), "--sink", guarded_sink.url, "--json"]

    with_token = run(env, tmp_path, "publisher", *args)
    without = run(environ_without_token(env), tmp_path, "publisher", *args)

    assert with_token.returncode == 0, with_token.stderr
    stages = {s["name"]: s["proof"] for s in json.loads(with_token.stdout)["stages"]}
    assert stages["received"] == "proven"
    assert without.returncode == 0, without.stderr
    stages = {s["name"]: s["proof"] for s in json.loads(without.stdout)["stages"]}
    assert stages["received"] == "unknown"


# ---------------------------------------------------------------- publisher: allowed hosts


@pytest.mark.parametrize(
    "url",
    [
        "http://sink.invalid:1/events",
        "http://192.0.2.10:8080/events",
        "http://0.0.0.0:8080/events",
    ],
)
def test_dispatch_refuses_a_host_that_is_not_allowed(
    tmp_path: Path, child_env: dict[str, str], source: Path, db_rows: Query, url: str
) -> None:
    env = {**child_env, "OUTBOX_TOKEN": TOKEN}

    done = run(env, tmp_path, "publisher", "dispatch", "--db", str(source), "--sink", url)

    assert done.returncode == 2, done.stderr
    assert "refused sink URL" in one_line(done.stderr)
    assert db_rows(source, "SELECT sent, attempts FROM outbox_entries WHERE id = 'order-1'") == [
        (0, 0)
    ]


def test_an_allowed_host_does_not_allow_another(
    tmp_path: Path, child_env: dict[str, str], source: Path, db_rows: Query
) -> None:
    done = run(
        child_env, tmp_path, "publisher", "dispatch", "--db", str(source),
        "--sink", "http://other.invalid:1/events",
        "--allow-host", "sink.invalid", "--allow-host", "warehouse.invalid",
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "other.invalid" in one_line(done.stderr)
    assert db_rows(source, "SELECT sent, attempts FROM outbox_entries WHERE id = 'order-1'") == [
        (0, 0)
    ]


def test_a_serve_refusal_happens_before_listening(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    db = tmp_path / "served.db"

    done = run(
        child_env, tmp_path, "publisher", "serve", "--db", str(db), "--port", "0",
        "--sink", "http://sink.invalid:1/events",
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    one_line(done.stderr)
    assert "listening" not in done.stdout


# ---------------------------------------------------------------- publisher: the intake

PUBLISHER_LISTENING = re.compile(
    r"publisher listening on http://(0\.0\.0\.0|127\.0\.0\.1|\[::\]):(\d+)/orders"
)
ORDER_BODY = {"id": "order-1", "sku": "snack", "qty": 7}


@pytest.fixture
def start_publisher(tmp_path: Path, child_env: dict[str, str]) -> Iterator[Any]:
    started: list[Listening] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Listening:
        stderr_path = tmp_path / f"publisher-{len(started)}.err"
        command = ["-m", "publisher", "serve", "--db", str(tmp_path / "served.db"), *args]
        proc = spawn(command, stderr_path, child_env if env is None else env, tmp_path)
        publisher = Listening(proc, "", 0, stderr_path)
        started.append(publisher)
        match = listening(proc, stderr_path, PUBLISHER_LISTENING, "publisher")
        publisher.host, publisher.port = match[1], int(match[2])
        return publisher

    yield start
    for publisher in reversed(started):
        publisher.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_publisher_refuses_an_open_intake_address_without_an_intake_token(
    tmp_path: Path, child_env: dict[str, str], host: str
) -> None:
    db = tmp_path / "served.db"
    done = run(
        child_env, tmp_path, "publisher", "serve", "--db", str(db), "--host", host,
        "--port", "0", "--sink", "http://127.0.0.1:1/events",
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert line.startswith("outbox-publisher: ")
    assert host in line and "--insecure" in line and "OUTBOX_INTAKE_TOKEN" in line
    assert done.stdout == "", "it must not report listening"
    assert not db.exists(), "refused before the database was opened"


def test_publisher_sink_token_is_not_an_intake_token(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    env = {**child_env, "OUTBOX_TOKEN": TOKEN}
    done = run(
        env, tmp_path, "publisher", "serve", "--db", str(tmp_path / "served.db"),
        "--host", "0.0.0.0", "--port", "0", "--sink", "http://127.0.0.1:1/events",
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "intake token" in one_line(done.stderr)


@pytest.mark.parametrize("via", ["env", "file"])
def test_publisher_with_an_intake_token_on_an_open_address(
    start_publisher: Any, tmp_path: Path, child_env: dict[str, str], db_rows: Query, via: str
) -> None:
    common = ["--host", "0.0.0.0", "--port", "0", "--sink", "http://127.0.0.1:1/events"]
    if via == "env":
        publisher = start_publisher(*common, env={**child_env, "OUTBOX_INTAKE_TOKEN": TOKEN})
    else:
        path = token_file(tmp_path, name="intake-token")
        publisher = start_publisher(*common, "--intake-token-file", str(path))
    orders = f"{publisher.loopback_base}/orders"

    assert request("GET", f"{publisher.loopback_base}/healthz")[0] == 200
    assert request("POST", orders, ORDER_BODY)[0] == 401
    assert request("POST", orders, ORDER_BODY, WRONG)[0] == 401
    assert db_rows(tmp_path / "served.db", "SELECT * FROM outbox_orders") == []
    status, reply = request("POST", orders, ORDER_BODY, TOKEN)
    assert (status, reply["result"]) == (201, "accepted")
    assert not any(TOKEN in arg for arg in cmdline(publisher.proc.pid))
    assert publisher.stop() == 0
    assert TOKEN not in publisher.stderr.read_text(), "the token must not reach the logs"


def test_publisher_insecure_on_an_open_address(start_publisher: Any) -> None:
    publisher = start_publisher(
        "--host", "0.0.0.0", "--port", "0", "--sink", "http://127.0.0.1:1/events", "--insecure"
    )
    status, reply = request("POST", f"{publisher.loopback_base}/orders", ORDER_BODY)
    assert (status, reply["result"]) == (201, "accepted")
    assert publisher.stop() == 0


def test_publisher_serve_logs_a_widened_egress_list_at_start(
    start_publisher: Any, child_env: dict[str, str]
) -> None:
    env = {**child_env, "OUTBOX_ALLOW_HOST": "warehouse.invalid"}
    publisher = start_publisher(
        "--port", "0", "--sink", "http://127.0.0.1:1/events", "--allow-host", "sink.invalid",
        env=env,
    )  # fmt: skip
    assert publisher.stop() == 0
    lines = [
        line
        for line in publisher.stderr.read_text().splitlines()
        if "allowed beyond loopback" in line
    ]
    assert len(lines) == 1, publisher.stderr.read_text()
    # The variable's hosts and the flag's are both in force: the line names both.
    assert "sink.invalid" in lines[0] and "warehouse.invalid" in lines[0]


def test_publisher_serve_says_egress_is_loopback_only_by_default(start_publisher: Any) -> None:
    publisher = start_publisher("--port", "0", "--sink", "http://127.0.0.1:1/events")
    assert publisher.stop() == 0
    assert "sink hosts allowed: loopback only" in publisher.stderr.read_text()


def test_dispatch_says_which_hosts_it_may_reach(
    tmp_path: Path, child_env: dict[str, str], source: Path, closed_port: int
) -> None:
    done = run(
        child_env, tmp_path, "publisher", "dispatch", "--db", str(source),
        "--sink", f"http://127.0.0.1:{closed_port}/events", "--allow-host", "sink.invalid",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "allowed beyond loopback: sink.invalid" in done.stderr
