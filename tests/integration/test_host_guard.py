"""The Host and Origin checks behind a port mapping, on real servers on loopback.

Through a mapping (tests/port_mapping.py: what `docker run -p`, `kubectl port-forward`,
`ssh -L` or a TCP proxy do) a client's Host carries the mapping's port: both services
answer it, since DNS rebinding is told apart by the name alone. A foreign name stays
421 whatever its port, and nothing it sends is written. The console's own page works
through the mapping, where its Origin carries the mapping's port; an Origin of another
port is another site and stays 403.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
import yarl
from port_mapping import port_mapping

from publisher.app import ServiceSettings
from publisher.app import create_app as create_publisher
from publisher.console import ConsoleSettings
from publisher.settings import RelaySettings
from sink import create_app as create_sink

if TYPE_CHECKING:
    from conftest import Query, Serve

JSON = {"Content-Type": "application/json"}
TOKEN = "console-operator-token-0123"
UNREACHABLE = "http://127.0.0.1:9/events"  # the relay sends nothing: rows stay put


def port_of(url: str) -> int:
    port = yarl.URL(url).port
    assert port is not None
    return port


async def post(
    client: aiohttp.ClientSession, url: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with client.post(url, data=json.dumps(body), headers={**JSON, **(headers or {})}) as r:
        assert r.content_type == "application/json", await r.text()
        return r.status, await r.json()


async def test_both_services_answer_through_a_port_mapping(
    serve: Serve, client: aiohttp.ClientSession, sink_db: Path, db: Path, db_rows: Query
) -> None:
    sink = await serve(create_sink(sink_db))
    settings = ServiceSettings(db=str(db), sink=UNREACHABLE, relay=RelaySettings())
    publisher = await serve(create_publisher(settings))
    async with port_mapping(port_of(sink)) as sink_port, port_mapping(port_of(publisher)) as port:
        for n, name in enumerate(("127.0.0.1", "localhost")):
            status, reply = await post(
                client, f"http://{name}:{sink_port}/events", {"id": f"e-{n}", "sku": "s", "qty": 1}
            )
            assert (status, reply.get("ack")) == (200, f"e-{n}"), reply
            status, reply = await post(
                client, f"http://{name}:{port}/orders", {"id": f"o-{n}", "sku": "s", "qty": 1}
            )
            assert (status, reply.get("result")) == (201, "accepted"), reply
            async with client.get(f"http://{name}:{port}/status") as r:
                assert r.status == 200, await r.text()
    assert db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY id") == [("e-0",), ("e-1",)]
    assert db_rows(db, "SELECT id FROM outbox_entries ORDER BY seq") == [("o-0",), ("o-1",)]


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:{port}",
        "evil.example:{mapped}",
        "evil.example",
        "localhost.evil.example:{mapped}",
        "127.0.0.1.evil.example:{port}",
        "127.0.0.1:99999",
        "127.0.0.1:{port}:{port}",
        "localhost:http",
    ],
)
async def test_a_foreign_name_or_a_malformed_port_is_421_and_changes_nothing(
    serve: Serve, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query, host: str
) -> None:
    sink = await serve(create_sink(sink_db))
    async with port_mapping(port_of(sink)) as mapped:
        value = host.format(port=port_of(sink), mapped=mapped)
        url, event = f"http://127.0.0.1:{mapped}/events", {"id": "e-1", "sku": "s", "qty": 1}
        status, reply = await post(client, url, event, {"Host": value})
        assert (status, reply.get("host")) == (421, value), reply
    assert db_rows(sink_db, "SELECT count(*) FROM inbox_events") == [(0,)]


async def test_the_console_page_works_through_a_mapping_and_other_origins_stay_403(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    settings = ServiceSettings(
        db=str(db), sink=UNREACHABLE, relay=RelaySettings(), console=ConsoleSettings(token=TOKEN)
    )
    publisher = await serve(create_publisher(settings))
    sign_in = {"token": TOKEN, "operator": "alice"}
    async with port_mapping(port_of(publisher)) as mapped:
        url = f"http://127.0.0.1:{mapped}/console/api/sign-in"
        for origin in (
            f"http://127.0.0.1:{port_of(publisher)}",  # the service's port, not the page's
            f"http://localhost:{mapped}",  # another name: another site
            f"http://127.0.0.1:{mapped + 1}",
            f"https://127.0.0.1:{mapped}",
        ):
            status, reply = await post(client, url, sign_in, {"Origin": origin})
            assert (status, reply.get("origin")) == (403, origin), reply
        # The page as a browser loads it through the mapping: Host and Origin alike
        # carry the mapping's port.
        status, reply = await post(client, url, sign_in, {"Origin": f"http://127.0.0.1:{mapped}"})
        assert (status, reply.get("signed_in")) == (200, True), reply
        async with client.get(f"http://localhost:{mapped}/console") as r:
            assert r.status == 200 and r.content_type == "text/html"


async def test_behind_a_tls_proxy_the_console_page_has_its_https_origin(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    # --cookie-secure: the console is reached over TLS through a proxy in front, which
    # passes the browser's Host on; the page's Origin is https plus that Host.
    console = ConsoleSettings(token=TOKEN, cookie_secure=True)
    settings = ServiceSettings(db=str(db), sink=UNREACHABLE, relay=RelaySettings(), console=console)
    publisher = await serve(create_publisher(settings))
    url = f"http://127.0.0.1:{port_of(publisher)}/console/api/sign-in"
    sign_in, host = {"token": TOKEN, "operator": "alice"}, "localhost:8443"
    status, reply = await post(client, url, sign_in, {"Host": host, "Origin": f"http://{host}"})
    assert (status, reply.get("origin")) == (403, f"http://{host}"), reply
    status, reply = await post(client, url, sign_in, {"Host": host, "Origin": f"https://{host}"})
    assert (status, reply.get("signed_in")) == (200, True), reply
