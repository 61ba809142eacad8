"""examples/payments as its README runs it, with real processes, on SQLite and on
PostgreSQL: the producer captures 200 payments over 20 customers while the relay
(`python -m publisher serve`) delivers them to the consumer's app. Meanwhile the relay
ends itself right after a verified ACK, before the mark, three times; the consumer ends
itself right after a commit, before the reply, three times, and is killed once inside
the inbox's transaction, after its handler gave the ledger row; each is started again
at once. Then, read through connections of the test's own: every payment is in the
ledger exactly once, each customer's in the order they were captured, no outbox entry
is left unsent, and the consumer's GET /ledger says the same.

What each fault proves: after an ACK, the entry is sent again and the inbox takes it as
a duplicate without its handler (a handler run again would write a second row); after a
commit, the same; inside the transaction, the ledger row is rolled back with the
event's record, and only the relay's resend brings that payment in (a handler writing
through a connection of its own would leave its row behind and write it again, and a
relay that did not resend would leave the payment out).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import LOOPBACK, POLL_S, http_request, query, stop_process, wait_until

from chaos.procs import free_port
from plumbing.cli import CHAOS_EXIT_STATUS

if TYPE_CHECKING:
    from conftest import Databases

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "payments"
PAYMENTS = 200
CUSTOMERS = 20
RUN_TIMEOUT_S = 90.0
STARTUP_TIMEOUT_S = 15.0
# Fast retries and a short lease, so that each restart is taken up at once (a relay
# restarted on PostgreSQL is a new worker, waiting out the killed one's leases), and
# batches of at most 4, so that 200 payments take enough requests for every fault.
RELAY_FLAGS = (
    "--ordering",
    "key",
    "--limit",
    "4",
    "--poll-interval",
    "0.05",
    "--retry-base",
    "0.02",
    "--retry-cap",
    "0.3",
    "--send-timeout",
    "3",
    "--lease-ttl",
    "1",
    "--no-console",
)

# The consumer with the test's faults, which the example has none of: argv[1] ends it
# right after the inbox's Nth commit, before the reply (sink.chaos, as `python -m sink
# --chaos exit-after-commit=N` does); argv[2] kills it inside the inbox's transaction
# once the example's handler has given the Nth ledger row. The rest is the example's
# own command line.
FAULTY_CONSUMER = """
import os, signal, sys
from examples.payments import consumer
from sink import Handlers
from sink.chaos import Chaos, chaos_app

after_commit, in_transaction = int(sys.argv[1]), int(sys.argv[2])
if after_commit:
    chaos = Chaos(exit_after_commit=after_commit)
    consumer.create_app = lambda db, handlers: chaos_app(db, chaos, handlers=handlers)
