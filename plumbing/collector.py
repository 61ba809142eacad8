"""Python's cyclic garbage collector held off while a request's events are read and
checked: collector_paused.

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
