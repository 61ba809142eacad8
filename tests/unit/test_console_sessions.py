"""The console's sessions, pure: sign-in with the operator token, expiry, the cap on
sessions kept, the CSRF check and the operator names a record may carry."""

from __future__ import annotations

import pytest
from support import ManualClock

from publisher.console.sessions import (
    MAX_SESSIONS,
    BadOperator,
    Sessions,
    SignInError,
    csrf_matches,
    operator_name,
)

TOKEN = "operator-token-0123456789"


def test_a_session_is_found_until_it_expires() -> None:
    clock = ManualClock()
    sessions = Sessions(TOKEN, ttl_s=60.0, clock=clock)
    session = sessions.sign_in(TOKEN, "alice")
    assert sessions.find(session.id) == session and session.operator == "alice"
    clock.now += 59.9
    assert sessions.find(session.id) == session
    clock.now += 0.1
    assert sessions.find(session.id) is None
    assert sessions.find(None) is None and sessions.find("") is None


def test_each_sign_in_has_its_own_random_cookie_and_csrf_token() -> None:
    sessions = Sessions(TOKEN)
    one, two = sessions.sign_in(TOKEN), sessions.sign_in(TOKEN)
    assert len({one.id, one.csrf, two.id, two.csrf}) == 4
    assert all(len(value) >= 40 for value in (one.id, one.csrf))
    assert csrf_matches(one, one.csrf)
    assert not csrf_matches(one, two.csrf) and not csrf_matches(one, None)
    assert not csrf_matches(one, "") and not csrf_matches(one, "\udcff")


@pytest.mark.parametrize("offered", ["", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), None, 7, "\udcff"])
def test_anything_but_the_token_is_refused(offered: object) -> None:
    with pytest.raises(SignInError, match="wrong operator token"):
        Sessions(TOKEN).sign_in(offered)


def test_without_a_token_nobody_signs_in() -> None:
    sessions = Sessions(None)
    assert not sessions.actions_enabled
    with pytest.raises(SignInError, match="actions are off"):
        sessions.sign_in("")


def test_the_oldest_session_makes_room_past_the_cap() -> None:
    sessions = Sessions(TOKEN)
    first = sessions.sign_in(TOKEN)
    later = [sessions.sign_in(TOKEN) for _ in range(MAX_SESSIONS)]
    assert sessions.find(first.id) is None
    assert all(sessions.find(s.id) == s for s in later)


def test_sign_out_ends_a_session() -> None:
    sessions = Sessions(TOKEN)
    session = sessions.sign_in(TOKEN)
    sessions.sign_out(session.id)
    assert sessions.find(session.id) is None


@pytest.mark.parametrize(
    ("given", "name"), [(None, "console"), ("", "console"), ("  ", "console"), (" ann ", "ann")]
)
def test_operator_names(given: object, name: str) -> None:
    assert operator_name(given) == name


@pytest.mark.parametrize(
    "given", ["<img src=x>", "a" * 65, 5, "tab\there", "semi;colon", "lone\udcff", "nul\x00"]
)
def test_bad_operator_names_are_refused(given: object) -> None:
    with pytest.raises(BadOperator):
        operator_name(given)
