"""The handler registry of a chaos run that counts effects (`--handlers
chaos.handlers:EFFECTS`): the built-in warehouse's effect on the inventory, and one
row in `chaos_effects` for every event applied, with no key that would refuse a
second one, so that the verdict can count each event's effects (none: lost; two:
applied twice) through the handler path itself, not only the inbox's rows."""

from __future__ import annotations

from typing import Final

from shared.event import placed_order
from sink.handlers import ADD_TO_INVENTORY, HandledEvent, Handlers, Statement

SPEC: Final = "chaos.handlers:EFFECTS"  # what `--handlers` names it by
EFFECTS_TABLE: Final = "chaos_effects"
RECORD: Final = f"INSERT INTO {EFFECTS_TABLE} (event_id, type) VALUES (:id, :type)"

EFFECTS: Final = Handlers("chaos")
EFFECTS.schema(f"CREATE TABLE {EFFECTS_TABLE} (event_id TEXT NOT NULL, type TEXT NOT NULL)")


@EFFECTS.otherwise
def recorded(event: HandledEvent) -> list[Statement]:
    """Every event: one effect row; an order also adds to its SKU's inventory."""
    effect: list[Statement] = [(RECORD, {"id": event.id, "type": event.type})]
    order = placed_order({"id": event.id, "type": event.type, "data": event.data})
    if order is not None:
        effect.append((ADD_TO_INVENTORY, {"sku": order["sku"], "qty": order["qty"]}))
    return effect
