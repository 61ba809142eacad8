"""Loopback and bearer tokens: what both services need to stay safe by default."""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path
from typing import Final

LOOPBACK_NAMES: Final = frozenset({"localhost"})
TOKEN_ENV: Final = "OUTBOX_TOKEN"
INTAKE_TOKEN_ENV: Final = "OUTBOX_INTAKE_TOKEN"
MIN_TOKEN_CHARS: Final = 16


class TokenError(ValueError):
    """The shared secret could not be read or is not usable."""


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_token(token_file: str | None, env: str = TOKEN_ENV) -> str | None:
    """The shared secret: from `token_file` if given, else from `env` (OUTBOX_TOKEN),
    else None.

    Never from a command-line argument, where any user could read it in the process list.
    """
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenError(f"cannot read token file {token_file}: {exc}") from exc
        source = token_file
    else:
        token = os.environ.get(env, "").strip()
        source = env
        if not token:
            return None
    # A control character cannot go in a header: every request would fail to be sent.
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() or not c.isprintable() for c in token):
        raise TokenError(
            f"token from {source} must be at least {MIN_TOKEN_CHARS} characters,"
            " no spaces or control characters"
        )
    return token


def bearer_matches(header: str | None, token: str) -> bool:
    """Constant-time check of an `Authorization: Bearer <token>` header.

    aiohttp decodes header bytes as UTF-8 with surrogateescape, so a header that is
    not UTF-8 arrives with lone surrogates; `surrogatepass` turns any of them into
    bytes no UTF-8 token can equal, instead of raising.
    """
    scheme, _, presented = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        presented = ""
    offered = presented.strip().encode("utf-8", "surrogatepass")
    return hmac.compare_digest(offered, token.encode("utf-8", "surrogatepass"))
