"""HTTP delivery: a reply counts only if it is a verified ACK for the event sent."""

from __future__ import annotations

import collections
import datetime
import functools
import io
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Final, Literal, Self

import aiohttp
from yarl import URL

from plumbing.logs import Throttled
from publisher.errors import (
    DeliveryError,
    FencedBySink,
    NotAcknowledged,
    Rejected,
    TargetNotAllowed,
)
from publisher.targets import check_target
from shared import (
    LEASE_HEADER,
    MAX_BATCH_BODY_BYTES,
    PREDECESSOR_CHECK_ENFORCED,
    PREDECESSOR_CHECK_HEADER,
    PREDECESSOR_HEADER,
    Event,
    InvalidAck,
    Lease,
    payload_digest,
    verify_ack,
)
from shared.ack import check_ack, digest_of, parse_reply
from shared.cloudevents import (
    BATCHED,
    JSON,
    SOURCE_MAX_CHARS,
    STRUCTURED,
    batched,
    is_source,
    structured,
)
from shared.event import MAX_DATA_BYTES_LIMIT, canonical_parts, stored_data

MAX_REPLY_BYTES: Final = 4096
CHECKED_REPLIES_KEPT: Final = 4096  # requests whose reply's predecessor check is remembered
CONNECT_TIMEOUT_S: Final = 3.0
TIMEOUT_S: Final = 10.0
# The sink refused the event itself: resending it unchanged cannot succeed. 422: no
# handler takes the event's type, or its handler refused it (a handler that failed
# answers 503, which is retried).
PERMANENT_STATUSES: Final = frozenset({400, 409, 413, 422})
ERROR_EXCERPT_CHARS: Final = 200
# A sink's inbox record (GET /events/{id}) holds the event: for the largest event a
# sink takes, its data written as ASCII JSON (at most 3 bytes per byte of UTF-8, a
# character outside the Basic Multilingual Plane as two \u escapes), with room for
# the record's own fields. Far over an ACK's cap, which would leave a record of a
# few KB unread.
LOOKUP_REPLY_BYTES: Final = 3 * MAX_DATA_BYTES_LIMIT + 64 * 1024
# Raised before any reply came: the sink at that URL never answered this request, so
# another URL of the same cluster (same inbox) may be asked instead. A timeout while
# waiting for the reply is not among them: that sink may still be applying it.
UNREACHABLE: Final = (
    aiohttp.ClientConnectorError,  # refused, no route, name not resolved, TLS handshake
    aiohttp.ConnectionTimeoutError,  # connect timeout
    aiohttp.ServerDisconnectedError,  # closed before the status line
    aiohttp.ClientOSError,  # reset or broken pipe before the status line
)

# A sink that answers a batch with one of these takes no batches (an endpoint of
# another kind of consumer): its events go one per request from then on.
BATCHES_REFUSED: Final = frozenset({404, 405, 415})
TOO_LARGE: Final = 413  # a batch's body over the sink's cap: sent again in smaller ones
STREAMED_BODY_BYTES: Final = 2**20
DEFAULT_SOURCE: Final = "urn:outbox-relay:publisher"

log = logging.getLogger(__name__)


def _now() -> str:
    """The CloudEvents `time` of an event whose recording time is not known (one the
    caller's code hands the sender, not read from the outbox): now."""
    return _rfc3339(time.time())


def _time_of(event: Event, now: str) -> str:
    """The CloudEvents `time` of an event: when the outbox recorded it (the same on
    every resend), else `now`."""
    recorded_at = getattr(event, "recorded_at", None)
    return now if recorded_at is None else _rfc3339(recorded_at)


def _rfc3339(seconds: float) -> str:
    """RFC 3339, UTC, to the millisecond, of seconds since the epoch: the text
    datetime.fromtimestamp gives (microseconds rounded as it rounds them, then cut to
    milliseconds), with the whole second's text kept for the events around it (one
    strftime an event cost the relay about 2 us of its 50 an order)."""
    fraction, whole = math.modf(seconds)
    micros = round(fraction * 1_000_000)
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    elif micros < 0:  # before 1970
        whole, micros = whole - 1, micros + 1_000_000
    return f"{_second(int(whole))}.{micros // 1000:03d}Z"


