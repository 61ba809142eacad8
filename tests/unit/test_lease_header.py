"""The Outbox-Lease header's value: `SOURCE LINE EPOCH`, parsed and written."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import GLOBAL_LINE, LEASE_HEADER, Lease, parse_lease, validate_key
from shared.event import KEY_MAX_CHARS
from shared.protocol import MAX_EPOCH

KEY_ALPHABET = string.ascii_letters + string.digits + "._:-"


@pytest.mark.parametrize(
    ("value", "lease"),
    [
        ("a1b2c3d4e5f60718 * 1", Lease("a1b2c3d4e5f60718", GLOBAL_LINE, 1)),
        ("outbox-a tea 42", Lease("outbox-a", "tea", 42)),
        ("s.o_u:r-ce SKU-9.x_y:z 7", Lease("s.o_u:r-ce", "SKU-9.x_y:z", 7)),
        ("outbox -:._ 3", Lease("outbox", "-:._", 3)),  # a key may start with any of them
        (f"{'s' * 64} {'l' * 64} {MAX_EPOCH}", Lease("s" * 64, "l" * 64, MAX_EPOCH)),
        (f"outbox {'l' * 65} 1", Lease("outbox", "l" * 65, 1)),
        (f"outbox {'k' * 128} 1", Lease("outbox", "k" * 128, 1)),
    ],
)
def test_a_valid_value_parses_and_is_written_back_the_same(value: str, lease: Lease) -> None:
    assert parse_lease(value) == lease
    assert lease.header() == value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "must be 'SOURCE LINE EPOCH'"),
        ("outbox * ", "not a positive integer"),
        ("outbox *", "must be 'SOURCE LINE EPOCH'"),
        ("outbox * 1 2", "must be 'SOURCE LINE EPOCH'"),
        ("outbox  * 1", "must be 'SOURCE LINE EPOCH'"),  # two spaces
        ("outbox\t*\t1", "must be 'SOURCE LINE EPOCH'"),
        ("outbox * 0", "not a positive integer"),
        ("outbox * -1", "not a positive integer"),
        ("outbox * 01", "not a positive integer"),
        ("outbox * +1", "not a positive integer"),
        ("outbox * 1.0", "not a positive integer"),
        ("outbox * 1e3", "not a positive integer"),
        ("outbox * ٣", "not a positive integer"),  # a digit, but not ASCII
        (f"outbox * {MAX_EPOCH + 1}", "not between 1 and"),
        ("outbox * 99999999999999999999", "not a positive integer"),  # 20 digits
        ("out/box * 1", "lease source"),
        (f"{'s' * 65} * 1", "lease source"),
        ("outbox ** 1", "neither '*' nor a key"),
        ("outbox t/ea 1", "neither '*' nor a key"),
        (f"outbox {'l' * 129} 1", "neither '*' nor a key"),
        ("outbox *a 1", "neither '*' nor a key"),
        ("outbox é 1", "neither '*' nor a key"),
    ],
)
def test_an_invalid_value_raises_value_error_naming_the_problem(value: str, problem: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_lease(value)
    assert problem in str(raised.value)


def test_the_message_of_a_long_bad_value_is_bounded() -> None:
    with pytest.raises(ValueError) as raised:
        parse_lease("x " * 10_000)
    assert LEASE_HEADER in str(raised.value)
    assert len(str(raised.value)) < 200


@pytest.mark.parametrize(
    ("source", "line", "epoch"),
    [
        ("", "*", 1),
        ("ok", "", 1),
        ("ok", "*", 0),
        ("ok", "*", MAX_EPOCH + 1),
        ("a b", "*", 1),
        ("ok", "a b", 1),
        ("ok", "k" * 129, 1),
    ],
)
def test_a_lease_refuses_fields_the_header_could_not_carry(
    source: str, line: str, epoch: int
) -> None:
    with pytest.raises(ValueError):
        Lease(source, line, epoch)


@given(line=st.text(alphabet=KEY_ALPHABET, min_size=1, max_size=KEY_MAX_CHARS))
def test_every_valid_ordering_key_is_a_lease_line(line: str) -> None:
    # A lane is named by its key: every key an event may carry must fit in the header.
    assert validate_key(line) == line
    lease = Lease("outbox", line, 9)
    assert parse_lease(lease.header()) == lease


def test_the_line_error_names_a_key_not_a_sku() -> None:
    with pytest.raises(ValueError) as raised:
        Lease("outbox", "é", 1)
    assert str(raised.value) == "lease line 'é' is neither '*' nor a key"