if in_transaction:
    dying = Handlers(consumer.handlers.name)
    dying.schema(*consumer.handlers.schema_statements)
    given = []

    @dying.on("payment.captured")
    def captured(event):
        statements = consumer.captured(event)
        given.append(event.id)
        if len(given) == in_transaction:
            print(f"test: killed in the transaction of {event.id}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return statements

    consumer.handlers = dying
sys.exit(consumer.main(sys.argv[3:]))
"""


@dataclass(frozen=True)
class Fault:
    """How a process is started so that it ends itself, and the status it ends with."""

    args: tuple[str, ...]
    status: int


def exit_after_ack(acks: int) -> Fault:
    return Fault(("--chaos", f"exit-after-ack={acks}"), CHAOS_EXIT_STATUS)


def exit_after_commit(commits: int) -> Fault:
    return Fault((str(commits), "0"), CHAOS_EXIT_STATUS)


def killed_in_transaction(rows: int) -> Fault:
    return Fault(("0", str(rows)), -signal.SIGKILL)


# Each is sure to happen: the relay's ACKs add up to less than the 200 every run needs,
# and the consumer's commits and handler calls to less than the requests and payments
# left at each start (a request carries 4 at most).
RELAY_FAULTS = (exit_after_ack(15), exit_after_ack(25), exit_after_ack(35))
CONSUMER_FAULTS = (
    exit_after_commit(5),
    killed_in_transaction(30),
    exit_after_commit(9),
    exit_after_commit(14),
)


@dataclass
class Restarted:
    """A service started with each of its faults in turn, again as soon as it ends
    with the status that fault says; then without one."""

    name: str
    command: Callable[[Fault | None], list[str]]
    faults: list[Fault]
    env: dict[str, str]
    workdir: Path
    fault: Fault | None = None
    ended: list[Fault] = field(default_factory=list)
    proc: subprocess.Popen[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self._start()

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}-{len(self.ended)}.log"

    def tend(self) -> None:
        """Start it again if it ended; fail if it ended otherwise than its fault says."""
        status = self.proc.poll()
        if status is None:
            return
        fault = self.fault
        assert fault is not None and status == fault.status, (
            f"{self.name} ended with {status}: {self.log.read_text()}"
        )
        self.ended.append(fault)
        self._start()

    def stop(self) -> int:
        return stop_process(self.proc)

    def _start(self) -> None:
        self.fault = self.faults.pop(0) if self.faults else None
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *self.command(self.fault)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.workdir,
            )


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_every_payment_reaches_the_ledger_once_in_order_through_crashes_on_both_sides(
    databases: Databases, child_env: dict[str, str], tmp_path: Path
) -> None:
    source, ledger_db = str(databases.source), str(databases.sink)
    port = free_port()  # the consumer comes back on it each time
    env = {**child_env, "PYTHONPATH": os.pathsep.join([child_env["PYTHONPATH"], str(REPO)])}

    def relay(fault: Fault | None) -> list[str]:
        sink = f"http://{LOOPBACK}:{port}/outbox/events"
        command = ["-m", "publisher", "serve", "--db", source, "--sink", sink, "--port", "0"]
        return [*command, *RELAY_FLAGS, *(fault.args if fault else ())]

    def consumer(fault: Fault | None) -> list[str]:
        args = ["--db", ledger_db, "--port", str(port)]
        if fault is None:
            return [str(EXAMPLE / "consumer.py"), *args]
        return ["-c", FAULTY_CONSUMER, *fault.args, *args]

    consumers = Restarted("consumer", consumer, list(CONSUMER_FAULTS), env, tmp_path)
    relays = Restarted("relay", relay, list(RELAY_FAULTS), env, tmp_path)
    producer = produce(source, env, tmp_path)
    try:
        run_until_delivered(source, producer, relays, consumers)
        assert producer.wait() == 0, (tmp_path / "producer.log").read_text()
        assert relays.stop() == 0
        balances = ledger_balances(port)
        assert consumers.stop() == 0
    finally:
        stop_process(producer)
        relays.stop()
        consumers.stop()

    captured = query(source, "SELECT id, customer, amount_cents FROM payments ORDER BY id")
    assert len(captured) == PAYMENTS
    assert_in_ledger_once_in_order(ledger_db, captured)
    assert relays.ended == list(RELAY_FAULTS)
    assert consumers.ended == list(CONSUMER_FAULTS)
    assert query(source, "SELECT id FROM outbox_entries WHERE sent <> 1") == []
    assert {f"payment-{n}" for n, *_ in captured} == {
        entry for (entry,) in query(source, "SELECT id FROM outbox_entries")
    }
    [(resent,)] = query(ledger_db, "SELECT COUNT(*) FROM inbox_events WHERE deliveries > 1")
    assert resent >= 1, "no payment was delivered twice: the faults did not bite"
    assert balances == expected_balances(captured)


def produce(db: str, env: dict[str, str], workdir: Path) -> subprocess.Popen[bytes]:
    """The example's producer, capturing its payments while the others run."""
    args = ["--db", db, "--payments", str(PAYMENTS), "--customers", str(CUSTOMERS)]
    with (workdir / "producer.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, str(EXAMPLE / "producer.py"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )


def run_until_delivered(
    source: str, producer: subprocess.Popen[bytes], relays: Restarted, consumers: Restarted
) -> None:
    """Restart the relay and the consumer as they end, until the producer is done and
    no entry is left unsent; bounded in time. (Every fault has happened by then: fewer
    entries than all could have been marked before.)"""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for _ in range(int(RUN_TIMEOUT_S / POLL_S) + 1):
        relays.tend()
        consumers.tend()
        done = producer.poll()
        assert done in (None, 0), f"the producer ended with {done}: see its log"
        if done == 0 and unsent(source) == 0:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    raise AssertionError(
        f"not delivered within {RUN_TIMEOUT_S} s: producer {producer.poll()}, relay faults"
        f" {len(relays.ended)}/{len(RELAY_FAULTS)}, consumer faults"
        f" {len(consumers.ended)}/{len(CONSUMER_FAULTS)}, {unsent(source)} unsent"
    )


def unsent(source: str) -> int:
    [(count,)] = query(source, "SELECT COUNT(*) FROM outbox_entries WHERE sent <> 1")
    return int(count)


def assert_in_ledger_once_in_order(ledger_db: str, captured: Sequence[tuple[Any, ...]]) -> None:
    """Each payment one ledger row of its customer, and each customer's rows applied
    (the inbox's applied_seq, given in the transaction that wrote the row) in the
    order the payments were captured."""
    rows = Counter(query(ledger_db, "SELECT payment_id, customer, amount_cents FROM ledger"))
    assert rows == Counter((f"payment-{n}", customer, cents) for n, customer, cents in captured)
    applied = query(
        ledger_db,
        "SELECT l.customer, l.payment_id FROM ledger l"
        " JOIN inbox_events e ON e.id = l.payment_id ORDER BY e.applied_seq",
    )
    assert by_customer(applied) == by_customer(
        [(customer, f"payment-{n}") for n, customer, _ in captured]
    )


def by_customer(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[str]]:
    ordered: dict[str, list[str]] = {}
    for customer, payment_id in rows:
        ordered.setdefault(customer, []).append(payment_id)
    return ordered


def expected_balances(captured: Sequence[tuple[Any, ...]]) -> dict[str, dict[str, int]]:
    balances: dict[str, dict[str, int]] = {}
    for _, customer, cents in captured:
        balance = balances.setdefault(customer, {"payments": 0, "total_cents": 0})
        balance["payments"] += 1
        balance["total_cents"] += cents
    return balances


def ledger_balances(port: int) -> Any:
    """GET /ledger of the consumer's own, once it answers (it may be starting again)."""
    replies: list[Any] = []

    def answered() -> bool:
        try:
            status, body = http_request(port, "GET", "/ledger")
        except OSError:
            return False
        replies.append(body)
        return status == 200

    wait_until(answered, STARTUP_TIMEOUT_S)
    return replies[-1]
