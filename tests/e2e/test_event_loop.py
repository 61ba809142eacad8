"""The event loop each service runs on: uvloop by default, asyncio's own on request or
where uvloop cannot be imported; an order delivered end to end on each.

The loop named in the `listening` log record is read from the running loop, not from
the option, so a service that ignored the option would fail here.
"""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import (
    LOOPBACK,
    listening,
    post_event,
    post_order,
    spawn,
    stop_process,
    wait_until,
)

if TYPE_CHECKING:
    from conftest import Query, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

SINK_LISTENING = re.compile(r"sink listening on http://127\.0\.0\.1:(\d+)/events")

# Runs a service's command line (`-c WITHOUT_UVLOOP sink ...`) in an interpreter where
# `import uvloop` fails, as on a platform uvloop is not built for.
WITHOUT_UVLOOP = """
import runpy, sys

class NoUvloop:
    def find_spec(self, name, path=None, target=None):
        if name == "uvloop" or name.startswith("uvloop."):
            raise ModuleNotFoundError("No module named 'uvloop'", name=name)
        return None

sys.meta_path.insert(0, NoUvloop())
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
# Runs a sink (`-c OUT_OF_DESCRIPTORS DIR sink-args...`) whose process takes every free
# descriptor once DIR/hog exists, and gives them back once DIR/release exists; each
# step is marked on stderr (checking for a file takes no descriptor, writing to an open
# one neither).
OUT_OF_DESCRIPTORS = """
import os, pathlib, resource, runpy, sys, threading, time
resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))  # a connection cap of 192
control = pathlib.Path(sys.argv[1])

def wait_for(name):
    for _ in range(3000):
        if (control / name).exists():
            return
        time.sleep(0.01)
    os._exit(99)

def hog():
    wait_for("hog")
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    os.write(2, b"test: out of descriptors\\n")  # stderr is open: no descriptor needed
    wait_for("release")
    for fd in held:
        os.close(fd)
    os.write(2, b"test: descriptors back\\n")

threading.Thread(target=hog, daemon=True).start()
sys.argv = ["sink", *sys.argv[2:]]
runpy.run_module("sink", run_name="__main__", alter_sys=True)
"""


def listening_record(log: Path) -> dict[str, Any]:
    lines = log.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    found = [r for r in records if r.get("message") == "listening"]
    assert len(found) == 1, records
    return found[0]


@pytest.mark.parametrize(
    ("sink_args", "publisher_args", "publisher_env", "expected"),
    [
        ((), (), {}, "uvloop"),
        (("--event-loop", "asyncio"), ("--event-loop", "asyncio"), {}, "asyncio"),
        (("--event-loop", "uvloop"), (), {"OUTBOX_EVENT_LOOP": "asyncio"}, None),
    ],
    ids=["default", "flag-asyncio", "env-asyncio"],
)
def test_each_service_runs_on_the_loop_it_is_given_and_an_order_gets_through(
    tmp_path: Path,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    db_rows: Query,
    sink_args: tuple[str, ...],
    publisher_args: tuple[str, ...],
    publisher_env: dict[str, str],
    expected: str | None,
) -> None:
    sink = sink_process(tmp_path / "sink.db", "--log-format", "json", *sink_args)
    db = tmp_path / "source.db"
    publisher = publisher_process(
        *("--db", str(db), "--sink", sink.url, "--host", LOOPBACK, "--port", "0"),
        *("--poll-interval", "5", "--log-format", "json", *publisher_args),
        env=publisher_env,
    )

    item = {"id": "order-1", "sku": "snack", "qty": 3}
    assert post_order(publisher.port, item) == (201, {"id": "order-1", "result": "accepted"})
    wait_until(lambda: db_rows(db, "SELECT sent FROM outbox_entries") == [(1,)])

    assert db_rows(sink.db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]
    assert db_rows(sink.db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(3,)]
    sink_loop = listening_record(sink.log)["event_loop"]
    publisher_loop = listening_record(publisher.log)["event_loop"]
    if expected is None:  # the flag on one side, the environment on the other
        assert (sink_loop, publisher_loop) == ("uvloop", "asyncio")
    else:
        assert (sink_loop, publisher_loop) == (expected, expected)


# The loop a real `python -m` picks by itself, in an interpreter with no uvloop: the
# usage errors about the loop are in tests/unit/test_cli_usage.py.
def test_without_uvloop_the_default_is_asyncio(tmp_path: Path, child_env: dict[str, str]) -> None:
    log = tmp_path / "sink.log"
    args = ["--db", str(tmp_path / "sink.db"), "--host", LOOPBACK, "--port", "0"]
    proc = spawn(
        ["-c", WITHOUT_UVLOOP, "sink", *args, "--log-format", "json"], log, child_env, tmp_path
    )
    try:
        listening(proc, log, SINK_LISTENING, "sink")
        assert listening_record(log)["event_loop"] == "asyncio"
    finally:
        assert stop_process(proc) == 0


def health(port: int, timeout_s: float) -> int | str:
    """GET /healthz on a new connection: the status, or what went wrong."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout_s)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_sink_out_of_descriptors_serves_again_once_they_are_back(
    tmp_path: Path, child_env: dict[str, str], db_rows: Query, loop: str
) -> None:
    control = tmp_path / "control"
    control.mkdir()
    db, log = tmp_path / "sink.db", tmp_path / "sink.log"
    args = ["--db", str(db), "--host", LOOPBACK, "--port", "0", "--event-loop", loop]
    proc = spawn(["-c", OUT_OF_DESCRIPTORS, str(control), *args], log, child_env, tmp_path)
    try:
        port = int(listening(proc, log, SINK_LISTENING, "sink")[1])
        assert health(port, 5.0) == 200
        (control / "hog").touch()
        wait_until(lambda: "test: out of descriptors" in log.read_text())

        # No descriptor for a new connection: asyncio's loop leaves it waiting in the
        # backlog, uvloop accepts and closes it at once. Neither answers.
        during = [health(port, 0.5) for _ in range(3)]
        (control / "release").touch()
        wait_until(lambda: "test: descriptors back" in log.read_text())

        assert 200 not in during, during
        assert health(port, 5.0) == 200
        event = {"id": "order-1", "sku": "snack", "qty": 4}
        assert post_event(port, event) == 200
        assert db_rows(db, "SELECT id FROM inbox_events") == [("order-1",)]
        assert proc.poll() is None, "the sink died"
        text = log.read_text()
        assert "Traceback" not in text, text[-2000:]
        if loop == "asyncio":  # reported once per interval, not once per attempt
            assert 1 <= text.count("out of system resource") <= 3, text[-2000:]
    finally:
        assert stop_process(proc) == 0
