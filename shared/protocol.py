"""The protocol between publisher and sink beyond the event itself: the routes' limits,
the headers of the predecessor check that pipelined delivery relies on, and the
lease a request of a leased line carries (fencing by epoch)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from shared.event import MAX_DATA_BYTES_LIMIT

# A batch holds 1 to MAX_BATCH events: the most the publisher reads for one dispatch
# and the most the sink's batch route takes in one request.
MAX_BATCH: Final = 16
# One event's request: room for the largest data any publisher may allow
# (--max-data-bytes up to 1 MiB), its envelope and some escaping.
MAX_BODY_BYTES: Final = MAX_DATA_BYTES_LIMIT + 64 * 1024
# One batch request: the relay cuts a batch where its body would pass this (an event
# that alone is larger goes alone, as a batch of one).
MAX_BATCH_BODY_BYTES: Final = 2 * MAX_BODY_BYTES

# The predecessor check: a pipelined request names the last event of the request
# sent just before it, and the sink applies nothing of it unless that event is in its
# inbox (else 412).
PREDECESSOR_HEADER: Final = "Outbox-After"
# Every reply of a sink that enforces the predecessor check says so in this header
# (its name on the wire predates the name of the check); a publisher keeps several
# requests in flight only after such a reply (a sink that ignores the header could
# apply a request whose predecessor failed).
PREDECESSOR_CHECK_HEADER: Final = "Outbox-Fencing"
PREDECESSOR_CHECK_ENFORCED: Final = "enforced"

# Several relay workers on one outbox: each line (the one global line, or one key's
# lane) is delivered only by the worker holding its lease, and every takeover raises
# the line's epoch (a fencing token). Each request of a leased line carries
# `Outbox-Lease: SOURCE LINE EPOCH`; the sink refuses (409, nothing applied), in the
# transaction of the apply, a request whose epoch is below one it has already seen
# for that source and line. SOURCE names the outbox (every worker of one outbox
# sends the same), so lines of two publishers never meet.
LEASE_HEADER: Final = "Outbox-Lease"
GLOBAL_LINE: Final = "*"  # the line of global order; a lane is named by its key
MAX_EPOCH: Final = 2**63 - 1
_NAME: Final = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_LINE: Final = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # an ordering key
_EPOCH: Final = re.compile(r"[1-9][0-9]{0,18}")


@dataclass(frozen=True)
class Lease:
    """What a request of a leased line says of its lease: the outbox it comes from,
    the line, and the epoch its worker holds the line under."""

    source: str
    line: str
    epoch: int

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.source):
            raise ValueError(f"lease source {self.source!r} is not 1-64 of A-Z a-z 0-9 . _ : -")
        if self.line != GLOBAL_LINE and not _LINE.fullmatch(self.line):
            raise ValueError(f"lease line {self.line!r} is neither {GLOBAL_LINE!r} nor a key")
        if not 1 <= self.epoch <= MAX_EPOCH:
            raise ValueError(f"lease epoch {self.epoch} is not between 1 and {MAX_EPOCH}")

    def header(self) -> str:
        return f"{self.source} {self.line} {self.epoch}"


def parse_lease(value: str) -> Lease:
    """The Lease a header value names; ValueError saying what is wrong otherwise."""
    parts = value.split(" ")
    if len(parts) != 3:
        raise ValueError(f"{LEASE_HEADER} must be 'SOURCE LINE EPOCH', got {value[:80]!r}")
    source, line, epoch = parts
    if not _EPOCH.fullmatch(epoch):
        raise ValueError(f"{LEASE_HEADER} epoch {epoch[:24]!r} is not a positive integer")
    return Lease(source, line, int(epoch))
