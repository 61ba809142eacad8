"""How a line's requests reach the sink: the sender's callables, as one SendUnit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from publisher.driver import Result
from publisher.errors import DeliveryError
from shared import Event, Lease


class Deliver(Protocol):
    """Sends one event and returns the verified ACK, else raises DeliveryError
    (HttpSender.deliver). `after` is passed only to fence a pipelined request,
    `lease` only for a line held under a lease (FencedBySink when the sink refuses
    its epoch)."""

    def __call__(
        self, event: Event, /, after: str | None = ..., lease: Lease | None = ...
    ) -> Awaitable[Mapping[str, object]]: ...


class DeliverBatch(Protocol):
    """Sends events in one request (HttpSender.deliver_batch): verified ACKs, then at
    most one error. `after` and `lease` as for Deliver."""

    def __call__(
        self, events: Sequence[Event], /, after: str | None = ..., lease: Lease | None = ...
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

    async def send(
        self, events: list[Event], after: str | None, lease: Lease | None = None
    ) -> Sequence[Result]:
        """One request (a SendUnit): the batch, or its one event. `after` and `lease`
        are passed only when given, so a plain sender that takes neither still works
        for a line that has no fence and no lease."""
        options = request_options(after, lease)
        if self.deliver_batch is not None:
            return await self.deliver_batch(events, **options)
        return [await self.deliver(events[0], **options)]


def request_options(after: str | None, lease: Lease | None) -> dict[str, Any]:
    """The keyword arguments of one call: only those given. Pure."""
    options: dict[str, Any] = {}
    if after is not None:
        options["after"] = after
    if lease is not None:
        options["lease"] = lease
    return options
