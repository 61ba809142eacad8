"""`python -m sink` refusing a --db it cannot open: main() called in-process, with
the environment and working directory a child process of the end-to-end tests gets.

A location no backend opens (another scheme, a PostgreSQL URI libpq would refuse, a
SQLite URL that names a host or no file) is one line on stderr and exit status 2,
before anything is created or logged; a PostgreSQL server that cannot be reached is
one line and status 1. Reading the current directory afterwards shows nothing was
created.

`--chaos` is read the same way: a value it does not take is one line and status 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing.cli import EXIT_FAILED, EXIT_USAGE
from sink.chaos import Chaos, parse_chaos
from sink.cli import main

REFUSED = [
    "mysql://u@h/db",
    "ftp://warehouse@db.internal/sink",
    "postgresql://u@h/db?no_such_parameter=1",
    "postgres://warehouse@db.internal:5432/sink?pool_max=many",
    "sqlite://warehouse/inbox.db",
    "sqlite:",
    "",
]

pytestmark = pytest.mark.usefixtures("like_a_child_process")


def assert_one_line_refusal(capsys: pytest.CaptureFixture[str], cwd: Path, *words: str) -> None:
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("outbox-sink: ")
    for word in words:
        assert word in err
    assert list(cwd.iterdir()) == [], "nothing is created for a refused location"


@pytest.mark.parametrize("location", REFUSED)
def test_a_db_url_no_backend_opens_is_one_line_and_status_2(
    location: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--db", location, "--port", "0"]) == EXIT_USAGE == 2

    assert_one_line_refusal(capsys, tmp_path)


def test_another_scheme_names_what_is_supported_instead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--db", "mysql://u@h/db", "--port", "0"]) == 2

    assert_one_line_refusal(capsys, tmp_path, "postgresql://", "file path")


@pytest.mark.parametrize(
    ("location", "said"),
    [
        ("postgresql://u@h/db?no_such_parameter=1", "no_such_parameter"),
        ("mysql://u@h/db", "mysql://"),
    ],
)
def test_a_bad_outbox_db_variable_is_refused_the_same_way(
    location: str,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OUTBOX_DB", location)

    assert main(["--port", "0"]) == 2

    assert_one_line_refusal(capsys, tmp_path, said)


def test_a_postgresql_server_that_cannot_be_reached_is_one_line_and_status_1(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    closed_port: int,
) -> None:
    location = f"postgresql://outbox@127.0.0.1:{closed_port}/sink"

    assert main(["--db", location, "--port", "0"]) == EXIT_FAILED == 1

    assert_one_line_refusal(capsys, tmp_path, location, "cannot connect")


def test_chaos_refuses_orders_of_skus_and_events_of_keys() -> None:
    chaos = parse_chaos("reject-sku=snack,reject-key=c:9,reject-key=k" + "x" * 127)

    assert chaos == Chaos(
        reject_skus=frozenset({"snack"}), reject_keys=frozenset({"c:9", "k" + "x" * 127})
    )
    assert chaos.refuses and not chaos.faults


@pytest.mark.parametrize(
    "value",
    [
        "reject-key=",
        "reject-key=a b",
        "reject-key=" + "k" * 129,
        "reject-sku=a b",
        "exit-after-commit=\u00b2",
        "drop-after-commit=\u0661",
        "stall=\u0661",
        "stall=1_0",
    ],
)
def test_a_chaos_value_it_does_not_take_is_one_line_and_status_2(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--db", "sink.db", "--port", "0", "--chaos", value])

    assert exited.value.code == EXIT_USAGE
    assert_one_line_refusal(capsys, tmp_path, "--chaos", "expected drop-after-commit=N")
