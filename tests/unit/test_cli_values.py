"""Out-of-range and loosely written values are usage errors: one line on stderr and
exit status 2, before anything is opened or started."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from chaos.cli import main as chaos_main
from publisher.cli import main as publisher_main
from sink.cli import main as sink_main

Main = Callable[[Sequence[str] | None], int]
SINK_URL = "http://127.0.0.1:9/events"
SERVE = ["serve", "--db", "source.db", "--sink", SINK_URL]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("OUTBOX_DB", "OUTBOX_PORT", "OUTBOX_RETRY_BASE", "OUTBOX_RETRY_CAP"):
        monkeypatch.delenv(name, raising=False)


def usage_error(main: Main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


BAD_PORTS = ["99999", "65536", "-1", "80.0", "0x50", "\uff18\uff10", "8_0", ""]


@pytest.mark.parametrize("value", BAD_PORTS)
def test_a_port_outside_0_to_65535_or_not_an_integer_is_refused(
    value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert "--port" in usage_error(publisher_main, [*SERVE, "--port", value], capsys)
    assert "--port" in usage_error(sink_main, ["--db", "sink.db", "--port", value], capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_retry_base_above_the_cap_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    err = usage_error(publisher_main, [*SERVE, "--retry-base", "5", "--retry-cap", "1"], capsys)
    assert "--retry-base" in err and "--retry-cap" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["1_000", "\u0661\u0662\u0663", "\u0663", "1e3", "+5", " 5"])
def test_qty_takes_plain_ascii_digits_only(
    value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["accept", "--db", "source.db", "--id", "o-1", "--sku", "snack", "--qty", value]
    assert "--qty" in usage_error(publisher_main, argv, capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("reason", ["", "   "])
def test_an_empty_reason_is_refused(
    reason: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["quarantine", "o-1", "--db", "source.db", "--reason", reason]
    assert "--reason" in usage_error(publisher_main, argv, capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--poll-interval", "inf"),
        ("--poll-interval", "nan"),
        ("--retry-cap", "1_0"),
        ("--send-timeout", "-1"),
        ("--lanes", "\u0663"),
        ("--limit", "1_6"),
        ("--pipeline", "2.0"),
        ("--quarantine-after", "0"),
    ],
)
def test_serve_numbers_are_strict(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert flag in usage_error(publisher_main, [*SERVE, flag, value], capsys)


@pytest.mark.parametrize("value", ["1_0", "\u0661", "-1"])
def test_list_limit_is_a_strict_positive_integer(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["list", "--db", "source.db", "--limit", value]
    assert "--limit" in usage_error(publisher_main, argv, capsys)


@pytest.mark.parametrize("argv", [["run", "--events", "1_0"], ["run", "--seed", "\u0663"]])
def test_chaos_numbers_are_strict(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    usage_error(chaos_main, argv, capsys)


def test_well_formed_values_still_work(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["accept", "--db", "source.db", "--id", "o-1", "--sku", "snack", "--qty", "1000"]
    assert publisher_main(argv) == 0
    assert capsys.readouterr().out == "accepted o-1\n"


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--type", "bad type"),
        ("--type", "payment/captured"),
        ("--type", ""),
        ("--type", "t" * 129),
        ("--type", "caf\u00e9"),
        ("--key", "cust 1"),
        ("--key", "**"),
        ("--key", ""),
        ("--key", "k" * 129),
        ("--key", "a\u202eb"),
        ("--key", "a\x1b[31m"),
    ],
)
def test_list_type_and_key_are_well_formed_or_one_usage_line(
    flag: str, value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    err = usage_error(publisher_main, ["list", "--db", "source.db", flag, value], capsys)
    assert flag in err
    line = err.removesuffix("\n")
    assert line.isascii() and line.isprintable()  # the value is not echoed raw
    assert list(tmp_path.iterdir()) == []  # refused before the database is opened
