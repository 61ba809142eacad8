"""`python -m sink` refusing a --db no backend can open: main() called in-process.

A refused location must be one line on stderr and exit status 2, before anything is
created or logged; reading the current directory afterwards shows nothing was.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing.cli import EXIT_USAGE
from sink.cli import main

REFUSED = [
    "postgresql://u@h/db",
    "postgres://warehouse@db.internal:5432/sink",
    "mysql://u@h/db",
]


def assert_one_line_refusal(capsys: pytest.CaptureFixture[str], cwd: Path, *words: str) -> None:
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("sink: ")
    for word in words:
        assert word in err
    assert list(cwd.iterdir()) == [], "nothing is created for a refused location"


@pytest.mark.parametrize("location", REFUSED)
def test_a_db_url_no_backend_opens_is_one_line_and_status_2(
    location: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)

    assert main(["--db", location, "--port", "0"]) == EXIT_USAGE == 2

    assert_one_line_refusal(capsys, tmp_path)


def test_postgresql_names_what_is_supported_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)

    assert main(["--db", "postgresql://u@h/db", "--port", "0"]) == 2

    assert_one_line_refusal(capsys, tmp_path, "PostgreSQL", "sqlite:")


def test_a_postgresql_outbox_db_variable_is_refused_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OUTBOX_DB", "postgresql://u@h/db")

    assert main(["--port", "0"]) == 2

    assert_one_line_refusal(capsys, tmp_path, "PostgreSQL")
