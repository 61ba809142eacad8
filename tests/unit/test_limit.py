"""The batch limit: check_limit. Pure."""

from __future__ import annotations

import pytest

from publisher.store import check_limit
from shared import MAX_BATCH


def test_max_batch_is_16() -> None:
    assert MAX_BATCH == 16


@pytest.mark.parametrize("limit", [1, 2, 15, 16])
def test_limits_from_1_to_16_are_returned(limit: int) -> None:
    assert check_limit(limit) == limit


@pytest.mark.parametrize("limit", [0, 17, -1, 1000, True, False, 1.0, 16.0, "16", None, [1]])
def test_other_limits_are_value_errors(limit: object) -> None:
    with pytest.raises(ValueError, match="limit"):
        check_limit(limit)


def test_an_explicit_upper_bound_is_honoured() -> None:
    assert check_limit(4, most=4) == 4
    with pytest.raises(ValueError):
        check_limit(5, most=4)
