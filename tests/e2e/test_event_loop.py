"""The event loop each service runs on: uvloop by default, asyncio's own on request or
where uvloop cannot be imported; an order delivered end to end on each.

The loop named in the `listening` log record is read from the running loop, not from
the option, so a service that ignored the option would fail here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import LOOPBACK, listening, post_order, spawn, stop_process, wait_until

if TYPE_CHECKING:
    from conftest import Query, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

SINK_LISTENING = re.compile(r"sink listening on http://127\.0\.0\.1:\d+/events")

# Runs the sink's command line in an interpreter where `import uvloop` fails, as on a
# platform uvloop is not built for.
WITHOUT_UVLOOP = """
import sys

class NoUvloop:
    def find_spec(self, name, path=None, target=None):
        if name == "uvloop" or name.startswith("uvloop."):
            raise ModuleNotFoundError("No module named 'uvloop'", name=name)
        return None

sys.meta_path.insert(0, NoUvloop())
from sink.cli import main
sys.exit(main(sys.argv[1:]))
"""


def listening_record(log: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
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
    wait_until(lambda: db_rows(db, "SELECT sent FROM outbox") == [(1,)])

    assert db_rows(sink.db, "SELECT id, deliveries FROM inbox") == [("order-1", 1)]
    assert db_rows(sink.db, "SELECT qty FROM inventory WHERE sku = 'snack'") == [(3,)]
    sink_loop = listening_record(sink.log)["event_loop"]
    publisher_loop = listening_record(publisher.log)["event_loop"]
    if expected is None:  # the flag on one side, the environment on the other
        assert (sink_loop, publisher_loop) == ("uvloop", "asyncio")
    else:
        assert (sink_loop, publisher_loop) == (expected, expected)


def test_without_uvloop_the_default_is_asyncio_and_asking_for_uvloop_is_a_usage_error(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    db = tmp_path / "sink.db"
    log = tmp_path / "sink.log"
    args = ["--db", str(db), "--host", LOOPBACK, "--port", "0", "--log-format", "json"]

    refused = subprocess.run(
        [sys.executable, "-c", WITHOUT_UVLOOP, *args, "--event-loop", "uvloop"],
        capture_output=True,
        text=True,
        env=child_env,
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    assert refused.returncode == 2, refused
    assert refused.stdout == ""
    assert refused.stderr.startswith("sink: uvloop cannot be imported here"), refused.stderr
    assert "--event-loop asyncio" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert not db.exists(), "nothing may be created before the loop is settled"

    proc = spawn(["-c", WITHOUT_UVLOOP, *args], log, child_env, tmp_path)
    try:
        listening(proc, log, SINK_LISTENING, "sink")
        assert listening_record(log)["event_loop"] == "asyncio"
    finally:
        assert stop_process(proc) == 0
