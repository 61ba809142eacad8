"""The protocol between publisher and sink beyond the event itself: the routes' limits
and the headers that pipelined delivery relies on."""

from __future__ import annotations

from typing import Final

# A batch holds 1 to MAX_BATCH events: the most the publisher reads for one dispatch
# and the most the sink's batch route takes in one request.
MAX_BATCH: Final = 16
MAX_BODY_BYTES: Final = 16 * 1024  # one event (or one order at intake)
MAX_BATCH_BODY_BYTES: Final = 64 * 1024  # one batch request

# A pipelined request names the last event of the request sent just before it; the
# sink applies nothing of it unless that event is in its inbox (else 412).
FENCE_HEADER: Final = "Outbox-After"
# Every reply of a sink that enforces FENCE_HEADER says so; a publisher keeps several
# requests in flight only after such a reply (a sink that ignores the header could
# apply a request whose predecessor failed).
FENCING_HEADER: Final = "Outbox-Fencing"
FENCING_ENFORCED: Final = "enforced"
