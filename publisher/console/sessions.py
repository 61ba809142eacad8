"""Who may act from the console: the operator token, sessions and their CSRF tokens.

The console is read-only until an operator signs in with the operator token. A
sign-in makes a session: a random ID sent as an HttpOnly, SameSite=Strict cookie,
and a CSRF token the page sends back in a header with every state-changing
request. Sessions live in this process's memory and expire; a restart signs
everyone out. Pure: the clock is a parameter, nothing here does I/O.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from publisher.notes import BadNote, check_operator

SESSION_TTL_S: Final = 8 * 3600.0  # a sign-in lasts a working day
MAX_SESSIONS: Final = 64  # more sign-ins than this push out the oldest session
DEFAULT_OPERATOR: Final = "console"


class SignInError(ValueError):
    """The sign-in was refused."""


class BadOperator(SignInError):
    """The operator name of a sign-in is not one a record may carry."""


@dataclass(frozen=True)
class Session:
    """One signed-in operator: the cookie's value, the CSRF token, the name that the
    quarantine records carry, and when (on the monotonic clock) it ends."""

    id: str
    csrf: str
    operator: str
    expires_at: float


def operator_name(given: object) -> str:
    """The operator name of a sign-in: "console" if empty or absent, else the name as
    publisher.notes keeps it (the CLI's `--by` rule); BadOperator if no record may
    carry it."""
    if given is None or (isinstance(given, str) and not given.strip()):
        return DEFAULT_OPERATOR
    try:
        return check_operator(given)
    except BadNote as exc:
        raise BadOperator(exc.problem) from exc


def same_secret(offered: str, expected: str) -> bool:
    """Constant-time comparison of two secrets (any text: lone surrogates included)."""
    return hmac.compare_digest(
        offered.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


class Sessions:
    """The signed-in sessions of one console. With no operator token, nobody can
    sign in and every action is refused."""

    def __init__(
        self,
        token: str | None,
        ttl_s: float = SESSION_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._token = token
        self._ttl_s = ttl_s
        self._clock = clock
        self._live: dict[str, Session] = {}

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    @property
    def actions_enabled(self) -> bool:
        return self._token is not None

    def sign_in(self, offered: object, operator: object = None) -> Session:
        """A new session if `offered` is the operator token; SignInError if not."""
        if self._token is None:
            raise SignInError("no operator token is configured: actions are off")
        if not isinstance(offered, str) or not same_secret(offered, self._token):
            raise SignInError("wrong operator token")
        session = Session(
            secrets.token_urlsafe(32),
            secrets.token_urlsafe(32),
            operator_name(operator),
            self._clock() + self._ttl_s,
        )
        self._expire()
        while len(self._live) >= MAX_SESSIONS:
            del self._live[next(iter(self._live))]  # the oldest sign-in
        self._live[session.id] = session
        return session

    def find(self, session_id: str | None) -> Session | None:
        """The live session with this cookie value, or None (unknown or expired)."""
        if not session_id:
            return None
        session = self._live.get(session_id)
        if session is None or session.expires_at <= self._clock():
            self._live.pop(session_id, None)
            return None
        return session

    def sign_out(self, session_id: str) -> None:
        self._live.pop(session_id, None)

    def _expire(self) -> None:
        now = self._clock()
        for session_id in [s.id for s in self._live.values() if s.expires_at <= now]:
            del self._live[session_id]


def csrf_matches(session: Session, header: str | None) -> bool:
    """Whether the request's CSRF header carries this session's token."""
    return header is not None and same_secret(header, session.csrf)
