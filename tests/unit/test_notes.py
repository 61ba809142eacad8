"""An operator's reason and name: one rule for the CLI and the console."""

from __future__ import annotations

import re

import pytest

from publisher.notes import MAX_REASON_CHARS, BadNote, check_operator, check_reason


def test_a_reason_is_kept_stripped() -> None:
    assert check_reason("  the sink refuses it: bad sku  ") == "the sink refuses it: bad sku"
    assert check_reason("é" * MAX_REASON_CHARS) == "é" * MAX_REASON_CHARS


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("", "1 to 500"),
        ("   ", "1 to 500"),
        ("x" * (MAX_REASON_CHARS + 1), "1 to 500"),
        ("nul\x00here", "U+0000 at character 4"),
        ("two\r\nlines", "U+000D at character 4"),
        ("esc \x1b[31mred", "U+001B at character 5"),
        ("lone \ud800", "U+D800 at character 6"),
        (None, "must be a string"),
        (42, "must be a string"),
    ],
)
def test_a_reason_no_record_may_carry_is_refused(given: object, problem: str) -> None:
    with pytest.raises(BadNote, match=re.escape(problem)) as refused:
        check_reason(given)
    assert refused.value.field == "reason"


def test_an_operator_name_follows_one_rule() -> None:
    assert check_operator(" ops@example.org ") == "ops@example.org"
    for bad in ("", "a" * 65, "name\nforged", "émile", 7):
        with pytest.raises(BadNote, match="operator must be") as refused:
            check_operator(bad)
        assert refused.value.field == "operator"
