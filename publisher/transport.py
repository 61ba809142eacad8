"""How a line's requests reach the sink: the sender's callables, as one SendUnit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from publisher.driver import Result
from publisher.errors import DeliveryError
from shared import Event


class Deliver(Protocol):
    """Sends one event and returns the verified ACK, else raises DeliveryError
    (HttpSender.deliver). `after` is passed only to fence a pipelined request."""

    def __call__(
        self, event: Event, /, after: str | None = ...
    ) -> Awaitable[Mapping[str, object]]: ...


class DeliverBatch(Protocol):
    """Sends events in one request (HttpSender.deliver_batch): verified ACKs, then at
    most one error. `after` as for Deliver."""

    def __call__(
        self, events: Sequence[Event], /, after: str | None = ...
    ) -> Awaitable[Sequence[Mapping[str, object] | DeliveryError]]: ...


@dataclass(frozen=True)
class Transport:
    """The sender's callables: one request per event, or per batch with
    `deliver_batch`; `fenced` (HttpSender.fenced_reply) says whether the reply to a
    request said the sink enforces Outbox-After."""

    deliver: Deliver
    deliver_batch: DeliverBatch | None = None
    fenced: Callable[[str], bool] | None = None

    @property
    def batches(self) -> bool:
        return self.deliver_batch is not None

    async def send(self, events: list[Event], after: str | None) -> Sequence[Result]:
        """One request (a SendUnit): the batch, or its one event. Without a fence the
        callables are called without `after`, as a plain sender expects."""
        if self.deliver_batch is not None:
            if after is None:
                return await self.deliver_batch(events)
            return await self.deliver_batch(events, after=after)
        if after is None:
            return [await self.deliver(events[0])]
        return [await self.deliver(events[0], after=after)]
