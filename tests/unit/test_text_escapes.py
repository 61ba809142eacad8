"""Text from outside as a terminal and the text log show it: `escaped` and the text
formatter. Pure: a formatter, a record, a string."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from plumbing.cli import CommandFormatter, JsonFormatter, TextFormatter, escaped

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# No lone surrogate here (the parametrized case has one): pytest-xdist cannot carry
# a report holding one from its worker.
REPLY = "down\r\n2026-01-01T00:00:00.000Z INFO publisher.relay: forged\x1b[2J\x07\u202e"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\r\nb", "a\\r\\nb"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
        ("tab\there\x00\x7f\x85\x9b", "tab\\there\\x00\\x7f\\x85\\x9b"),
        ("\u2028\u2029\u202e\u2066\u200b\ufeff", "\\u2028\\u2029\\u202e\\u2066\\u200b\\ufeff"),
        ("lone \udcff", "lone \\udcff"),
        # Shown as nothing: the soft hyphen, a combining grapheme joiner, a Hangul
        # filler, a variation selector, tag characters (default ignorable code points).
        (
            "[\xad][\u034f][\u3164][\ufe0f][\U000e0041\U000e007f]",
            "[\\xad][\\u034f][\\u3164][\\ufe0f][\\U000e0041\\U000e007f]",
        ),
    ],
)
def test_what_a_terminal_would_act_on_is_written_as_an_escape(text: str, shown: str) -> None:
    assert escaped(text) == shown
    assert escaped(shown) == shown  # once is enough: an escape is plain text


def test_text_a_person_reads_is_kept_as_it_is() -> None:
    text = 'order-1: sink answered 503: {"error": "busy"} é 日本 \\n'
    assert escaped(text) == text


@pytest.fixture
def logger() -> Iterator[tuple[logging.Logger, io.StringIO, io.StringIO]]:
    text, lines = io.StringIO(), io.StringIO()
    handlers = [logging.StreamHandler(text), logging.StreamHandler(lines)]
    handlers[0].setFormatter(TextFormatter(TEXT_FORMAT))
    handlers[1].setFormatter(JsonFormatter())
    log = logging.getLogger("test_text_escapes")
    log.handlers[:] = handlers
    log.setLevel(logging.DEBUG)
    log.propagate = False
    yield log, text, lines
    log.handlers.clear()
    log.propagate = True


def test_a_sinks_reply_in_a_message_or_a_field_stays_on_its_lines_own(
    logger: tuple[logging.Logger, io.StringIO, io.StringIO],
) -> None:
    log, text, lines = logger
    log.warning("relay step failed: %s", REPLY, extra={"error": REPLY, "event_id": "o-1"})

    [line] = text.getvalue().splitlines()
    assert line.count("\\r\\n2026-01-01T00:00:00.000Z") == 2
    assert "forged\\x1b[2J\\x07\\u202e" in line and "event_id=o-1" in line
    assert not any(c in line for c in "\r\x1b\x07\u202e")
    [entry] = [json.loads(one) for one in lines.getvalue().splitlines()]
    assert entry["error"] == REPLY  # JSON keeps the text as it came, escaped by JSON


def test_a_traceback_follows_indented_so_no_line_of_it_reads_as_a_record(
    logger: tuple[logging.Logger, io.StringIO, io.StringIO],
) -> None:
    log, text, _ = logger
    try:
        raise OSError(f"sink said {REPLY}\n2026-01-01T00:00:00.000Z ERROR forged: next")
    except OSError:
        log.exception("relay step failed", extra={"event_id": "o-1"})

    first, *trace = text.getvalue().splitlines()
    assert first.endswith("ERROR test_text_escapes: relay step failed event_id=o-1")
    assert trace[0] == "  Traceback (most recent call last):"
    assert all(line.startswith("  ") for line in trace), trace
    assert any(line == "  2026-01-01T00:00:00.000Z ERROR forged: next" for line in trace)
    assert not any(c in text.getvalue() for c in "\r\x1b\x07")


def test_a_one_shot_commands_warning_is_one_escaped_line_that_names_the_program() -> None:
    record = logging.LogRecord("sqlite_tx.database", logging.WARNING, "", 0, "%s", (REPLY,), None)

    [line] = CommandFormatter("outbox-publisher").format(record).splitlines()

    assert line.startswith("outbox-publisher: warning: down\\r\\n2026")
    assert not any(c in line for c in "\r\x1b\x07\u202e")
