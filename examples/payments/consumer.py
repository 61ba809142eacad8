"""A consumer of `payment.captured` events: an aiohttp app of its own, with a ledger,
that mounts the inbox at /outbox/.

    python examples/payments/consumer.py --db ledger.db --port 8081

The relay delivers to http://127.0.0.1:8081/outbox/events. For each event the inbox
records its ID and runs the handler's statements in one transaction, and answers with
an ACK only after that commit: an event delivered again (the relay resends whatever
it has no ACK for, or has not marked sent, after any crash) is acknowledged again
without reaching the handler, so each payment is in the ledger once.

The same registry also runs under the stock sink, from the repository's root:
`python -m sink --db ledger.db --handlers examples.payments.consumer:handlers`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

import sqlalchemy as sa
from aiohttp import web

from sink import HandledEvent, Handlers, Reject, Statement, create_app

DESCRIPTION: Final = "Serve the ledger, with the inbox mounted at /outbox/."
LOOPBACK: Final = "127.0.0.1"  # the inbox has no token here: never listen beyond loopback

handlers = Handlers("payments")
# Run once, when the inbox first opens the database: to change the table later, add a
# statement, never edit this one. No unique key on payment_id: the inbox is what
# applies a payment once, and a second application would show as a second row.
handlers.schema(
    "CREATE TABLE ledger ("
    " payment_id TEXT NOT NULL, customer TEXT NOT NULL, amount_cents INTEGER NOT NULL)"
)
ADD_TO_LEDGER: Final = (
    "INSERT INTO ledger (payment_id, customer, amount_cents)"
    " VALUES (:payment_id, :customer, :amount_cents)"
)


@handlers.on("payment.captured")
def captured(event: HandledEvent) -> list[Statement]:
    """The payment's ledger row, as a statement: the inbox runs it in the transaction
    that records the event, so the row and the record commit together or not at all.
    A handler writes nothing itself (no connection of its own, no call out)."""
    data = event.data
    cents = data.get("amount_cents")
    if not isinstance(cents, int) or cents <= 0:
        raise Reject("amount_cents must be a positive integer")  # answered 422
    row = {"payment_id": event.id, "customer": data["customer"], "amount_cents": cents}
    return [(ADD_TO_LEDGER, row)]


# ---------------------------------------------------------------- the app's own side

ENGINE: Final = web.AppKey("engine", sa.Engine)
BALANCES: Final = sa.text(
    "SELECT customer, COUNT(*), SUM(amount_cents) FROM ledger GROUP BY customer ORDER BY customer"
)


def create_consumer(db: str) -> web.Application:
    """The consumer's app: GET /ledger of its own, and the inbox at /outbox/ (POST
    /outbox/events and the inbox's other routes)."""
    app = web.Application()
    app.router.add_get("/ledger", get_ledger)

    async def ledger_reads(app: web.Application) -> AsyncIterator[None]:
        app[ENGINE] = sa.create_engine(sqlalchemy_url(db))
        yield
        app[ENGINE].dispose()

    app.cleanup_ctx.append(ledger_reads)
    app.add_subapp("/outbox/", create_app(db, handlers=handlers))
    return app


async def get_ledger(request: web.Request) -> web.Response:
    """Each customer's number of payments and total, as the ledger holds them."""
    return web.json_response(await asyncio.to_thread(balances, request.app[ENGINE]))


def balances(engine: sa.Engine) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(BALANCES).all()
    return {customer: {"payments": n, "total_cents": total} for customer, n, total in rows}


def sqlalchemy_url(db: str) -> sa.URL:
    """The services' --db value (a SQLite file, a postgresql:// URI) as SQLAlchemy's URL."""
    if db.startswith(("postgresql://", "postgres://")):
        return sa.make_url(db).set(drivername="postgresql+psycopg")
    return sa.URL.create("sqlite", database=db)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--db", required=True, help="a SQLite file or a postgresql:// URI")
    parser.add_argument("--port", type=int, default=8081, help="port on 127.0.0.1")
    args = parser.parse_args(argv)
    web.run_app(create_consumer(args.db), host=LOOPBACK, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
