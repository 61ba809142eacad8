"""Loopback checks, token loading and bearer comparison (plumbing.net)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing.net import (
    MIN_TOKEN_CHARS,
    TOKEN_ENV,
    TokenError,
    bearer_matches,
    is_loopback,
    load_token,
)

TOKEN = "s3cret-token-0123456789"
OTHER = "other-token-9876543210"


@pytest.fixture(autouse=True)
def no_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)


# ---------------------------------------------------------------- is_loopback


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST",
        "LocalHost",
        "127.0.0.1",
        "127.0.0.2",
        "127.1.2.3",
        "127.255.255.254",
        "::1",
        "[::1]",
        "0:0:0:0:0:0:0:1",
    ],
)
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host) is True


@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0",
        "::",
        "[::]",
        "",
        "10.0.0.1",
        "192.168.1.10",
        "128.0.0.1",
        "126.255.255.255",
        "::2",
        "example.com",
        "sink",
        "sink.invalid",
        "localhost.example.com",
        "127.0.0.1.example.com",
        "not an address",
    ],
)
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert is_loopback(host) is False


# ---------------------------------------------------------------- load_token


def write(tmp_path: Path, text: str, name: str = "token") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_token_from_file_is_stripped(tmp_path: Path) -> None:
    path = write(tmp_path, f"  {TOKEN}\n\n")
    assert load_token(str(path)) == TOKEN


def test_token_from_file_without_newline(tmp_path: Path) -> None:
    assert load_token(str(write(tmp_path, TOKEN))) == TOKEN


def test_token_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, f"{TOKEN}\n")
    assert load_token(None) == TOKEN


def test_file_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, OTHER)
    assert load_token(str(write(tmp_path, TOKEN))) == TOKEN


def test_a_bad_file_is_an_error_even_with_a_good_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, OTHER)
    with pytest.raises(TokenError):
        load_token(str(tmp_path / "missing"))


def test_missing_file_is_a_token_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    with pytest.raises(TokenError, match="no-such-token"):
        load_token(str(missing))


def test_a_directory_is_a_token_error(tmp_path: Path) -> None:
    with pytest.raises(TokenError):
        load_token(str(tmp_path))


def test_undecodable_file_is_a_token_error(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_bytes(b"\xff\xfe" + b"x" * 30)
    with pytest.raises(TokenError):
        load_token(str(path))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "short",
        "x" * (MIN_TOKEN_CHARS - 1),
        "abcdefgh ijklmnopq",
        "abcdefgh\tijklmnopq",
        "abcdefgh\nijklmnopq",
        "abcdefgh\x1b[31mijklmnopq",
        "abcdefgh\x7fijklmnopq",
        "abcdefgh\u200bijklmnopq",
    ],
)
def test_unusable_token_in_file(tmp_path: Path, text: str) -> None:
    with pytest.raises(TokenError) as raised:
        load_token(str(write(tmp_path, text)))
    if text.strip():
        assert text.strip() not in str(raised.value), "the error must not echo the secret"


@pytest.mark.parametrize(
    "text", ["short", "x" * (MIN_TOKEN_CHARS - 1), "abcdefgh ijklmnopq", "abcdefgh\tijklmnopq"]
)
def test_unusable_token_in_env(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(TOKEN_ENV, text)
    with pytest.raises(TokenError) as raised:
        load_token(None)
    assert text not in str(raised.value), "the error must not echo the secret"


def test_exactly_the_minimum_length_is_enough(tmp_path: Path) -> None:
    token = "y" * MIN_TOKEN_CHARS
    assert load_token(str(write(tmp_path, token))) == token


def test_neither_file_nor_env_gives_none() -> None:
    assert load_token(None) is None


@pytest.mark.parametrize("value", ["", "   ", "\n"])
def test_blank_env_counts_as_unset(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(TOKEN_ENV, value)
    assert load_token(None) is None


# ---------------------------------------------------------------- bearer_matches


@pytest.mark.parametrize(
    "header",
    [
        f"Bearer {TOKEN}",
        f"bearer {TOKEN}",
        f"BEARER {TOKEN}",
        f"BeArEr {TOKEN}",
        f"Bearer  {TOKEN}",
        f"Bearer {TOKEN} ",
    ],
)
def test_bearer_matches(header: str) -> None:
    assert bearer_matches(header, TOKEN) is True


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        TOKEN,
        f"Basic {TOKEN}",
        f"Token {TOKEN}",
        f"Bearer{TOKEN}",
        f"Bearer {OTHER}",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN}x",
        f"Bearer x{TOKEN}",
        f"Bearer {TOKEN.upper()}",
        f"Bearer {TOKEN} {TOKEN}",
        f"Bearer {TOKEN} extra",
        f"Bearers {TOKEN}",
        f"Bear {TOKEN}",
        f"X-Bearer {TOKEN}",
    ],
)
def test_bearer_does_not_match(header: str | None) -> None:
    assert bearer_matches(header, TOKEN) is False


def test_non_ascii_header_does_not_match_and_does_not_raise() -> None:
    assert bearer_matches(f"Bearer {TOKEN[:-1]}é", TOKEN) is False


@pytest.mark.parametrize(
    "raw",
    [b"Bearer \xff\xfe", b"Bearer " + TOKEN.encode()[:-1] + b"\xff", b"\xc3( " + TOKEN.encode()],
)
def test_bearer_with_bytes_that_are_not_utf8_does_not_match(raw: bytes) -> None:
    # aiohttp hands such a header over decoded with surrogateescape.
    header = raw.decode("utf-8", "surrogateescape")
    assert bearer_matches(header, TOKEN) is False


def test_bearer_with_a_lone_surrogate_does_not_match() -> None:
    assert bearer_matches("Bearer \ud800" + TOKEN, TOKEN) is False
