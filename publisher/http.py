"""HTTP delivery: a reply counts only if it is a verified ACK for the event sent."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Final, Literal, Self

import aiohttp
from yarl import URL

from publisher.errors import DeliveryError, NotAcknowledged, Rejected
from publisher.targets import check_target
from shared import (
    FENCE_HEADER,
    FENCING_ENFORCED,
    FENCING_HEADER,
    Event,
    InvalidAck,
    payload_digest,
    verify_ack,
)
from shared.ack import check_ack, parse_reply

MAX_REPLY_BYTES: Final = 4096
FENCED_REPLIES_KEPT: Final = 4096  # requests whose reply's fencing header is remembered
CONNECT_TIMEOUT_S: Final = 3.0
TIMEOUT_S: Final = 10.0
# The sink refused the event itself: resending it unchanged cannot succeed.
PERMANENT_STATUSES: Final = frozenset({400, 409, 413})
ERROR_EXCERPT_CHARS: Final = 200


class HttpSender:
    """A reusable sender that owns a client session configured for evidence.

    With `token`, every request carries `Authorization: Bearer <token>`.

    `async with HttpSender(url) as send: await send(event)` returns True only for a
    verified ACK, and raises DeliveryError otherwise. The target is checked when the
    sender is made, before any connection. Redirects are never followed, proxy
    variables in the environment are ignored, cookies are not kept, replies are not
    decompressed and are read up to `max_reply_bytes` only.
    """

    def __init__(
        self,
        url: str,
        *,
        allowed_hosts: Iterable[str] = (),
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        timeout_s: float = TIMEOUT_S,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        token: str | None = None,
    ) -> None:
        self.url = check_target(url, allowed_hosts)
        self._auth = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._max_reply_bytes = max_reply_bytes
        self._session: aiohttp.ClientSession | None = None
        self._fencing = False
        # First event ID of a request -> whether its reply said the sink enforces
        # Outbox-After; the most recent FENCED_REPLIES_KEPT requests.
        self._fenced_replies: collections.OrderedDict[str, bool] = collections.OrderedDict()

    def fencing(self) -> bool:
        """Whether the sink's last reply, to any request, said it enforces
        Outbox-After (False before any reply)."""
        return self._fencing

    def fenced_reply(self, event_id: str) -> bool:
        """Whether the reply to the latest request that began with `event_id` said the
        sink enforces Outbox-After; False when no such reply came. A relay pipelines a
        line only while the reply of the request it has just taken said so: replies to
        other requests (other lanes, a process being replaced) do not count."""
        return self._fenced_replies.get(event_id, False)

    def _note_reply(self, event_id: str, fenced: bool) -> None:
        self._fencing = fenced
        self._fenced_replies[event_id] = fenced
        self._fenced_replies.move_to_end(event_id)
        if len(self._fenced_replies) > FENCED_REPLIES_KEPT:
            self._fenced_replies.popitem(last=False)

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

    async def deliver(self, event: Event, after: str | None = None) -> dict[str, object]:
        """Send one event and return the verified ACK, else raise DeliveryError.

        With `after` (pipelining: the event sent just before, whose ACK may not be back
        yet), the sink applies it only once `after` is in its inbox, else answers 412.
        """
        event_id = event["id"]
        body = json.dumps(event).encode()
        status, reply = await self._request("POST", self.url, event_id, body, after=after)
        return check_reply(status, reply, event_id, payload_digest(event))

    async def deliver_batch(
        self, events: Sequence[Event], after: str | None = None
    ) -> list[BatchResult]:
        """Send up to 16 events in one request (POST /events/batch).

        Returns one result per event for a verified prefix: the verified ACK, then at
        most one DeliveryError for the first event that has none. A request that fails
        as a whole raises DeliveryError. `after` as for `deliver`.
        """
        if not events:
            return []
        body = json.dumps({"events": list(events)}).encode()
        first = events[0]["id"]
        cap = self._max_reply_bytes * len(events)
        status, reply = await self._request(
            "POST", self.url / "batch", first, body, cap, after=after
        )
        return check_batch_reply(status, reply, events)

    async def lookup(self, event_id: str) -> dict[str, object] | None:
        """The sink's inbox record for `event_id` (GET /events/{id}), None if it has none."""
        status, reply = await self._request("GET", self.url / event_id, event_id)
        if status == 404:
            return None
        if status != 200:
            raise NotAcknowledged(f"{event_id}: inbox lookup answered {status}", status=status)
        try:
            record = json.loads(reply)
        except (ValueError, RecursionError) as exc:
            raise NotAcknowledged(f"{event_id}: inbox lookup reply is not JSON") from exc
        if not isinstance(record, dict) or record.get("id") != event_id:
            raise NotAcknowledged(f"{event_id}: inbox lookup names another event")
        return record

    async def _request(
        self,
        method: str,
        url: URL,
        event_id: str,
        body: bytes | None = None,
        cap: int = 0,
        after: str | None = None,
    ) -> tuple[int, bytes]:
        if self._session is None:
            raise RuntimeError("HttpSender is not open: use 'async with HttpSender(url)'")
        headers = {} if body is None else {"Content-Type": "application/json"}
        if after is not None:
            headers[FENCE_HEADER] = after
        try:
            return await self._exchange(
                self._session, method, url, event_id, body, cap or self._max_reply_bytes, headers
            )
        except TimeoutError as exc:
            raise DeliveryError(f"{event_id}: no reply in time ({type(exc).__name__})") from exc
        except aiohttp.ClientError as exc:
            raise DeliveryError(f"{event_id}: {type(exc).__name__}: {exc}") from exc

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
        async with session.request(
            method, url, data=body, headers=headers, allow_redirects=False
        ) as response:
            self._note_reply(event_id, response.headers.get(FENCING_HEADER) == FENCING_ENFORCED)
            if (response.content_length or 0) > cap:
                response.close()
                raise NotAcknowledged(
                    f"reply of {response.content_length} bytes is over the {cap}-byte cap",
                    status=response.status,
                )
            reply = await read_capped(response, cap)
            return response.status, reply


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
    status: int, reply: bytes, event_id: str, digest: str | None = None
) -> dict[str, object]:
    """Return the ACK if `status` and `reply` make a verified ACK for `event_id`, else raise.

    `digest` is the SHA-256 of the payload sent; an ACK that carries another is refused.
    """
    if status == 200:
        try:
            return verify_ack(reply, event_id, digest)
        except InvalidAck as exc:
            raise NotAcknowledged(f"{event_id}: {exc}", status=status) from exc
    excerpt = reply[:ERROR_EXCERPT_CHARS].decode("utf-8", "replace")
    if 300 <= status < 400:
        raise NotAcknowledged(f"{event_id}: redirect {status} is not followed", status=status)
    if status in PERMANENT_STATUSES:
        raise Rejected(f"{event_id}: sink rejected it with {status}: {excerpt}", status=status)
    raise NotAcknowledged(f"{event_id}: sink answered {status}: {excerpt}", status=status)


