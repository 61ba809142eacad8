"""Chaos for the publisher: `--chaos exit-after-ack[=N]` installs this hook.

It is an after-delivery hook like any other: the relay and dispatch run it after a
verified ACK and before the mark, which is exactly where the crash is meant to land.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from plumbing.cli import CHAOS_EXIT_STATUS


def exit_after_ack(count: int = 1) -> Callable[[str], None]:
    """Chaos hook: end the process between the `count`th verified ACK and its mark."""
    seen = 0

    def hook(event_id: str) -> None:
        nonlocal seen
        seen += 1
        if seen < count:
            return
        print(
            f"chaos: ACK verified for {event_id}, exiting with status {CHAOS_EXIT_STATUS}"
            " before the mark",
            file=sys.stderr,
            flush=True,
        )
        os._exit(CHAOS_EXIT_STATUS)  # no finally, no close: a crash at exactly this point

    return hook
