"""The cyclic garbage collector is held off while a body is parsed and its events
checked (plumbing.collector), and always let run again after."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from plumbing.bodies import loads_strict, parse_json
from plumbing.collector import SERVICE_YOUNG, collector_paused, service_collector
from publisher.metrics import PublisherMetrics
from sink.metrics import SinkMetrics


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_collector_is_off_in_the_block_and_on_after(collector_on: None) -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_is_on_again_after_a_block_that_raised(collector_on: None) -> None:
    with pytest.raises(ZeroDivisionError), collector_paused():
        1 / 0  # noqa: B018
    assert gc.isenabled()


def test_a_collector_its_owner_turned_off_stays_off(collector_on: None) -> None:
    gc.disable()
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block did not turn it on under the outer
    assert not gc.isenabled()


def test_a_large_body_is_parsed_with_one_collection_at_most(collector_on: None) -> None:
    # 500 events of nested data: thousands of containers. Read without the pause (the
    # control) they start a collection every 700; read as a request's body, at most
    # the one pass after the parse.
    item = {"id": "e-1", "type": "t", "data": {"a": [{"b": {"c": [1, 2]}} for _ in range(8)]}}
    body = json.dumps({"events": [item] * 500}).encode()
    assert len(_collections_while(lambda: loads_strict(body))) >= 5
    assert len(_collections_while(lambda: parse_json(body))) <= 1


def _collections_while(read: Callable[[], object]) -> list[int]:
    """The generations of the collections that started while `read` ran."""
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        parsed = read()
    finally:
        gc.callbacks.remove(count)
    assert isinstance(parsed, dict) and len(parsed["events"]) == 500
    return started


def test_a_service_freezes_what_exists_and_widens_the_young_generation() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    with pytest.raises(ZeroDivisionError), service_collector():
        assert gc.get_threshold() == (SERVICE_YOUNG, before[1], before[2])
        assert gc.get_freeze_count() > frozen
        1 / 0  # noqa: B018
    assert gc.get_threshold() == before  # put back, however the block ended
    assert gc.get_freeze_count() == 0 or frozen > 0


@pytest.mark.parametrize("metrics", [PublisherMetrics, SinkMetrics])
def test_the_collections_are_a_counter_by_generation(metrics: Any) -> None:
    registry = metrics().registry
    gc.collect(1)
    seen = registry.get_sample_value("python_gc_collections_total", {"generation": "1"})
    assert seen == gc.get_stats()[1]["collections"]
    assert registry.get_sample_value("python_gc_collections_total", {"generation": "2"}) is not None
