"""publisher.event_check refuses a data limit no sink could take, when it is made,
rather than recording events that can never be delivered."""

from __future__ import annotations

import pytest

from publisher import event_check
from shared.event import MAX_DATA_BYTES_LIMIT

EVENT = {"id": "e-1", "type": "t.x", "key": "k", "data": {"a": 1}}


@pytest.mark.parametrize("limit", [0, -1, MAX_DATA_BYTES_LIMIT + 1, 10**9, "10", None, 1.5, True])
def test_a_data_limit_outside_what_a_sink_takes_is_refused(limit: object) -> None:
    with pytest.raises(ValueError, match="max_data_bytes must be an integer from 1 to"):
        event_check(limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [1, 7, MAX_DATA_BYTES_LIMIT])
def test_a_data_limit_within_it_is_taken(limit: int) -> None:
    check = event_check(limit)
    if limit >= 7:  # {"a":1}
        assert check(dict(EVENT))[0]["id"] == "e-1"
