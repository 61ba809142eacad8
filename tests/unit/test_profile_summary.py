"""The summary of py-spy's collapsed stacks that `python -m bench --profile` reports."""

from __future__ import annotations

from typing import Any

import pytest

from bench.procs import REPO_ROOT
from bench.profile import summarise

LINES = [
    # innermost frame last; the count after the last space
    "run (asyncio/runners.py:190);Application._handle (aiohttp/web_app.py:563) 6",
    "run (asyncio/runners.py:190);post_order (publisher/app.py:221) 3",
    "main (/usr/lib/python3.11/selectors.py:468) 2",
    f"x (/venv/lib/python3.11/site-packages/aiosqlite/core.py:63);y ({REPO_ROOT}/sink/app.py:9) 4",
    "Handle._run (asyncio/events.py:80);post_order (publisher/app.py:230) 1",
    "<native> 1",
    "",
    "not a sample line",
]


def test_shares_by_area_of_the_innermost_frame_and_top_functions() -> None:
    summary = summarise(LINES)
    assert summary["samples"] == 17
    assert summary["areas"] == pytest.approx(
        {
            "aiohttp": 6 / 17,
            "sink": 4 / 17,
            "publisher": 4 / 17,
            "selectors": 2 / 17,
            "other": 1 / 17,
        }
    )
    assert next(iter(summary["areas"])) == "aiohttp"  # most samples first
    top = {row["function"]: row["share"] for row in summary["top_functions"]}
    # one function wherever in it the sample was (the line is not part of it)
    assert top["post_order (publisher/app.py)"] == pytest.approx(4 / 17)
    assert top["y (sink/app.py)"] == pytest.approx(4 / 17)
    assert top["main (selectors.py)"] == pytest.approx(2 / 17)
    assert summary["top_functions"][0]["function"] == "Application._handle (aiohttp/web_app.py)"


def test_nothing_sampled_is_zero_samples_not_a_division_by_zero() -> None:
    assert summarise([]) == {"samples": 0, "areas": {}, "top_functions": []}


def test_the_servers_line_leaves_out_statements_that_took_no_measurable_time() -> None:
    from bench.report import _profiled

    def statement(database: str, exec_ms: float, plan_ms: float, query: str) -> dict[str, Any]:
        return {"database": database, "exec_ms": exec_ms, "plan_ms": plan_ms, "query": query}

    seen = {
        "statement_ms": 5.0,
        "calls": 3,
        "top_statements": [
            statement("source", 4.0, 1.0, "WITH x"),
            statement("sink", 0, 0, "BEGIN"),
        ],
    }
    line = _profiled("postgres", seen, {"orders": 10})
    assert line == (
        "pg_stat_statements: 0.500 ms in statements per order (3 calls); "
        "source 100% (plan 20%) WITH x..."
    )
    nothing = {"statement_ms": 0.0, "calls": 1, "top_statements": [statement("sink", 0, 0, "B")]}
    assert _profiled("postgres", nothing, {"orders": 10}).endswith("(1 calls)")
