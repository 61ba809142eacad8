"""Demo: kill the publisher right after the sink's ACK, then recover.

Starts a real sink process on loopback, records one order, runs dispatch with the
exit-after-ack chaos hook (the process ends with status 73 before it marks the entry),
shows what each database holds, runs dispatch again and shows the result: the event
was delivered twice and applied once.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "demo-data"
EVENT_ID, SKU, QTY = "order-0001", "snack", 7
STARTUP_TIMEOUT_S = 15.0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def start_sink(db: Path) -> tuple[subprocess.Popen[str], str]:
    sink = subprocess.Popen(
        [sys.executable, "-m", "sink", "--db", str(db), "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert sink.stdout is not None
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        line = sink.stdout.readline()
        if line.startswith("sink listening on "):
            return sink, line.split()[-1]
        if not line and sink.poll() is not None:
            break
    sink.kill()
    raise SystemExit("demo: the sink did not start")


def one(path: Path, sql: str, *params: object) -> tuple[object, ...] | None:
    with sqlite3.connect(path) as conn:
        row: tuple[object, ...] | None = conn.execute(sql, params).fetchone()
        return row


def evidence(source: Path, url: str) -> None:
    """The product's own evidence table for the event: `publisher trace`."""
    trace = cli("publisher", "trace", EVENT_ID, "--db", str(source), "--sink", url)
    print("\n".join("  " + line for line in trace.stdout.splitlines()))


def main() -> int:
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir()
    source, sink_db = DATA / "source.db", DATA / "sink.db"
    sink, url = start_sink(sink_db)
    try:
        print(f"sink on {url}; source DB {source.name}, sink DB {sink_db.name}\n")
        print(
            cli(
                "publisher",
                "accept",
                "--db",
                str(source),
                "--id",
                EVENT_ID,
                "--sku",
                SKU,
                "--qty",
                str(QTY),
            ).stdout.strip()
        )
        crash = cli(
            "publisher", "dispatch", "--db", str(source), "--sink", url, "--chaos", "exit-after-ack"
        )
        print(f"\ndispatch with exit-after-ack: exit status {crash.returncode}")
        print(f"  {crash.stderr.strip()}")
        evidence(source, url)
        again = cli("publisher", "dispatch", "--db", str(source), "--sink", url)
        print(f"\ndispatch again: exit status {again.returncode}: {again.stdout.strip()}")
        evidence(source, url)
    finally:
        sink.terminate()
        sink.wait(timeout=10)
    inbox = one(sink_db, "SELECT deliveries FROM inbox WHERE id = ?", EVENT_ID)
    stock = one(sink_db, "SELECT qty FROM inventory WHERE sku = ?", SKU)
    ok = inbox == (2,) and stock == (QTY,)
    print(
        f"\nresult: delivered {inbox and inbox[0]} times, applied once "
        f"(inventory {stock and stock[0]}): {'OK' if ok else 'VIOLATION'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
