"""The pure rules of the HTTP side: strict JSON, guard settings, parser phrases, the cap
(the Host rule: tests/unit/test_host_rule.py)."""

from __future__ import annotations

import resource

import pytest

from plumbing.bodies import DuplicateKey, loads_strict
from plumbing.host_guard import HttpGuard
from plumbing.http_limits import HttpLimits, connection_cap
from plumbing.protocol_errors import parser_detail
from shared.event import BigInteger


def test_loads_strict_is_json_loads_for_ordinary_bodies() -> None:
    body = b'{"id": "a", "sku": "s", "qty": 7, "nested": {"x": [1, 2.5, null, true]}}'
    assert loads_strict(body) == {
        "id": "a",
        "sku": "s",
        "qty": 7,
        "nested": {"x": [1, 2.5, None, True]},
    }


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (b'{"id": "a", "id": "b"}', "id"),
        (b'{"events": [{"qty": 1, "sku": "s", "qty": 2}]}', "qty"),
        (b'{"a": 1, "events": [], "events": []}', "events"),
    ],
)
def test_loads_strict_refuses_a_repeated_key_at_any_depth(body: bytes, key: str) -> None:
    with pytest.raises(DuplicateKey) as caught:
        loads_strict(body)
    assert caught.value.key == key


def test_loads_strict_keeps_a_huge_integer_as_a_marker() -> None:
    assert loads_strict(b'{"qty": -' + b"9" * 5000 + b"}") == {"qty": BigInteger(5000)}
    assert loads_strict(b"[" + b"9" * 100 + b"]") == [int("9" * 100)]


def test_guard_names_are_normalised() -> None:
    guard = HttpGuard.of([" Sink.Internal. ", ""], ["https://Ops.Example/", " "])
    assert guard == HttpGuard(frozenset({"sink.internal"}), frozenset({"https://ops.example"}))


@pytest.mark.parametrize(
    ("message", "detail"),
    [
        ("Duplicate Content-Length:\n\n  b'Content-Length: 4'", "Duplicate Content-Length"),
        ("Got more than 8190 bytes when reading: b'aaaa'", "Got more than 8190 bytes when reading"),
        ("Invalid method encountered:\n\n  b'FROB / HTTP/1.1'", "Invalid method encountered"),
        ("b'\\x00\\x01'", None),
        (None, None),
    ],
)
def test_parser_detail_never_carries_request_bytes(message: str | None, detail: str | None) -> None:
    assert parser_detail(message) == detail


def test_the_cap_fits_the_descriptor_limit() -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = connection_cap(HttpLimits(max_connections=10**9))
    assert cap <= soft - 2 * HttpLimits().backlog - 64 or soft == resource.RLIM_INFINITY
    assert connection_cap(HttpLimits(max_connections=5)) == 5
