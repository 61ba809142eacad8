"""Posting a run's items to the publisher as a client does: again after a lost reply
or a 503, and generic events next to each other together in one POST /events/batch."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from chaos.feed import MAX_PER_BATCH, Item
from chaos.procs import ChaosError, Service, http_json

POST_ATTEMPTS: Final = 200
RETRY_PAUSE_S: Final = 0.05
# An outage of the PostgreSQL server: intake answers 503 meanwhile; the item is
# posted again (as a client would) until the server is back and accepts it.
UNAVAILABLE: Final = 503
RECORDED: Final = ("accepted", "duplicate")  # a retry after a lost reply is a duplicate


class Publishers(Protocol):
    """What intake needs of the run's cluster: a publisher to post to, and a way to
    bring back whatever has died when none answers."""

    def intake(self, rng: random.Random) -> Service: ...

    def revive(self) -> list[tuple[str, int]]: ...


@dataclass
class Intake:
    """POST /orders, /events and /events/batch, each again after a lost reply or a 503.

    `check`, if given, is called before every attempt with what is being posted (the
    run's time bound)."""

    cluster: Publishers
    check: Callable[[str], None] | None = None
    unavailable: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random("intake"))
    batch: list[Item] = field(default_factory=list)  # generic events waiting to go together
    posts: dict[str, int] = field(default_factory=dict)  # requests recorded, by path

    def add(self, item: Item) -> None:
        """Post `item`, or keep it for the batch being gathered: everything gathered
        before it is posted first, so items reach the outbox in feed order."""
        if item.batched:
            self.batch.append(item)
            if len(self.batch) >= MAX_PER_BATCH:
                self.flush()
            return
        self.flush()
        if not self.post(item):
            raise ChaosError(f"intake never accepted {item.id}")

    def flush(self) -> None:
        """Post the gathered events: one POST /events/batch (POST /events for one)."""
        batch, self.batch = self.batch, []
        if len(batch) == 1 and not self.post(batch[0]):
            raise ChaosError(f"intake never accepted {batch[0].id}")
        if len(batch) > 1 and not self._post("/events/batch", {"events": [i.body for i in batch]}):
            raise ChaosError(f"intake never accepted {batch[0].id} to {batch[-1].id}")

    def post(self, item: Item, attempts: int = POST_ATTEMPTS) -> bool:
        """True once the intake recorded `item` (201, or 200 for a duplicate); False
        if it still answers 503 after `attempts`."""
        path = "/orders" if item.order is not None else "/events"
        return self._post(path, item.body, attempts)

    def _post(self, path: str, body: dict[str, Any], attempts: int = POST_ATTEMPTS) -> bool:
        what = str(body.get("id", f"{len(body.get('events', []))} events"))
        for _ in range(attempts):
            if self.check is not None:
                self.check(f"while posting {what}")
            url = f"{self.cluster.intake(self.rng).base_url}{path}"
            try:
                code, reply = http_json("POST", url, body, ascii_only=path != "/events")
            except OSError:
                self.cluster.revive()
                time.sleep(RETRY_PAUSE_S)
                continue
            if code == UNAVAILABLE and isinstance(reply, dict) and "error" in reply:
                self.unavailable += 1
                time.sleep(RETRY_PAUSE_S)
                continue
            if code in (200, 201) and recorded(path, reply):
                self.posts[path] = self.posts.get(path, 0) + 1
                return True
            raise ChaosError(f"intake refused {what}: {code} {reply}")
        return False


def recorded(path: str, reply: object) -> bool:
    """Whether a 200 or 201 reply says every event was recorded: a batch's reply
    lists each event's result."""
    if not path.endswith("/batch"):
        return True
    results = reply.get("results") if isinstance(reply, dict) else None
    return isinstance(results, list) and all(
        isinstance(r, dict) and r.get("result") in RECORDED for r in results
    )
