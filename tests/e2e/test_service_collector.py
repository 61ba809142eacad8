"""A service leaves its requests' containers to be freed when they are answered, not
walked by the cyclic garbage collector (plumbing.collector.service_collector): real
sink and publisher processes take batches of 1 KiB events, and their own /metrics
(`python_gc_collections_total`) say how many young collections ran meanwhile. With
Python's default young generation (700 containers) the same traffic starts one
every few events."""

from __future__ import annotations

import http.client
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import LOOPBACK

if TYPE_CHECKING:
    from conftest import StartPublisher, StartSink

pytestmark = pytest.mark.e2e

SINK_BATCHES = 192  # of 16 events (the sink's cap), 16 requests at a time
PUBLISHER_BATCHES = 12  # of 100 events (5,000 containers), 2 requests at a time
BATCH_MEDIA = "application/cloudevents-batch+json"
YOUNG = re.compile(r'^python_gc_collections_total\{generation="0"\} (\S+)$', re.MULTILINE)


def data(n: int) -> dict[str, Any]:
    """About 1 KiB of nested data: about fifty containers."""
    lines = [{"sku": f"s{k}", "qty": k + 1, "tags": ["food"]} for k in range(24)]
    return {
        "customer": {"id": f"c-{n}", "address": {"city": "Málaga", "street": "Calle Mayor 1"}},
        "lines": lines,
    }


def request(port: int, method: str, path: str, body: bytes = b"", media: str = "") -> bytes:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=10)
    try:
        conn.request(method, path, body, {"Content-Type": media} if media else {})
        response = conn.getresponse()
        text = response.read()
        assert response.status in (200, 201), (response.status, text[:300])
        return text
    finally:
        conn.close()


def young_collections(port: int) -> float:
    found = YOUNG.search(request(port, "GET", "/metrics").decode())
    assert found is not None, "no python_gc_collections_total in /metrics"
    return float(found[1])


def test_the_sink_answers_batches_of_1_kib_events_without_young_collections(
    sink_process: StartSink, tmp_path: Path
) -> None:
    sink = sink_process(tmp_path / "inbox.db")

    def body(b: int) -> bytes:
        items = [
            {
                "specversion": "1.0",
                "id": f"e-{b}-{n}",
                "source": "urn:test",
                "type": "shipment.prepared",
                "partitionkey": f"k-{n % 4}",
                "datacontenttype": "application/json",
                "data": data(n),
            }
            for n in range(16)
        ]
        return json.dumps(items).encode()

    def post(body: bytes) -> None:
        reply = json.loads(request(sink.port, "POST", "/events/batch", body, BATCH_MEDIA))
        assert len(reply["acks"]) == 16 and reply["rejected"] is None

    bodies = [body(b) for b in range(SINK_BATCHES)]
    before = young_collections(sink.port)
    with ThreadPoolExecutor(16) as clients:
        list(clients.map(post, bodies))
    # Each request is hundreds of containers, several requests are in progress at
    # once: with a young generation of 700 that starts dozens of collections. With
    # 20,000 they are freed first, as each request is answered.
    assert young_collections(sink.port) - before <= 2


def test_the_publisher_takes_batches_of_1_kib_events_without_young_collections(
    publisher_process: StartPublisher, tmp_path: Path
) -> None:
    publisher = publisher_process(
        "--db", str(tmp_path / "outbox.db"), "--sink", f"http://{LOOPBACK}:9/events", "--port", "0"
    )

    def body(b: int) -> bytes:
        events = [
            {"id": f"e-{b}-{n}", "type": "shipment.prepared", "key": f"k-{n % 4}", "data": data(n)}
            for n in range(100)
        ]
        return json.dumps({"events": events}).encode()

    def post(body: bytes) -> None:
        request(publisher.port, "POST", "/events/batch", body, "application/json")

    bodies = [body(b) for b in range(PUBLISHER_BATCHES)]
    before = young_collections(publisher.port)
    with ThreadPoolExecutor(2) as clients:
        list(clients.map(post, bodies))
    assert young_collections(publisher.port) - before <= 2
