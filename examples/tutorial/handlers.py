"""The tutorial's consumer: what a `payment.captured` event does at the sink.

Serve it with `outbox-sink --db sink.db --handlers examples.tutorial.handlers:handlers`
from the repository's root (the current directory is on the import path). Each
captured payment becomes one row of `captured_payments` and adds to its customer's row
of `customer_totals`, in the transaction that records the event in the inbox. The
statements run the same on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from sink import HandledEvent, Handlers, Reject, Statement

# The currencies this consumer books. The producer's schema allows any three-letter
# code: a payment in another currency is refused here, and its line stops.
BOOKED_CURRENCIES = ("EUR", "USD")

handlers = Handlers("tutorial-payments")
handlers.schema(
    "CREATE TABLE IF NOT EXISTS captured_payments ("
    " event_id TEXT PRIMARY KEY,"
    " customer TEXT NOT NULL,"
    " amount_cents BIGINT NOT NULL,"
    " currency TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS customer_totals ("
    " customer TEXT NOT NULL,"
    " currency TEXT NOT NULL,"
    " total_cents BIGINT NOT NULL,"
    " PRIMARY KEY (customer, currency))",
)


@handlers.on("payment.captured")
def captured(event: HandledEvent) -> list[Statement]:
    """One payment row and the customer's new total; Reject for what is not booked."""
    if event.key is None:
        raise Reject("a payment needs the customer as its key")
    # The publisher's schema checks both fields, but only where it is given one:
    # a payment without them is refused here too, not retried as a failure.
    currency = event.data.get("currency")
    if currency not in BOOKED_CURRENCIES:
        raise Reject(f"currency {currency} is not booked here")
    amount = event.data.get("amount_cents")
    if type(amount) is not int or amount < 1:
        raise Reject("a payment needs amount_cents, a whole number above 0")
    return [
        (
            "INSERT INTO captured_payments (event_id, customer, amount_cents, currency)"
            " VALUES (:event_id, :customer, :amount, :currency)",
            {"event_id": event.id, "customer": event.key, "amount": amount, "currency": currency},
        ),
        (
            "INSERT INTO customer_totals (customer, currency, total_cents)"
            " VALUES (:customer, :currency, :amount)"
            " ON CONFLICT (customer, currency)"
            " DO UPDATE SET total_cents = customer_totals.total_cents + excluded.total_cents",
            {"customer": event.key, "currency": currency, "amount": amount},
        ),
    ]