@functools.lru_cache(maxsize=256)
def _second(whole: int) -> str:
    moment = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=whole)
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def _names(reply: bytes, event_id: str) -> bool:
    """Whether a reply is a JSON object whose `id` is `event_id`."""
    try:
        body = json.loads(reply)
    except (ValueError, RecursionError):
        return False
    return isinstance(body, dict) and body.get("id") == event_id


def _cuts(sizes: Sequence[int], most: int) -> list[int]:
    """Where to cut a batch of bodies of `sizes` bytes so that no request is over
    `most` (a body that alone is larger goes alone): the end index of each part."""
    ends: list[int] = []
    start = total = 0
    for index, size in enumerate(sizes):
        if index > start and total + size + 1 > most:
            ends.append(index)
            start, total = index, 0
        total += size + 1
    ends.append(len(sizes))
    return ends


OnFailover = Callable[[URL, URL], None]


class _Unreachable(Exception):
    """No reply came from a sink URL: the next one may be asked (internal)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class HttpSender:
    """A reusable sender that owns a client session configured for evidence.

    With `token`, every request carries `Authorization: Bearer <token>`.

    `async with HttpSender(url) as send: await send(event)` returns True only for a
    verified ACK, and raises DeliveryError otherwise. The target is checked when the
    sender is made, before any connection. Redirects are never followed, proxy
    variables in the environment are ignored, cookies are not kept, replies are not
    decompressed and are read up to `max_reply_bytes` only.

    `urls` is one URL or a sequence of them: the nodes of one sink cluster (one
    inbox), `HttpSender([a, b])`. Each is checked as a target (TargetNotAllowed for
    any, before anything is sent); a URL given twice counts once. A request goes to the
    URL that answered last (the first at the start); when that one cannot be reached
    (refused, reset or closed before any reply, connect timeout), the same request goes
    to the next, in order and wrapping, each URL at most once per call; when none
    answers, DeliveryError names them all. A reply, any status, is the sink's answer
    and is never sent elsewhere, nor is a request whose reply did not come in time.
    Each move to the next URL calls `on_failover(from_url, to_url)` and is logged
    (throttled); `failovers` counts them.
    """

    def __init__(
        self,
        urls: str | URL | Sequence[str | URL],
        *,
        allowed_hosts: Iterable[str] = (),
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        timeout_s: float = TIMEOUT_S,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        token: str | None = None,
        on_failover: OnFailover | None = None,
        source: str = DEFAULT_SOURCE,
        max_batch_body_bytes: int = MAX_BATCH_BODY_BYTES,
    ) -> None:
        self.urls = sink_urls(urls, allowed_hosts)
        # It never changes an event it is given: the relay hands it events as read.
        self.reads_events_only = True
        if not is_source(source):  # every event sent with it would be refused
            raise ValueError(f"source must be text of 1 to {SOURCE_MAX_CHARS} characters")
        self.source = source  # the CloudEvents `source` of every event sent
        self.max_batch_body_bytes = max_batch_body_bytes
        # Set once a sink answered 404, 405 or 415 to a batch: it takes none.
        self.one_per_request = False
        self._preferred = 0
        self._on_failover = on_failover
        self._failover_log = Throttled(log)
        self.failovers = 0
        self._auth = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._max_reply_bytes = max_reply_bytes
        self._session: aiohttp.ClientSession | None = None
        self._enforced = False
        # First event ID of a request -> whether its reply said the sink enforces the
        # predecessor check; the most recent CHECKED_REPLIES_KEPT requests.
        self._checked_replies: collections.OrderedDict[str, bool] = collections.OrderedDict()

    @property
    def url(self) -> URL:
        """The URL the next request goes to first: the one that answered last."""
        return self.urls[self._preferred]

    def enforces_predecessor_check(self) -> bool:
        """Whether the sink's last reply, to any request, said it enforces the
        predecessor check (False before any reply)."""
        return self._enforced

    def predecessor_checked(self, event_id: str | None) -> bool:
        """Whether the reply to the latest request that began with `event_id` said the
        sink enforces the predecessor check; False when no such reply came, and before
        any request (None). A relay pipelines a line only while the reply of the
        request it has just taken said so: replies to other requests (other lanes, a
        process being replaced) do not count."""
        return event_id is not None and self._checked_replies.get(event_id, False)

    def _note_reply(self, event_id: str, enforced: bool) -> None:
        self._enforced = enforced
        self._checked_replies[event_id] = enforced
        self._checked_replies.move_to_end(event_id)
        if len(self._checked_replies) > CHECKED_REPLIES_KEPT:
            self._checked_replies.popitem(last=False)

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=self._timeout,
            headers={"Accept-Encoding": "identity", **self._auth},
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __call__(self, event: Event) -> Literal[True]:
        """Send one event; True for a verified ACK, else DeliveryError."""
        await self.deliver(event)
        return True

    async def deliver(
        self, event: Event, after: str | None = None, lease: Lease | None = None
    ) -> dict[str, object]:
        """Send one event and return the verified ACK, else raise DeliveryError.

        With `after` (pipelining: the event sent just before, whose ACK may not be back
        yet), the sink's predecessor check applies it only once `after` is in its
        inbox, else answers 412.
        With `lease` (the line's lease this worker holds), the request carries
        `Outbox-Lease`; a sink that has seen a later epoch for the line applies nothing
        and answers 409, raised as FencedBySink.
        """
        event_id = event["id"]
        body, digest = self._wire(event, _now())
        status, reply = await self._request(
            "POST", "", event_id, body.encode(), after=after, lease=lease, media=STRUCTURED
        )
        return check_reply(status, reply, event_id, digest, lease)

    def _wire(self, event: Event, time: str) -> tuple[str, str]:
        """The event as a structured-mode CloudEvent (its `time` the recording time,
        or `time`, the send's, for an event not read from the outbox), and the digest of
        its canonical form (what the ACK must name). An event read from the outbox
        carries the canonical text it is stored as: its data is cut out of that text,
        and the digest is of it, so the relay neither parses nor writes the data."""
        canonical = getattr(event, "canonical", None)
        data_text = getattr(event, "data_text", None)  # cut out when the entry was read
        if data_text is None and canonical is not None:
            data_text = stored_data(event, canonical)
        if data_text is None or canonical is None:
            data_text, canonical = canonical_parts(event)
        body = structured(
            event["id"],
            event["type"],
            event.get("key"),
            data_text,
            self.source,
            _time_of(event, time),
        )
        return body, digest_of(canonical)

    async def deliver_batch(
        self, events: Sequence[Event], after: str | None = None, lease: Lease | None = None
    ) -> list[BatchResult]:
        """Send up to 16 events in one request (POST /events/batch).

        Returns one result per event for a verified prefix: the verified ACK, then at
        most one DeliveryError for the first event that has none. A request that fails
        as a whole raises DeliveryError (FencedBySink when the sink refused its lease:
        nothing of it was applied), unless the batch was cut in several requests (its
        size) and one before it was verified: then its failure ends the results.
        `after` and `lease` as for `deliver`.
        """
        if not events:
            return []
        if self.one_per_request:
            return await self._deliver_each(events, after, lease)
        now = _now()  # one request: one time for its events
        wired = [self._wire(event, now) for event in events]
        results: list[BatchResult] = []
        start = 0
        for end in _cuts([len(body) for body, _ in wired], self.max_batch_body_bytes):
            part = events[start:end]
            body = batched([body for body, _ in wired[start:end]]).encode()
            try:
                status, reply = await self._request(
                    "POST",
                    "batch",
                    part[0]["id"],
                    body,
                    self._max_reply_bytes * len(part),
                    after=after,
                    lease=lease,
                    media=BATCHED,
                )
                if start == 0 and status in BATCHES_REFUSED:
                    self._batches_refused(status)
                    return await self._deliver_each(events, after, lease)
                if status == TOO_LARGE and len(part) > 1:
                    # Its body was not read: it and the rest go again, in smaller batches.
                    self._batch_too_large(len(body))
                    return [*results, *await self.deliver_batch(events[start:], after, lease)]
                digests = [digest for _, digest in wired[start:end]]
                done = check_batch_reply(status, reply, part, lease, digests)
            except DeliveryError as exc:
                if not results:
                    raise
                return [*results, exc]  # a later part failed whole: the parts before stand
            results.extend(done)
            if len(done) < len(part) or any(isinstance(r, DeliveryError) for r in done):
                return results
            start, after = end, part[-1]["id"]
        return results

    def _batch_too_large(self, size: int) -> None:
        """The sink's body cap is under a batch of `size` bytes (a consumer whose
        framework caps bodies lower than a sink does): batches of at most half that
        from now on, halved again at each such answer, down to one event per request."""
        self.max_batch_body_bytes = min(self.max_batch_body_bytes, max(1, size // 2))
        log.warning(
            "sink %s answered 413 to a batch of %d bytes: batches of at most %d bytes from now on",
            self.url,
            size,
            self.max_batch_body_bytes,
            extra={"sink": str(self.url), "status": TOO_LARGE, "batch_bytes": size},
        )

    def _batches_refused(self, status: int) -> None:
        """The sink does not take batches: one event per request from now on."""
        self.one_per_request = True
        log.warning(
            "sink %s answered %d to a batch: delivering one event per request from now on",
            self.url,
            status,
            extra={"sink": str(self.url), "status": status},
        )

    async def _deliver_each(
        self, events: Sequence[Event], after: str | None, lease: Lease | None
    ) -> list[BatchResult]:
        """A batch's events one per request, in order, each naming the one before:
        the verified prefix, then the first failure."""
        results: list[BatchResult] = []
        for event in events:
            try:
                results.append(await self.deliver(event, after, lease))
            except DeliveryError as exc:
                if not results:
                    raise
                results.append(exc)
                return results
            after = event["id"]
        return results

    async def lookup(self, event_id: str) -> dict[str, object] | None:
        """The sink's inbox record for `event_id` (GET /events/{id}), None if it has none:
        a 404 whose JSON body names the event, as a sink's does. Any other 404 (a
        consumer of one's own that serves no such route), or a record without the
        digest of the event it holds (`sha256`), proves nothing: NotAcknowledged."""
        status, reply = await self._request("GET", event_id, event_id, cap=LOOKUP_REPLY_BYTES)
        if status == 404:
            if _names(reply, event_id):
                return None
            raise NotAcknowledged(
                f"{event_id}: inbox lookup answered 404 without naming the event"
                " (does the sink serve GET .../events/ID?)",
                status=status,
            )
        if status != 200:
            raise NotAcknowledged(f"{event_id}: inbox lookup answered {status}", status=status)
        try:
            record = json.loads(reply)
        except (ValueError, RecursionError) as exc:
            raise NotAcknowledged(f"{event_id}: inbox lookup reply is not JSON") from exc
        if not isinstance(record, dict) or record.get("id") != event_id:
            raise NotAcknowledged(f"{event_id}: inbox lookup names another event")
        if not isinstance(record.get("sha256"), str):
            # Not an inbox record as a sink answers it: what it holds is not said.
            raise NotAcknowledged(
                f"{event_id}: inbox lookup reply has no sha256 (the digest of the event"
                " stored), so it proves nothing"
            )
        return record

    async def _request(
        self,
        method: str,
        path: str,
        event_id: str,
        body: bytes | None = None,
        cap: int = 0,
        after: str | None = None,
        lease: Lease | None = None,
        media: str = JSON,
    ) -> tuple[int, bytes]:
        """Send to the preferred URL (`path` below it), then to the next ones while
        none of them can be reached; the first reply is returned."""
        if self._session is None:
            raise RuntimeError("HttpSender is not open: use 'async with HttpSender(url)'")
        headers = request_headers(body is not None, after, lease, media)
        cap = cap or self._max_reply_bytes
        unreachable: list[tuple[URL, _Unreachable]] = []
        for index in failover_order(self._preferred, len(self.urls)):
            base = self.urls[index]
            if unreachable:
                self._failed_over(*unreachable[-1], base)
            target = base / path if path else base
            try:
                reply = await self._exchange(
                    self._session, method, target, event_id, body, cap, headers
                )
            except _Unreachable as exc:
                unreachable.append((base, exc))
                continue
            except TimeoutError as exc:
                raise DeliveryError(f"{event_id}: no reply in time ({type(exc).__name__})") from exc
            except aiohttp.ClientError as exc:
                raise DeliveryError(f"{event_id}: {type(exc).__name__}: {exc}") from exc
            self._preferred = index
            return reply
        raise _none_reachable(event_id, unreachable) from unreachable[-1][1].cause

    def _failed_over(self, source: URL, why: _Unreachable, target: URL) -> None:
        self.failovers += 1
        if self._on_failover is not None:
            self._on_failover(source, target)
        self._failover_log.warning(
            ("failover", str(source), str(target)),
            "sink %s cannot be reached (%s): sending to %s",
            source,
            why,
            target,
            extra={"sink": str(source), "next_sink": str(target)},
        )

    async def _exchange(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: URL,
        event_id: str,
        body: bytes | None,
        cap: int,
        headers: dict[str, str],
    ) -> tuple[int, bytes]:
        answered = False
        # A body over 1 MiB goes as a stream, which aiohttp writes in chunks with the
        # loop free between them (as bytes it would write it at once, and warn).
        data = io.BytesIO(body) if body is not None and len(body) > STREAMED_BODY_BYTES else body
        try:
            async with session.request(
                method, url, data=data, headers=headers, allow_redirects=False
            ) as response:
                answered = True
                return await self._read(response, event_id, cap)
        except UNREACHABLE as exc:
            if answered:
                raise
            raise _Unreachable(exc) from exc

    async def _read(
        self, response: aiohttp.ClientResponse, event_id: str, cap: int
    ) -> tuple[int, bytes]:
        said = response.headers.get(PREDECESSOR_CHECK_HEADER)
        self._note_reply(event_id, said == PREDECESSOR_CHECK_ENFORCED)
        if (response.content_length or 0) > cap:
            response.close()
            raise NotAcknowledged(
                f"reply of {response.content_length} bytes is over the {cap}-byte cap",
                status=response.status,
            )
        reply = await read_capped(response, cap)
        return response.status, reply


def sink_urls(
    urls: str | URL | Sequence[str | URL], allowed_hosts: Iterable[str]
) -> tuple[URL, ...]:
    """The checked URLs of one sink cluster, in order, each once; TargetNotAllowed for
    the first that is not allowed, or when none is given. Pure."""
    given = [urls] if isinstance(urls, str | URL) else list(urls)
    if not given:
        raise TargetNotAllowed("no sink URL given")
    hosts = tuple(allowed_hosts)
    return tuple(dict.fromkeys(check_target(url, hosts) for url in given))


def failover_order(first: int, count: int) -> list[int]:
    """The URL indexes one request tries: `first`, then the next ones, wrapping. Pure."""
    return [(first + step) % count for step in range(count)]


def request_headers(
    has_body: bool, after: str | None, lease: Lease | None, media: str = JSON
) -> dict[str, str]:
    """The headers of one request beyond the session's. Pure."""
    headers = {"Content-Type": media} if has_body else {}
    if after is not None:
        headers[PREDECESSOR_HEADER] = after
    if lease is not None:
        headers[LEASE_HEADER] = lease.header()
    return headers


def _none_reachable(event_id: str, unreachable: list[tuple[URL, _Unreachable]]) -> DeliveryError:
    if len(unreachable) == 1:  # one URL: the error as it always read
        return DeliveryError(f"{event_id}: {unreachable[0][1]}")
    tried = "; ".join(f"{url}: {why}" for url, why in unreachable)
    return DeliveryError(f"{event_id}: no sink URL could be reached: {tried}")


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """Read at most cap+1 bytes of the body; more than `cap` is a failure."""
    data = bytearray()
    while len(data) <= cap:
        chunk = await response.content.read(cap + 1 - len(data))
        if not chunk:
            return bytes(data)
        data += chunk
    # An endless body ends here: drop the connection instead of draining it.
    response.close()
    raise NotAcknowledged(f"reply is over the {cap}-byte cap", status=response.status)


def check_reply(
    status: int,
    reply: bytes,
    event_id: str,
    digest: str | None = None,
    lease: Lease | None = None,
) -> dict[str, object]:
    """Return the ACK if `status` and `reply` make a verified ACK for `event_id`, else raise.

    `digest` is the SHA-256 of the payload sent; an ACK that carries another is refused.
    A 409 that says "fenced" refused the request's `lease` (FencedBySink); any other
    409 refused the event itself (Rejected).
    """
    if status == 200:
        try:
            return verify_ack(reply, event_id, digest)
        except InvalidAck as exc:
            raise NotAcknowledged(f"{event_id}: {exc}", status=status) from exc
    excerpt = reply[:ERROR_EXCERPT_CHARS].decode("utf-8", "replace")
    if 300 <= status < 400:
        raise NotAcknowledged(f"{event_id}: redirect {status} is not followed", status=status)
    if status == 409:
        fenced = _fenced(_json_object(reply))
        if fenced is not None:
            raise fenced_by_sink(event_id, fenced, lease)
    if status in PERMANENT_STATUSES:
        raise Rejected(f"{event_id}: sink rejected it with {status}: {excerpt}", status=status)
    raise NotAcknowledged(f"{event_id}: sink answered {status}: {excerpt}", status=status)


def fenced_by_sink(
    event_id: str, fenced: dict[str, object], lease: Lease | None
) -> NotAcknowledged:
    """The error of a request the sink refused for its lease epoch (nothing applied).
    Pure. Without a lease sent, the refusal answers nothing this request said: not a
    verified reply, to be sent again (the event itself was not refused)."""
    seen = fenced.get("seen")
    if lease is None:
        return NotAcknowledged(
            f"{event_id}: sink refused a lease epoch this request did not carry", status=409
        )
    if type(seen) is not int:  # true is not 1
        why = f"it refused {event_id}: a later epoch has been seen"
        return FencedBySink(lease.line, lease.epoch, why)
    why = f"it refused {event_id}: epoch {seen} has been seen"
    return FencedBySink(lease.line, lease.epoch, why, seen=seen)


def _json_object(reply: bytes) -> dict[str, object] | None:
    try:
        parsed = json.loads(reply)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _fenced(body: dict[str, object] | None) -> dict[str, object] | None:
    fenced = None if body is None else body.get("fenced")
    return fenced if isinstance(fenced, dict) else None


BatchResult = dict[str, object] | DeliveryError


def check_batch_reply(
    status: int,
    reply: bytes,
    events: Sequence[Event],
    lease: Lease | None = None,
    digests: Sequence[str] | None = None,
) -> list[BatchResult]:
    """Verify a batch reply position by position. Pure.

    Each ACK must name the event sent at its position (and match its digest); the
    verified prefix ends at the first that does not, or where the ACKs end. The event
    after the prefix gets its error: FencedBySink if the sink refused `lease` there,
    Rejected if the sink said it refused that event (400, 409, 413, 422), NotAcknowledged
    otherwise. A reply that is not 200 fails the request as a whole, as `check_reply`.
    """
    if status != 200:
        check_reply(status, reply, events[0]["id"], lease=lease)  # the errors of one event
    try:
        parsed = parse_reply(reply)
    except InvalidAck as exc:
        raise NotAcknowledged(f"{events[0]['id']}: batch {exc}", status=status) from exc
    acks = parsed.get("acks") if isinstance(parsed, dict) else None
    if not isinstance(acks, list) or len(acks) > len(events):
        raise NotAcknowledged(f"{events[0]['id']}: batch reply has no valid acks list")
    if digests is None:
        digests = [payload_digest(event) for event in events]
    results: list[BatchResult] = []
    for event, ack, digest in zip(events, acks, digests, strict=False):
        try:
            results.append(check_ack(ack, event["id"], digest))
        except InvalidAck as exc:
            results.append(NotAcknowledged(f"{event['id']}: {exc}", status=status))
            return results
    if len(results) < len(events):
        assert isinstance(parsed, dict)
        at = events[len(results)]["id"]
        results.append(_batch_failure(at, parsed.get("rejected"), len(results), lease))
    return results


def _batch_failure(
    event_id: str, rejected: object, index: int, lease: Lease | None
) -> DeliveryError:
    at = rejected.get("index") if isinstance(rejected, dict) else None
    if isinstance(rejected, dict) and type(at) is int and at == index:  # true is not 1
        status = rejected.get("status")
        fenced = _fenced(rejected)
        if status == 409 and fenced is not None:
            return fenced_by_sink(event_id, fenced, lease)
        excerpt = json.dumps(rejected)[:ERROR_EXCERPT_CHARS]
        if status in PERMANENT_STATUSES:
            return Rejected(f"{event_id}: sink rejected it with {status}: {excerpt}", status=status)
        if type(status) is int:  # a 503 (its handler failed, say): said, and retried
            return NotAcknowledged(f"{event_id}: sink answered {status}: {excerpt}", status=status)
    return NotAcknowledged(f"{event_id}: no ACK in the batch reply")


async def send_http(url: str, event: Event, *, allowed_hosts: Iterable[str] = ()) -> Literal[True]:
    """Deliver one event with a one-off HttpSender; True for a verified ACK."""
    async with HttpSender(url, allowed_hosts=allowed_hosts) as send:
        return await send(event)
