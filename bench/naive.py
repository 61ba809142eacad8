"""The naive peer: what a user would write from the design note alone.

Sequential stdlib code on both sides, with sqlite3's default settings (rollback
journal) and a real COMMIT per event:

- the sink (`python -m bench.naive --db PATH --port 0`) is an `http.server`
  ThreadingHTTPServer that opens a connection per request and commits the inbox row
  and the inventory change in one transaction before it answers with the ACK;
- the publisher (`drain`) reads the oldest pending entry, POSTs it with
  urllib.request (a new TCP connection per request), checks the ACK and commits the
  mark, one entry at a time.

It is given a partial index on pending entries, so its figure is not slowed by a
scan of everything already sent.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

SINK_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS inbox (id TEXT PRIMARY KEY, payload TEXT NOT NULL,"
    " received_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS inventory (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)",
)
SOURCE_SCHEMA: Final = (
    "CREATE TABLE orders (id TEXT PRIMARY KEY, sku TEXT NOT NULL, qty INTEGER NOT NULL)",
    "CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
    " payload TEXT NOT NULL, sent INTEGER NOT NULL DEFAULT 0, sent_at REAL)",
    "CREATE INDEX outbox_pending ON outbox (seq) WHERE sent = 0",
)
REQUEST_TIMEOUT_S: Final = 10.0


class SinkServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, db_path: str) -> None:
        super().__init__(("127.0.0.1", port), SinkHandler)
        self.db_path = db_path


class SinkHandler(BaseHTTPRequestHandler):
    server: SinkServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        event = json.loads(self.rfile.read(length))
        conn = sqlite3.connect(self.server.db_path)
        try:
            try:
                conn.execute(
                    "INSERT INTO inbox (id, payload, received_at) VALUES (?, ?, ?)",
                    (event["id"], json.dumps(event, sort_keys=True), time.time()),
                )
                conn.execute(
                    "INSERT INTO inventory (sku, qty) VALUES (?, ?)"
                    " ON CONFLICT (sku) DO UPDATE SET qty = qty + excluded.qty",
                    (event["sku"], event["qty"]),
                )
                conn.commit()
                status = "applied"
            except sqlite3.IntegrityError:
                conn.rollback()
                status = "duplicate"
        finally:
            conn.close()
        body = json.dumps({"ack": event["id"], "status": status}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one stderr line per request would only slow the peer down


def payload(order: Mapping[str, object]) -> str:
    """An order as the naive peer stores and sends it: its own shape `{id, sku, qty}`,
    sorted keys and no spaces (a baseline: it never learnt of generic events)."""
    return json.dumps(order, sort_keys=True, separators=(",", ":"))


def create_source(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    for statement in SOURCE_SCHEMA:
        conn.execute(statement)
    conn.commit()
    return conn


def drain(db_path: str, url: str, most: int, timeout_s: float) -> int:
    """Deliver pending entries one by one until none is left; return how many."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    conn = sqlite3.connect(db_path)
    delivered = 0
    deadline = time.monotonic() + timeout_s
    try:
        for _ in range(most):
            row = conn.execute(
                "SELECT seq, id, payload FROM outbox WHERE sent = 0 ORDER BY seq LIMIT 1"
            ).fetchone()
            if row is None or time.monotonic() > deadline:
                break
            seq, event_id, payload = row
            request = urllib.request.Request(
                url, data=payload.encode(), headers={"Content-Type": "application/json"}
            )
            with opener.open(request, timeout=REQUEST_TIMEOUT_S) as response:
                ack = json.loads(response.read())
            if response.status != 200 or ack.get("ack") != event_id:
                raise RuntimeError(f"no ACK for {event_id}: {ack!r}")
            conn.execute(
                "UPDATE outbox SET sent = 1, sent_at = ? WHERE seq = ?", (time.time(), seq)
            )
            conn.commit()
            delivered += 1
    finally:
        conn.close()
    return delivered


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.naive", description="the naive peer's sink")
    parser.add_argument("--db", required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    conn = sqlite3.connect(args.db)
    for statement in SINK_SCHEMA:
        conn.execute(statement)
    conn.commit()
    conn.close()
    with SinkServer(args.port, args.db) as server:
        port = server.server_address[1]
        print(f"naive sink listening on http://127.0.0.1:{port}/events", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
