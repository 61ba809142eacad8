"""`publisher dispatch`: one batch of pending entries delivered in order, once.

A one-shot relay: it delivers, so it takes the relay lock like `publisher serve` (on
SQLite that refuses it beside one), and beside relay workers it delivers under
leases: those of the global line and of every lane in its batch, taken first and
released at the end, or LineHeld (nothing sent) when another worker holds one.
Each verified ACK is kept with its mark.
"""

from __future__ import annotations

import argparse
from typing import Final

from plumbing.cli import EXIT_OK, add_option, fail
from plumbing.net import load_token
from publisher.chaos import exit_after_ack
from publisher.cli.options import (
    PROG,
    AddCommand,
    Check,
    Command,
    add_chaos_option,
    add_sink_options,
    batch_limit,
    log_egress,
    say,
)
from publisher.dispatch import collect_delivered
from publisher.driver import AfterDelivery, Driver, OutboxLine, Sender
from publisher.errors import DeliveryError, LeaseLost, OutboxError
from publisher.http import HttpSender
from publisher.leases import LeaseKeeper
from publisher.settings import RelaySettings, WorkerSettings, worker_id_for
from publisher.store import Outbox
from shared import GLOBAL_LINE, MAX_BATCH, Lease


def add_parsers(command: AddCommand) -> None:
    send = command("dispatch", "deliver one batch of pending entries, in order")
    add_sink_options(send, "sink URL, e.g. http://127.0.0.1:8080/events")
    add_option(send, "--limit", type=batch_limit, default=MAX_BATCH, help="batch size, 1 to 16")
    add_option(
        send,
        "--delivery",
        choices=["single", "batch"],
        default="single",
        help="single: one request per entry; batch: the whole batch in one request",
    )
    add_chaos_option(send)


async def cmd_dispatch(args: argparse.Namespace) -> int:
    delivered: list[str] = []
    crash = exit_after_ack(args.chaos) if args.chaos else None

    def after_delivery(event_id: str) -> None:
        if crash is not None:
            crash(event_id)
        delivered.append(event_id)

    sender = HttpSender(args.sink, allowed_hosts=args.allow_host, token=load_token(args.token_file))
    log_egress(args.sink, args.allow_host)
    worker = WorkerSettings(worker_id_for(args.db, None, dispatch=True))
    settings = RelaySettings(
        limit=args.limit, batch=args.delivery == "batch", pipeline=1, worker=worker
    )
    async with (
        sender,
        Outbox.open(args.db, create=False) as outbox,
        outbox.relay_lock("outbox-publisher dispatch"),
    ):
        try:
            marked = await deliver_pending(outbox, sender, settings, after_delivery)
        except (DeliveryError, LeaseLost) as exc:
            done = f"{len(delivered)} delivered ({', '.join(delivered) or 'none'}), then"
            return fail(PROG, f"dispatch stopped: {done} {exc}")
    say(f"delivered {len(marked)}" + (f": {' '.join(marked)}" if marked else ""))
    return EXIT_OK


class LineHeld(OutboxError):
    """Another worker holds the lease of a line this dispatch would deliver."""

    def __init__(self, line: str, owner: str | None, expires_in_s: float | None) -> None:
        left = "" if expires_in_s is None else f" for {max(expires_in_s, 0.0):.1f} s more"
        super().__init__(
            f"line {line!r} is being delivered by relay worker {owner or 'another worker'}"
            f"{left}: dispatch delivers nothing beside it"
        )
        self.line = line
        self.owner = owner


TAKE_ROUNDS: Final = 3  # reads of the batch while taking its lanes' leases


async def deliver_pending(
    outbox: Outbox,
    sender: Sender,
    settings: RelaySettings,
    after_delivery: AfterDelivery | None = None,
) -> list[str]:
    """One batch of the Outbox delivered through `sender` (`publisher dispatch`): one
    request per entry, or one for the batch (`settings.batch`), up to
    `settings.limit` entries; each verified ACK is kept with its mark.
    On a failure about an entry, the attempt is recorded on it before the failure is
    raised.

    With `settings.worker`, the batch is delivered under leases, as a relay worker would: the
    global line's (carried by every request and fencing every write) and that of
    each lane (SKU) in the batch, all taken before anything is sent and released at
    the end; LineHeld, nothing sent, if another worker holds any of them."""
    if settings.worker is None:
        return await _deliver(outbox, sender, settings, after_delivery, None)
    keeper = LeaseKeeper(outbox, settings.worker)
    await keeper.start()
    try:
        lease = await _take_lines(outbox, keeper, settings.limit)
        return await _deliver(outbox, sender, settings, after_delivery, lease, keeper)
    finally:
        await keeper.stop()


async def _take_lines(outbox: Outbox, keeper: LeaseKeeper, limit: int) -> Lease:
    """The global line's lease, and those of the lanes of the next batch (read again
    until every lane in it is held, a few times at most)."""
    lease = await _take(outbox, keeper, GLOBAL_LINE)
    for _ in range(TAKE_ROUNDS):
        rows = await outbox.pending_batch(limit)
        lanes = {row.lane for row in rows if row.lane is not None}  # an Outbox fills each
        if all(keeper.held(lane) for lane in lanes):
            return lease
        for lane in sorted(lanes):
            await _take(outbox, keeper, lane)
    raise LineHeld(GLOBAL_LINE, None, None)  # lanes kept changing under it: try again


async def _take(outbox: Outbox, keeper: LeaseKeeper, line: str) -> Lease:
    lease = await keeper.take(line)
    if lease is None:
        held = await outbox.lease_of(line)
        if held is None:
            raise LineHeld(line, None, None)
        raise LineHeld(line, held.owner, held.expires_in_s)
    return lease


async def _deliver(
    outbox: Outbox,
    sender: Sender,
    settings: RelaySettings,
    after_delivery: AfterDelivery | None,
    lease: Lease | None,
    keeper: LeaseKeeper | None = None,
) -> list[str]:
    marked: list[str] = []
    driver = Driver(
        OutboxLine(outbox),
        sender,
        settings,
        once=True,
        after_delivery=after_delivery,
        may_send=lambda: keeper is None or keeper.holds(lease),
        report=collect_delivered(marked),
    )
    try:
        await driver.run(lease)
    except Exception as exc:
        if driver.failed_entry is not None and not isinstance(exc, LeaseLost):
            await outbox.record_failure(driver.failed_entry.id, str(exc), lease)
        raise
    return marked


COMMANDS: Final[dict[str, Command]] = {"dispatch": cmd_dispatch}
CHECKS: Final[dict[str, Check]] = {}
