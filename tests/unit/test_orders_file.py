"""The lines of an orders file as `publisher accept --file` reads them (no database)."""

from __future__ import annotations

import io

import pytest

from publisher.orders_file import TooLong, numbered_lines, parsed, what_failed
from shared import InvalidEvent, checked_event


def lines(data: bytes, most: int = 8) -> list[tuple[int, bytes | str]]:
    return [
        (n, f"too long: {text}" if isinstance(text, TooLong) else text)
        for n, text in numbered_lines(io.BytesIO(data), most)
    ]


def test_lines_keep_their_numbers_and_blank_ones_are_skipped() -> None:
    assert lines(b"a\n\n  \r\nb\r\nc") == [(1, b"a\n"), (4, b"b\r\n"), (5, b"c")]


def test_a_line_of_the_most_bytes_is_kept_and_one_more_is_too_long() -> None:
    assert lines(b"12345678\r\n123456789\nnext\n") == [
        (1, b"12345678\r\n"),
        (2, "too long: line is over 8 bytes"),
        (3, b"next\n"),
    ]


def test_an_overlong_line_is_read_past_whatever_its_length() -> None:
    data = b"x" * 200_000 + b"\nafter\n" + b"y" * 20
    assert lines(data) == [
        (1, "too long: line is over 8 bytes"),
        (2, b"after\n"),
        (3, "too long: line is over 8 bytes"),
    ]


def test_what_failed_names_the_column_within_the_line() -> None:
    assert parsed(b'{"id": 1}\n') == {"id": 1}
    failure = parsed(b'{"id": }\n')
    assert isinstance(failure, Exception)
    assert what_failed(failure) == "line is not valid JSON: Expecting value at column 8"


def test_what_failed_says_a_control_character_once() -> None:
    failure = parsed(b'{"id": "a\x1bb"}\n')
    assert isinstance(failure, Exception)
    assert what_failed(failure) == "line is not valid JSON: Invalid control character at column 10"


def test_what_failed_says_a_line_that_is_no_object_is_neither_kind() -> None:
    failure = parsed(b"[1, 2]\n")
    assert not isinstance(failure, Exception)
    with pytest.raises(InvalidEvent) as raised:
        checked_event(failure)
    assert what_failed(raised.value) == (
        "not an order or an event: an event must be a JSON object, not an array"
    )
