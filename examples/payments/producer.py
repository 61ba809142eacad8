"""Capture payments: each one a `payments` row and its `payment.captured` event,
written in one SQLAlchemy transaction.

    python examples/payments/producer.py --db payments.db --payments 200 --customers 20

The event is an outbox entry, a row of the same database written in the transaction
that writes the payment: both commit or neither does. The relay (`python -m publisher
serve --db payments.db ...`) delivers the entries afterwards, and after any crash
sends again what it has not marked sent, with the same event ID.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa

from publisher import Outbox, publish_in

DESCRIPTION: Final = "Capture payments, each with its payment.captured event in one transaction."

metadata = sa.MetaData()
payments = sa.Table(
    "payments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),  # assigned in the order of capture
    sa.Column("customer", sa.String(64), nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)


def capture(conn: sa.Connection, customer: str, amount_cents: int) -> str:
    """Write a payment and its event in `conn`'s transaction (the caller commits);
    the event's ID."""
    row = {"customer": customer, "amount_cents": amount_cents}
    payment_id = conn.execute(sa.insert(payments).values(row).returning(payments.c.id)).scalar_one()
    event_id = f"payment-{payment_id}"
    # Last in the transaction: on PostgreSQL the entry holds the outbox's commit-order
    # lock until the commit. The key keeps each customer's payments in order.
    publish_in(conn, {"id": event_id, "type": "payment.captured", "key": customer, "data": row})
    return event_id


def sqlalchemy_url(db: str) -> sa.URL:
    """The services' --db value (a SQLite file, a postgresql:// URI) as SQLAlchemy's URL."""
    if db.startswith(("postgresql://", "postgres://")):
        return sa.make_url(db).set(drivername="postgresql+psycopg")
    return sa.URL.create("sqlite", database=db)


async def create_outbox(db: str) -> None:
    """The outbox's tables, made (or brought up to date) once before the first entry."""
    async with Outbox.open(db):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--db", required=True, help="a SQLite file or a postgresql:// URI")
    parser.add_argument("--payments", type=int, default=200, help="how many to capture")
    parser.add_argument("--customers", type=int, default=20, help="spread over this many")
    args = parser.parse_args(argv)

    asyncio.run(create_outbox(args.db))
    engine = sa.create_engine(sqlalchemy_url(args.db))
    try:
        metadata.create_all(engine)
        for _ in range(args.payments):
            customer = f"customer-{random.randrange(args.customers):02d}"
            with engine.begin() as conn:  # one transaction: the payment and its event
                event_id = capture(conn, customer, random.randrange(100, 100_000))
            print(f"captured {event_id} for {customer}", flush=True)
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
