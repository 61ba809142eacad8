"""The console's JSON routes: sign-in, the views it reads, and the two actions.

Reads need no session (the console is read-only to anyone who can reach the
port, like GET /status), except the sink's inbox record of an event: the sink
guards it with its token, so the console shows it to a signed-in operator only.
Every POST but the sign-in needs a live session and its CSRF token
(X-CSRF-Token), checked before the body is read: 403, nothing changed. Failed
sign-ins slow their client down (publisher.console.throttle): 429 until it may
try again, the token not looked at.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeVar

from aiohttp import web

from plumbing.bodies import read_json
from plumbing.http_errors import BadRequest, error
from publisher.console.overview import read_overview
from publisher.console.sessions import (
    BadOperator,
    Session,
    Sessions,
    SignInError,
    csrf_matches,
)
from publisher.console.throttle import SignInThrottle, client_of
from publisher.errors import InvalidTransition, UnknownEntry
from publisher.http import HttpSender
from publisher.notes import BadNote, check_reason
from publisher.store import MAX_PAGE, NO_SEQ_ABOVE, Entry, Outbox, State
from publisher.trace import Proof, Stage, Trace, collect_trace
from shared import GLOBAL_LINE, InvalidEvent, validate_event_id, validate_key, validate_type

COOKIE: Final = "outbox_console"
CSRF_HEADER: Final = "X-CSRF-Token"
PAGE_SIZE: Final = 50
# A sign-in or a reason: small, but a reason of 500 characters written in escaped
# JSON (\uXXXX, twice for a character outside the BMP) takes 6000 bytes. The
# OpenAPI document says 16 KiB.
MAX_BODY_BYTES: Final = 16 * 1024


@dataclass(frozen=True)
class Source:
    """Where the console reads: the service's outbox, and its sender to ask the sink
    (None: the sink is not asked, and the trace says so). `sink_protected`: the sink
    answers its inbox records to its token only (the service sends one), so the
    console shows them to a signed-in operator only."""

    outbox: Callable[[], Outbox]
    sender: Callable[[], HttpSender | None]
    sink_protected: bool = True


T = TypeVar("T")
SOURCE: Final = web.AppKey("console_source", Source)
SESSIONS: Final = web.AppKey("console_sessions", Sessions)
THROTTLE: Final = web.AppKey("console_throttle", SignInThrottle)
COOKIE_SECURE: Final = web.AppKey("console_cookie_secure", bool)


def add_routes(app: web.Application, prefix: str) -> None:
    app.router.add_get(f"{prefix}/session", get_session)
    app.router.add_post(f"{prefix}/sign-in", post_sign_in)
    app.router.add_post(f"{prefix}/sign-out", post_sign_out)
    app.router.add_get(f"{prefix}/overview", get_overview)
    app.router.add_get(f"{prefix}/entries", get_entries)
    app.router.add_get(f"{prefix}/events/{{id}}", get_event)
    app.router.add_post(f"{prefix}/events/{{id}}/quarantine", post_quarantine)
    app.router.add_post(f"{prefix}/events/{{id}}/redrive", post_redrive)


def _outbox(request: web.Request) -> Outbox:
    return request.app[SOURCE].outbox()


# ---------------------------------------------------------------- sessions


def session_of(request: web.Request) -> Session | None:
    """The live session whose cookie the request carries, or None."""
    return request.app[SESSIONS].find(request.cookies.get(COOKIE))


def _acting(request: web.Request) -> Session:
    """The session of a state-changing request, or BadRequest 403 (nothing done)."""
    sessions = request.app[SESSIONS]
    if not sessions.actions_enabled:
        raise BadRequest(403, "forbidden", "actions are off: no operator token is configured")
    session = session_of(request)
    if session is None:
        raise BadRequest(403, "forbidden", "sign in first: no live console session")
    if not csrf_matches(session, request.headers.get(CSRF_HEADER)):
        raise BadRequest(403, "forbidden", f"missing or wrong {CSRF_HEADER} header")
    return session


def _session_body(sessions: Sessions, session: Session | None) -> dict[str, Any]:
    return {
        "actions_enabled": sessions.actions_enabled,
        "signed_in": session is not None,
        "operator": None if session is None else session.operator,
        "csrf_token": None if session is None else session.csrf,
    }


async def get_session(request: web.Request) -> web.Response:
    """Whether actions are possible and who is signed in (with the CSRF token the
    page sends back: only this session's own page can read it, the cookie being
    HttpOnly and the answer same-origin)."""
    return web.json_response(_session_body(request.app[SESSIONS], session_of(request)))


async def post_sign_in(request: web.Request) -> web.Response:
    """{"token": ..., "operator": ...}: sets the session cookie; 403 for a wrong token,
    429 (with Retry-After) while its client waits after too many of them."""
    sessions, throttle = request.app[SESSIONS], request.app[THROTTLE]
    client = client_of(request.remote)
    wait_s = throttle.wait_s(client)
    if wait_s > 0:
        return _throttled(wait_s)
    body = await read_json(request, MAX_BODY_BYTES)
    if not isinstance(body, dict):
        raise BadRequest(400, "invalid", "body must be a JSON object")
    try:
        session = sessions.sign_in(body.get("token"), body.get("operator"))
    except BadOperator as exc:  # the token was right: no failure to count
        raise BadRequest(400, "invalid", str(exc), field="operator") from exc
    except SignInError as exc:
        if sessions.actions_enabled:  # with no token there is nothing to guess
            throttle.failed(client)
        raise BadRequest(403, "forbidden", str(exc)) from exc
    throttle.succeeded(client)
    reply = web.json_response(_session_body(sessions, session))
    reply.set_cookie(
        COOKIE,
        session.id,
        path="/console",
        httponly=True,
        samesite="Strict",
        secure=request.app[COOKIE_SECURE],
        max_age=int(sessions.ttl_s),
    )
    return reply


def _throttled(wait_s: float) -> web.Response:
    seconds = math.ceil(wait_s)
    reply = error(429, f"too many wrong tokens from this address: try again in {seconds} s")
    reply.headers["Retry-After"] = str(seconds)
    return reply


async def post_sign_out(request: web.Request) -> web.Response:
    session = _acting(request)
    request.app[SESSIONS].sign_out(session.id)
    reply = web.json_response(_session_body(request.app[SESSIONS], None))
    reply.del_cookie(COOKIE, path="/console", secure=request.app[COOKIE_SECURE], samesite="Strict")
    return reply


# ---------------------------------------------------------------- reads


async def get_overview(request: web.Request) -> web.Response:
    return web.json_response(await read_overview(_outbox(request)))


class Page(NamedTuple):
    state: State
    limit: int
    after: int | None
    key: str | None
    type: str | None


def _page(query: Mapping[str, str]) -> Page:
    """state, limit, after, key and type of GET /console/api/entries (`sku` is taken
    as `key`, its name when every event was an order), or BadRequest 400."""
    try:
        state = State(query.get("state", State.PENDING.value))
    except ValueError:
        raise BadRequest(400, "invalid", "state must be pending, quarantined or sent") from None
    limit = _number(query, "limit", 1, MAX_PAGE)
    after = _number(query, "after", 0, NO_SEQ_ABOVE)
    key = query.get("key") or query.get("sku") or None
    if key is not None and key != GLOBAL_LINE:
        _checked_field(validate_key, key, "key")
    event_type = query.get("type") or None
    if event_type is not None:
        _checked_field(validate_type, event_type, "type")
    return Page(state, PAGE_SIZE if limit is None else limit, after, key, event_type)


def _checked_field(validate: Callable[[object], str], text: str, name: str) -> None:
    try:
        validate(text)
    except InvalidEvent as exc:
        raise BadRequest(400, "invalid", f"bad {name}: {exc.problem}", field=name) from exc


def _number(query: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    """The integer parameter `name` (None if absent or empty), or BadRequest 400."""
    text = query.get(name) or None
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise BadRequest(
            400, "invalid", f"{name} must be an integer from {low} to {high}", field=name
        )
    return int(text)


async def get_entries(request: web.Request) -> web.Response:
    """One page of entries in one state, optionally of one key and one type, or the one entry
    with `id`; `next_after` is the `after` of the next page (null: no more)."""
    outbox = _outbox(request)
    if request.query.get("id"):
        found = await outbox.entry(_checked_id(request.query["id"]))
        entries = [] if found is None else [found]
        return web.json_response({"entries": [e.to_dict() for e in entries], "next_after": None})
    page = _page(request.query)
    entries = await outbox.entries(
        page.state, page.limit, after=page.after, key=page.key, type=page.type
    )
    more = entries[-1].seq if len(entries) == page.limit else None
    return web.json_response({"entries": [e.to_dict() for e in entries], "next_after": more})


def _checked_id(text: str) -> str:
    try:
        return validate_event_id(text)
    except InvalidEvent as exc:
        raise BadRequest(400, "invalid", f"bad event ID: {exc.problem}", field="id") from exc


SINK_HIDDEN: Final = "sign in to see the sink's inbox record (the sink's token guards it)"
# A pending entry's later stages are not proven yet: while it waits its turn, no fault.
_LATER_STAGES: Final = frozenset({"received", "acknowledged", "marked"})
_NO_INBOX_ROW: Final = "the sink's inbox has no row"


async def get_event(request: web.Request) -> web.Response:
    """The trace of one event (as `publisher trace --json` gives it), its entry, and
    which of its stages only wait; 404 if the outbox holds neither its order nor its
    entry. The sink is asked for a signed-in operator only, while its token guards it."""
    event_id = _checked_id(request.match_info["id"])
    source = request.app[SOURCE]
    outbox = source.outbox()
    shown = not source.sink_protected or session_of(request) is not None
    trace = await collect_trace(outbox, event_id, source.sender() if shown else None)
    if not shown:
        trace = sink_hidden(trace)
    entry = await outbox.entry(event_id)
    if entry is None and trace.stages[0].proof is not Proof.PROVEN:
        return error(404, f"no order or outbox entry has ID {event_id!r}", id=event_id)
    body = {
        "trace": trace.to_dict(),
        "entry": None if entry is None else entry.to_dict(),
        "waiting_stages": waiting_stages(trace, entry),
    }
    return web.json_response(body)


def sink_hidden(trace: Trace) -> Trace:
    """`trace` with its "received" stage unknown: the sink was not asked."""
    hidden = Stage("received", Proof.UNKNOWN, SINK_HIDDEN)
    stages = [hidden if stage.name == "received" else stage for stage in trace.stages]
    return dataclasses.replace(trace, stages=stages)


def waiting_stages(trace: Trace, entry: Entry | None) -> list[str]:
    """The stages of `trace` not proven only because its entry is pending and waits its
    turn: the sink has no row of it yet, no ACK and no mark. An entry whose last send
    failed is not merely waiting, nor is another payload in the sink a wait."""
    if entry is None or entry.state is not State.PENDING or entry.last_error is not None:
        return []
    return [
        stage.name
        for stage in trace.stages
        if stage.proof is Proof.NOT_PROVEN
        and stage.name in _LATER_STAGES
        and (stage.name != "received" or stage.evidence.startswith(_NO_INBOX_ROW))
    ]


# ---------------------------------------------------------------- actions


async def post_quarantine(request: web.Request) -> web.Response:
    """{"reason": ...}: the CLI's `publisher quarantine`, by the signed-in operator."""
    session = _acting(request)
    event_id = _checked_id(request.match_info["id"])
    body = await read_json(request, MAX_BODY_BYTES)
    try:  # the CLI's rule: what every backend stores as given and every reader can show
        reason = check_reason(body.get("reason") if isinstance(body, dict) else None)
    except BadNote as exc:
        raise BadRequest(400, "invalid", exc.problem, field=exc.field) from exc
    await _act(_outbox(request).quarantine(event_id, reason, session.operator))
    return web.json_response({"id": event_id, "result": "quarantined", "by": session.operator})


async def post_redrive(request: web.Request) -> web.Response:
    """The CLI's `publisher redrive`, by the signed-in operator; the closed record."""
    session = _acting(request)
    event_id = _checked_id(request.match_info["id"])
    record = await _act(_outbox(request).redrive(event_id, session.operator))
    return web.json_response(
        {"id": event_id, "result": "redriven", "by": session.operator, "record": vars(record)}
    )


async def _act(operation: Awaitable[T]) -> T:
    """The store operation's result; its refusal as 404 (no such entry) or 409."""
    try:
        return await operation
    except UnknownEntry as exc:
        raise BadRequest(404, "unknown", str(exc)) from exc
    except InvalidTransition as exc:
        raise BadRequest(409, "conflict", str(exc)) from exc
