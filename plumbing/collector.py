"""Python's cyclic garbage collector held off while a request's events are read and
checked (collector_paused), and set for a service (service_collector). Its counts are
prometheus_client's GCCollector, registered by each service's metrics.

Reading a batch body makes thousands of containers at once (500 events of nested
data), all alive until the batch is answered. With the collector running, each 700
of them start a collection that walks the young ones again, and the survivors pile
up into full collections of the whole heap: about a tenth of the CPU a 1 KiB event
costs at intake. Held off for the parse and the checks (synchronous code, no await,
a few milliseconds), the collector makes one pass afterwards instead.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Final


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector for the block (which must not await),
    and let it run again after, however the block ends. When the collector is
    already off (by its owner, or an enclosing block), it is left as it is."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# A service's young generation: containers made (and not yet freed) between two
# collections. Python's default, 700, starts one every few events of a batch while
# they are all still alive, walks them, and moves them to the older generations,
# whose collections walk them again; a request's containers are freed when it is
# answered, so with room for the requests in flight most never meet a collection.
SERVICE_YOUNG: Final = 20_000


@contextlib.contextmanager
def service_collector() -> Iterator[None]:
    """The collector as a long-running service wants it, for the block: what exists
    at the start (modules, the app, its routes; what startup made) is frozen out of
    every collection (gc.freeze), and the young generation takes SERVICE_YOUNG
    containers. Both are put back on the way out (a process that froze objects
    itself keeps them frozen)."""
    young, middle, old = gc.get_threshold()
    frozen_before = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVICE_YOUNG, middle, old)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)
        if not frozen_before:  # a freeze of the process's own is left as it is
            gc.unfreeze()