BatchResult = dict[str, object] | DeliveryError


def check_batch_reply(status: int, reply: bytes, events: Sequence[Event]) -> list[BatchResult]:
    """Verify a batch reply position by position. Pure.

    Each ACK must name the event sent at its position (and match its digest); the
    verified prefix ends at the first that does not, or where the ACKs end. The event
    after the prefix gets its error: Rejected if the sink said it refused that event
    (400, 409, 413), NotAcknowledged otherwise.
    """
    if status != 200:
        check_reply(status, reply, events[0]["id"])  # raises the same errors as one event
    try:
        parsed = parse_reply(reply)
    except InvalidAck as exc:
        raise NotAcknowledged(f"{events[0]['id']}: batch {exc}", status=status) from exc
    acks = parsed.get("acks") if isinstance(parsed, dict) else None
    if not isinstance(acks, list) or len(acks) > len(events):
        raise NotAcknowledged(f"{events[0]['id']}: batch reply has no valid acks list")
    results: list[BatchResult] = []
    for event, ack in zip(events, acks, strict=False):
        try:
            results.append(check_ack(ack, event["id"], payload_digest(event)))
        except InvalidAck as exc:
            results.append(NotAcknowledged(f"{event['id']}: {exc}", status=status))
            return results
    if len(results) < len(events):
        assert isinstance(parsed, dict)
        results.append(
            _batch_failure(events[len(results)]["id"], parsed.get("rejected"), len(results))
        )
    return results


def _batch_failure(event_id: str, rejected: object, index: int) -> DeliveryError:
    at = rejected.get("index") if isinstance(rejected, dict) else None
    if isinstance(rejected, dict) and type(at) is int and at == index:  # true is not 1
        status = rejected.get("status")
        if status in PERMANENT_STATUSES:
            excerpt = json.dumps(rejected)[:ERROR_EXCERPT_CHARS]
            return Rejected(f"{event_id}: sink rejected it with {status}: {excerpt}", status=status)
    return NotAcknowledged(f"{event_id}: no ACK in the batch reply")


async def send_http(url: str, event: Event, *, allowed_hosts: Iterable[str] = ()) -> Literal[True]:
    """Deliver one event with a one-off HttpSender; True for a verified ACK."""
    async with HttpSender(url, allowed_hosts=allowed_hosts) as send:
        return await send(event)
