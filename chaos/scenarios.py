"""Named chaos scenarios: short stories, each with the evidence and its own verdict."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from chaos.dbs import DbLocation, Pair, as_int, is_postgres, value
from chaos.procs import ChaosError, Service, free_port, http_json
from chaos.run import PUBLISHER_FLAGS
from chaos.verdict import read_verdict
from shared import Order

CLI_TIMEOUT_S: Final = 60.0
WAIT_S: Final = 30.0
STALL_S: Final = 1.5
SLOW_ORDERS: Final = 20
# Intake commits locally and never waits for the sink: a generous bound still shows it.
INTAKE_P99_LIMIT_MS: Final = 500.0
Say = Callable[[str], None]


@dataclass
class Outcome:
    name: str
    ok: bool
    result: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.name, "ok": self.ok, "result": self.result, **self.figures}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )


def one(location: DbLocation, sql: str) -> Any:
    """One value read through a connection of our own (either backend)."""
    return value(location, sql)


def trace(say: Say, source: DbLocation, sink: Service, event_id: str) -> None:
    shown = cli(
        "publisher", "trace", event_id, "--db", str(source), "--sink", f"{sink.base_url}/events"
    )
    for line in shown.stdout.splitlines():
        say(f"    {line}")


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise ChaosError(f"timed out waiting for {what}")


def _resend_story(
    name: str,
    workdir: Path,
    say: Say,
    sink_chaos: list[str],
    dispatch_chaos: list[str],
    expect: int,
    databases: Pair,
) -> Outcome:
    """Shared by crash-after-ack and drop-after-commit: a first delivery that leaves the
    entry unsent although the sink applied it, then the resend."""
    source, sink_db = databases.source, databases.sink
    sink = Service("sink", ["--db", str(sink_db)], free_port(), workdir / "sink.log")
    db, url = ["--db", str(source)], f"{sink.base_url}/events"
    try:
        sink.start(*sink_chaos)
        accepted = cli(
            "publisher", "accept", *db, "--id", "order-1", "--sku", "snack", "--qty", "7"
        )
        say(f"  {accepted.stdout.strip()} (snack x7)")
        first = cli("publisher", "dispatch", *db, "--sink", url, *dispatch_chaos)
        said = (first.stderr or first.stdout).strip().splitlines()[-1:]
        say(f"  first dispatch: exit status {first.returncode} ({' '.join(said)})")
        say("  evidence after the first delivery:")
        trace(say, source, sink, "order-1")
        again = cli("publisher", "dispatch", *db, "--sink", url)
        if again.returncode != 0 and is_postgres(source):
            # On PostgreSQL the crashed dispatch still holds its lines' leases: the
            # next one refuses to deliver beside it until they expire.
            refused = (again.stderr or again.stdout).strip().splitlines()[-1:]
            say(f"  dispatch again: exit status {again.returncode} ({' '.join(refused)})")
            wait_until(lambda: not _leases_held(source), "the crashed dispatch's leases", 30)
            say("  its leases expired; dispatch once more:")
            again = cli("publisher", "dispatch", *db, "--sink", url)
        say(f"  dispatch again: exit status {again.returncode} ({again.stdout.strip()})")
        say("  evidence after the recovery:")
        trace(say, source, sink, "order-1")
    finally:
        sink.stop()
    deliveries = one(sink_db, "SELECT deliveries FROM inbox_events WHERE id = 'order-1'")
    stock = one(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'")
    sent = as_int(one(source, "SELECT sent FROM outbox_entries WHERE id = 'order-1'"))
    ok = (first.returncode, again.returncode, deliveries, stock, sent) == (expect, 0, 2, 7, 1)
    result = f"delivered {deliveries} times, applied once"
    if stock != 7:
        result = f"inventory is {stock}, expected 7"
    figures = {"first_exit": first.returncode, "deliveries": deliveries, "inventory": stock}
    return Outcome(name, ok, result, {**figures, "sent": sent, "databases": databases.shown()})


def _leases_held(source: DbLocation) -> bool:
    """Whether any line's lease is held unexpired (PostgreSQL: by the server's clock)."""
    held = value(
        source,
        "SELECT count(*) FROM outbox_line_leases WHERE owner IS NOT NULL"
        " AND expires_at > extract(epoch FROM clock_timestamp())",
    )
    return as_int(held) > 0


def crash_after_ack(workdir: Path, say: Say, databases: Pair) -> Outcome:
    say("crash-after-ack: the publisher ends with os._exit(73) right after a verified ACK")
    chaos = ["--chaos", "exit-after-ack"]
    return _resend_story("crash-after-ack", workdir, say, [], chaos, 73, databases)


def drop_after_commit(workdir: Path, say: Say, databases: Pair) -> Outcome:
    say("drop-after-commit: the sink commits, then closes the connection without a reply")
    chaos = ["--chaos", "drop-after-commit=1"]
    return _resend_story("drop-after-commit", workdir, say, chaos, [], 1, databases)


def _services(
    workdir: Path, databases: Pair, *publisher_flags: str
) -> tuple[DbLocation, DbLocation, Service, Service]:
    source, sink_db = databases.source, databases.sink
    sink = Service("sink", ["--db", str(sink_db)], free_port(), workdir / "sink.log")
    args = ["serve", "--db", str(source), "--sink", f"{sink.base_url}/events", *publisher_flags]
    publisher = Service("publisher", args, free_port(), workdir / "publisher.log")
    return source, sink_db, sink, publisher


def _sent_ids(source: DbLocation) -> list[str]:
    listed = cli("publisher", "list", "--db", str(source), "--state", "sent", "--json")
    return [json.loads(line)["id"] for line in listed.stdout.splitlines()]


def poison_head(workdir: Path, say: Say, databases: Pair) -> Outcome:
    say("poison-head: the sink rejects the head entry (400) until it is fixed")
    source, sink_db, sink, publisher = _services(workdir, databases, *PUBLISHER_FLAGS)
    orders = [("poison-1", "mystery", 1), ("ok-1", "snack", 2), ("ok-2", "snack", 3)]
    db, by = ["--db", str(source)], ["--by", "chaos-operator"]
    try:
        sink.start("--chaos", "reject-sku=mystery")
        publisher.start()
        for event_id, sku, qty in orders:
            order = {"id": event_id, "sku": sku, "qty": qty}
            http_json("POST", f"{publisher.base_url}/orders", order)
        wait_until(lambda: _status(publisher).get("head_blocked") is True, "a blocked head")
        head = _status(publisher)["head"]
        say(f"  status: head {head['id']} blocked, last error: {head['last_error']}")
        reason = ["--reason", "sink does not know sku mystery"]
        say("  " + cli("publisher", "quarantine", "poison-1", *db, *reason, *by).stdout.strip())
        wait_until(lambda: _status(publisher).get("pending") == 0, "later entries to flow")
        say(f"  later entries flowed: {' '.join(_sent_ids(source))}")
        sink.stop()
        sink.start()  # the fix: the sink now knows the SKU
        say("  the sink is fixed and restarted")
        say("  " + cli("publisher", "redrive", "poison-1", *db, *by).stdout.strip())
        sql = "SELECT sent FROM outbox_entries WHERE id = 'poison-1'"
        wait_until(lambda: as_int(one(source, sql)) == 1, "the redriven entry to be delivered")
        trace(say, source, sink, "poison-1")
    finally:
        publisher.stop()
        sink.stop()
    verdict = read_verdict(source, sink_db, {i: (s, q) for i, s, q in orders})
    record = json.loads(cli("publisher", "trace", "poison-1", *db, "--json").stdout)["quarantines"]
    passed = record[-1]["delivered_past"] if record else []
    ok = verdict.ok and verdict.delivered == 3 and passed == ["ok-1", "ok-2"]
    result = (
        f"the poison entry blocked the head, was quarantined, {len(passed)} entries were "
        f"delivered past it ({', '.join(passed)}), it was redriven and delivered; "
        f"{verdict.lost} lost"
    )
    figures = {**verdict.to_dict(), "delivered_past": passed, "databases": databases.shown()}
    return Outcome("poison-head", ok, result, figures)


def slow_sink(workdir: Path, say: Say, databases: Pair) -> Outcome:
    say(f"slow-sink: every event stalls {STALL_S} s at the sink; intake must stay fast")
    flags = [*PUBLISHER_FLAGS[:-1], "1"]  # --send-timeout 1: sends time out while stalled
    source, sink_db, sink, publisher = _services(workdir, databases, *flags)
    expected: dict[str, tuple[str, int]] = {}
    latencies_ms: list[float] = []
    try:
        sink.start("--chaos", f"stall={STALL_S}")
        publisher.start()
        for n in range(SLOW_ORDERS):
            order = Order(id=f"slow-{n:02d}", sku="snack", qty=1 + n % 3)
            started = time.perf_counter()
            code, _ = http_json("POST", f"{publisher.base_url}/orders", order)
            latencies_ms.append((time.perf_counter() - started) * 1000)
            if code == 201:
                expected[order["id"]] = ("snack", 1 + n % 3)
        p50, p99 = statistics.median(latencies_ms), statistics.quantiles(latencies_ms, n=100)[98]
        say(
            f"  {SLOW_ORDERS} orders while the sink stalls: "
            f"intake p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        )
        say(f"  backlog: {_status(publisher).get('pending')} pending")
        sink.stop()
        sink.start()  # the sink recovers
        say("  the sink recovers")
        wait_until(lambda: _status(publisher).get("pending") == 0, "the backlog to drain", 60)
    finally:
        publisher.stop()
        sink.stop()
    verdict = read_verdict(source, sink_db, expected)
    ok = verdict.ok and len(expected) == SLOW_ORDERS and p99 < INTAKE_P99_LIMIT_MS
    result = (
        f"intake p99 {p99:.0f} ms while the sink stalled; {verdict.delivered} delivered, "
        f"{verdict.lost} lost, {verdict.resends} resends absorbed"
    )
    figures = {**verdict.to_dict(), "intake_p99_ms": round(p99, 1), "databases": databases.shown()}
    return Outcome("slow-sink", ok, result, figures)


def _status(publisher: Service) -> dict[str, Any]:
    try:
        code, body = http_json("GET", f"{publisher.base_url}/status")
    except OSError:
        return {}
    return body if code == 200 and isinstance(body, dict) else {}


SCENARIOS: Final[dict[str, Callable[[Path, Say, Pair], Outcome]]] = {
    "crash-after-ack": crash_after_ack,
    "drop-after-commit": drop_after_commit,
    "poison-head": poison_head,
    "slow-sink": slow_sink,
}
