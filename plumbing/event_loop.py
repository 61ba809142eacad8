"""Which event loop a command runs on: uvloop where it is installed, asyncio's own otherwise.

Both services spend most of their time in the event loop's I/O and scheduling (HTTP in,
HTTP out, database round trips); uvloop does that work in C. Its gain on one order per
request is measured in the README's end-to-end section. `--event-loop asyncio` (or
OUTBOX_EVENT_LOOP=asyncio) keeps the standard library's loop, e.g. to rule the loop out
when chasing a problem.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

UVLOOP: Final = "uvloop"
ASYNCIO: Final = "asyncio"
CHOICES: Final = (UVLOOP, ASYNCIO)

T = TypeVar("T")


class LoopUnavailable(Exception):
    """The event loop asked for cannot be had on this installation."""


def default_loop() -> str:
    """uvloop when it can be imported (every platform it is built for), else asyncio."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return ASYNCIO
    return UVLOOP


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """The name, among CHOICES, of the loop actually running (not of the one asked for)."""
    return UVLOOP if type(loop).__module__.split(".")[0] == UVLOOP else ASYNCIO


def run(main: Coroutine[Any, Any, T], name: str) -> T:
    """asyncio.run(main) on the loop `name`; LoopUnavailable (main closed unrun) if it
    cannot be had."""
    try:
        factory = _factory(name)
    except LoopUnavailable:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def _factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == ASYNCIO:
        return None  # the Runner's own choice: asyncio's default loop
    if name != UVLOOP:
        raise LoopUnavailable(f"unknown event loop {name!r}: one of {', '.join(CHOICES)}")
    try:
        import uvloop
    except ImportError as exc:
        raise LoopUnavailable(
            f"uvloop cannot be imported here ({exc}): install it, or say --event-loop asyncio"
        ) from None
    new_event_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return new_event_loop
