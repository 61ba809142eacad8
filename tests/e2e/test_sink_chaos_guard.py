"""`python -m sink --chaos ...` keeps the production Host and Origin rules: chaos only
adds faults, it does not change who may talk to the sink."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support import LOOPBACK

if TYPE_CHECKING:
    from conftest import Query, StartSink

pytestmark = pytest.mark.e2e


def post_with_host(port: int, host: str, event: dict[str, object]) -> int:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5.0)
    try:
        headers = {"Host": host, "Content-Type": "application/json"}
        conn.request("POST", "/events", json.dumps(event), headers)
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("chaos", [[], ["--chaos", "stall=0.01"]], ids=["plain", "chaos"])
def test_a_configured_host_name_is_allowed_and_others_are_not(
    tmp_path: Path, sink_process: StartSink, db_rows: Query, chaos: list[str]
) -> None:
    sink_db = tmp_path / "sink.db"
    sink = sink_process(sink_db, "--allow-host-header", "sink.internal", *chaos)
    port = int(sink.url.rsplit(":", 1)[1].split("/")[0])
    event = {"id": "order-1", "sku": "snack", "qty": 1}
    assert post_with_host(port, "evil.example", event) == 421
    assert post_with_host(port, f"sink.internal:{port}", event) == 200
    assert db_rows(sink_db, "SELECT id FROM inbox") == [("order-1",)]
