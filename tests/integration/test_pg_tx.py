"""pg_tx on the session's throwaway server: what the services' SQL relies on from it
beyond the behaviour suites (statements sent with their transaction as one message)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pg_tx import array_literal, in_one_round_trip
from plumbing.pgserver import ThrowawayServer

# Text PostgreSQL can hold: any character UTF-8 can encode (no lone surrogates) but
# NUL, quotes, backslashes, braces, commas, blanks and the word NULL among them.
texts = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
) | st.sampled_from(["NULL", "null", '"', "\\", "{}", "a,b", " ", "", '\\"'])


@pytest.fixture(scope="module")
def conn(pg_server: ThrowawayServer) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    with psycopg.connect(pg_server.url(), autocommit=True) as connection:
        yield connection


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(texts | st.none(), max_size=8))
def test_a_text_array_literal_reads_back_as_the_same_list(
    conn: psycopg.Connection[tuple[Any, ...]], values: list[str | None]
) -> None:
    row = conn.execute("SELECT %s::text[]", (array_literal(values),)).fetchone()
    assert row is not None and row[0] == values


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=6),
    st.lists(st.booleans() | st.none(), max_size=6),
)
def test_number_and_boolean_array_literals_read_back_as_the_same_lists(
    conn: psycopg.Connection[tuple[Any, ...]],
    ints: list[int],
    floats: list[float],
    bools: list[bool | None],
) -> None:
    query = "SELECT %s::bigint[], %s::float8[], %s::boolean[]"
    row = conn.execute(query, tuple(map(array_literal, (ints, floats, bools)))).fetchone()
    assert row is not None and row[0] == ints and row[2] == bools
    assert all(
        math.isclose(a, b, rel_tol=0, abs_tol=0) for a, b in zip(row[1], floats, strict=True)
    )


def test_an_array_literal_refuses_what_it_cannot_write() -> None:
    for bad in ([math.nan], [math.inf], [b"bytes"], [{"a": 1}]):
        with pytest.raises(TypeError):
            array_literal(bad)  # type: ignore[arg-type]


async def test_list_parameters_of_a_one_message_transaction_arrive_as_arrays(
    pg_server: ThrowawayServer,
) -> None:
    values = ['a"b', "c\\d", None, "NULL", "{x,y}"]
    async with await psycopg.AsyncConnection.connect(pg_server.url()) as conn:
        row = await in_one_round_trip(
            conn, b"SELECT %(texts)s::text[], %(n)s::bigint", {"texts": values, "n": 7}
        )
        assert row == (values, 7)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize("wait_ms", [0, 5000], ids=["ending", "ended"])
async def test_leaving_a_pipeline_on_a_lost_connection_puts_no_driver_text_in_the_log(
    pg_server: ThrowawayServer, caplog: pytest.LogCaptureFixture, wait_ms: int
) -> None:
    # The server ends the connection while a block in pipeline mode fails: psycopg
    # then warns that leaving the pipeline failed too, with the server's words, or
    # that libpq could not leave pipeline mode when the end came while results were
    # due ("ending": the block fails before the backend is gone; "ended": after). The
    # block's own error is what the services raise (and translate); the warnings are
    # filtered out at pg_tx's import. The connection is then closed as the services'
    # pool closes one it cannot reuse: the block's error is not swallowed with the
    # connection still open (psycopg would then COMMIT on a session stuck in
    # pipeline mode).
    from pg_tx import close_quietly  # the filter is installed on import

    caplog.set_level(logging.WARNING, logger="psycopg")
    for _ in range(5):  # the two ways it ends are a race: a few rounds meet both
        conn = await psycopg.AsyncConnection.connect(pg_server.url())
        try:
            pid = conn.info.backend_pid
            with pytest.raises(RuntimeError):
                async with conn.pipeline():
                    await conn.execute("SELECT 1")
                    pg_server.sql(f"SELECT pg_terminate_backend({pid}, {wait_ms})")
                    raise RuntimeError("the block failed")
        finally:
            await close_quietly(conn)
    assert not [r for r in caplog.records if r.name == "psycopg"], caplog.text


def test_the_log_filter_drops_both_warnings_psycopg_logs_on_leaving_a_failed_pipeline() -> None:
    # The "exiting" warning needs the server's FATAL read before its end of the
    # connection: a race the test above meets only under load. So the filter is also
    # held to the driver's own words, in the modules that log them, and to what it
    # keeps.
    from pathlib import Path

    from psycopg import _pipeline_async, _pipeline_base

    from pg_tx.driver_log import QuietAbortedPipeline

    logged = {
        "error ignored terminating %r: %s": Path(_pipeline_async.__file__).read_text(),
        "error ignored exiting %r: %s": Path(_pipeline_base.__file__).read_text(),
    }
    quiet = QuietAbortedPipeline()
    for message, source in logged.items():
        assert f'"{message}"' in source, message
        record = logging.LogRecord("psycopg", logging.WARNING, "", 0, message, ("p", "e"), None)
        assert not quiet.filter(record), message
    kept = "error ignored in rollback on %s: %s"  # psycopg's own, not a pipeline's
    assert quiet.filter(logging.LogRecord("psycopg", logging.WARNING, "", 0, kept, (), None))
