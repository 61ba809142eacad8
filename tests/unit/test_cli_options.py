"""Command-line conventions: durations, OUTBOX_* environment defaults, log lines."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plumbing.cli import (
    CHAOS_EXIT_STATUS,
    ArgumentParser,
    JsonFormatter,
    TextFormatter,
    _default_shown,
    add_option,
    duration_s,
    env_name,
)
from plumbing.storage import BadLocation
from publisher.app import ServiceSettings
from publisher.chaos import exit_after_ack
from publisher.cli import build_parser, main
from publisher.settings import DEFAULT_DEPTH, RelaySettings


def parser_with(*options: tuple[str, dict[str, object]]) -> ArgumentParser:
    parser = ArgumentParser(prog="tool")
    for flag, kwargs in options:
        add_option(parser, flag, **kwargs)
    return parser


def usage_error(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """Parse `argv`, expect exit status 2, return what was said on stderr."""
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured), pytest.raises(SystemExit) as exited:
        parser.parse_args(argv)
    assert exited.value.code == 2, captured.getvalue()
    return captured.getvalue()


# ---------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("15m", 900.0),
        ("12h", 43_200.0),
        ("7d", 604_800.0),
        ("1.5h", 5_400.0),
        ("0s", 0.0),
        ("0", 0.0),
        ("30", 30.0),
        ("2.5", 2.5),
        (" 5m ", 300.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "abc", "5x", "5 m", "m5", "-5", "-1s", "1e400", "inf", "nan", "5mm", "1h30m"]
)
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration_s(text)


def test_duration_as_an_option_type_gives_a_usage_error() -> None:
    parser = parser_with(("--older-than", {"type": duration_s, "required": True}))
    assert parser.parse_args(["--older-than", "7d"]).older_than == 604_800.0
    assert "not a duration" in usage_error(parser, ["--older-than", "a week"])


# ---------------------------------------------------------------- environment defaults


@pytest.fixture(autouse=True)
def no_outbox_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("OUTBOX_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("flag", "env"),
    [
        ("--db", "OUTBOX_DB"),
        ("--poll-interval", "OUTBOX_POLL_INTERVAL"),
        ("--quarantine-after", "OUTBOX_QUARANTINE_AFTER"),
        ("--log-format", "OUTBOX_LOG_FORMAT"),
    ],
)
def test_env_names(flag: str, env: str) -> None:
    assert env_name(flag) == env


def test_env_satisfies_a_required_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_DB", "/data/source.db")
    parser = parser_with(("--db", {"required": True}))
    assert parser.parse_args([]).db == "/data/source.db"


def test_required_option_without_env_is_a_usage_error() -> None:
    parser = parser_with(("--db", {"required": True}))
    assert "--db" in usage_error(parser, [])


def test_flag_wins_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_DB", "from-env.db")
    parser = parser_with(("--db", {"required": True}))
    assert parser.parse_args(["--db", "from-flag.db"]).db == "from-flag.db"


def test_env_value_gets_the_option_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_PORT", "8123")
    monkeypatch.setenv("OUTBOX_OLDER_THAN", "2h")
    parser = parser_with(
        ("--port", {"type": int, "default": 8000}),
        ("--older-than", {"type": duration_s, "required": True}),
    )
    args = parser.parse_args([])
    assert args.port == 8123
    assert type(args.port) is int
    assert args.older_than == 7_200.0


def test_env_value_that_fails_the_type_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_PORT", "eighty")
    parser = parser_with(("--port", {"type": int, "default": 8000}))
    assert "eighty" in usage_error(parser, [])


def test_env_value_outside_the_choices_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The environment is another way to give the flag: the same checks apply to it.
    monkeypatch.setenv("OUTBOX_LOG_FORMAT", "xml")
    parser = parser_with(("--log-format", {"choices": ["text", "json"], "default": "text"}))
    assert "xml" in usage_error(parser, [])


def test_list_state_from_env_outside_the_choices_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_STATE", "bogus")
    usage_error(build_parser(), ["list", "--db", "source.db"])


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("no", False)],
)
def test_env_for_a_switch(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("OUTBOX_JSON", value)
    parser = parser_with(("--json", {"action": "store_true"}))
    assert parser.parse_args([]).json is expected


def test_switch_defaults_to_off_without_env() -> None:
    parser = parser_with(("--json", {"action": "store_true"}))
    assert parser.parse_args([]).json is False
    assert parser.parse_args(["--json"]).json is True


def test_env_for_a_repeatable_option_is_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_ALLOW_HOST", "sink.internal,,backup.internal")
    parser = parser_with(("--allow-host", {"action": "append", "default": []}))
    assert parser.parse_args([]).allow_host == ["sink.internal", "backup.internal"]


def test_help_names_the_env_variable() -> None:
    parser = parser_with(("--poll-interval", {"type": float, "help": "seconds between checks"}))
    text = " ".join(parser.format_help().split())
    assert "seconds between checks [env OUTBOX_POLL_INTERVAL]" in text


def test_publisher_serve_reads_every_setting_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {
        "OUTBOX_DB": "/data/source.db",
        "OUTBOX_SINK": "http://127.0.0.1:9999/events,http://127.0.0.1:9998/events",
        "OUTBOX_WORKER_ID": "w7",
        "OUTBOX_LEASE_TTL": "2.5",
        "OUTBOX_PORT": "0",
        "OUTBOX_POLL_INTERVAL": "0.25",
        "OUTBOX_RETRY_BASE": "0.1",
        "OUTBOX_RETRY_CAP": "2",
        "OUTBOX_QUARANTINE_AFTER": "3",
        "OUTBOX_SEND_TIMEOUT": "1.5",
        "OUTBOX_LOG_FORMAT": "json",
        "OUTBOX_LIMIT": "4",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)

    args = build_parser().parse_args(["serve"])

    assert args.db == "/data/source.db"
    assert args.sink == ["http://127.0.0.1:9999/events", "http://127.0.0.1:9998/events"]
    assert (args.worker_id, args.lease_ttl) == ("w7", 2.5)
    assert (args.port, args.poll_interval, args.retry_base, args.retry_cap) == (0, 0.25, 0.1, 2.0)
    assert (args.quarantine_after, args.send_timeout, args.limit) == (3, 1.5, 4)
    assert args.log_format == "json"


def test_publisher_serve_env_values_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_DB", "source.db")
    monkeypatch.setenv("OUTBOX_SINK", "http://127.0.0.1:9999/events")
    monkeypatch.setenv("OUTBOX_QUARANTINE_AFTER", "0")
    assert "greater than 0" in usage_error(build_parser(), ["serve"])


def test_publisher_subcommand_help_shows_env_names() -> None:
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--help"])
    assert exited.value.code == 0
    serve_help = " ".join(captured.getvalue().split())
    for name in ("OUTBOX_DB", "OUTBOX_SINK", "OUTBOX_PORT", "OUTBOX_QUARANTINE_AFTER"):
        assert f"[env {name}]" in serve_help


# ---------------------------------------------------------------- --pipeline

SERVE = ["serve", "--db", "source.db", "--sink", "http://127.0.0.1:9999/events"]


def test_publisher_serve_pipeline_defaults_to_the_default_depth() -> None:
    # Pipelined by default: the relay still sends one at a time until the sink says
    # it enforces Outbox-After.
    assert DEFAULT_DEPTH == 8
    args = build_parser().parse_args(SERVE)
    assert args.pipeline == DEFAULT_DEPTH
    assert type(args.pipeline) is int
    assert ServiceSettings(db="source.db", sink="http://127.0.0.1:9/events").relay.pipeline == 8


def test_service_settings_refuse_a_location_no_backend_opens_and_a_relay_without_leases() -> None:
    sink = "http://127.0.0.1:9/events"
    with pytest.raises(BadLocation):
        ServiceSettings(db="ftp://nowhere/source", sink=sink)
    with pytest.raises(ValueError, match="under leases"):
        ServiceSettings(db="source.db", sink=sink, relay=RelaySettings(worker=None))
    leased = ServiceSettings(db="source.db", sink=sink, relay=RelaySettings())
    assert leased.relay.worker is not None


@pytest.mark.parametrize("text", ["1", "2", "16"])
def test_publisher_serve_pipeline_accepts_1_to_16(text: str) -> None:
    args = build_parser().parse_args([*SERVE, "--pipeline", text])
    assert args.pipeline == int(text)
    assert type(args.pipeline) is int


@pytest.mark.parametrize("text", ["0", "17", "-1", "x", "", "2.5", "8x"])
def test_publisher_serve_pipeline_outside_1_to_16_is_one_usage_line(text: str) -> None:
    said = usage_error(build_parser(), [*SERVE, "--pipeline", text])
    assert "Traceback" not in said
    assert len(said.splitlines()) == 1, said
    assert "--pipeline" in said and "from 1 to 16" in said


def test_publisher_serve_pipeline_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_PIPELINE", "3")  # not the default: the variable is read
    assert build_parser().parse_args(SERVE).pipeline == 3
    assert build_parser().parse_args([*SERVE, "--pipeline", "2"]).pipeline == 2  # flag wins


@pytest.mark.parametrize("text", ["0", "17", "x"])
def test_publisher_serve_pipeline_env_is_checked(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("OUTBOX_PIPELINE", text)
    said = usage_error(build_parser(), SERVE)
    assert len(said.splitlines()) == 1, said
    assert "from 1 to 16" in said


def test_publisher_main_refuses_a_bad_pipeline_before_doing_anything(tmp_path: Path) -> None:
    # Through main, as `python -m publisher` runs it: exit 2, one line, no database made.
    source = tmp_path / "source.db"
    captured = io.StringIO()
    argv = ["serve", "--db", str(source), "--sink", "http://127.0.0.1:9/events"]
    with contextlib.redirect_stderr(captured), pytest.raises(SystemExit) as exited:
        main([*argv, "--pipeline", "17"])
    assert exited.value.code == 2
    assert len(captured.getvalue().splitlines()) == 1, captured.getvalue()
    assert captured.getvalue().startswith("outbox-publisher serve: error: argument --pipeline")
    assert not source.exists()


# ---------------------------------------------------------------- --chaos

DISPATCH = ["dispatch", "--db", "source.db", "--sink", "http://127.0.0.1:9999/events"]
# The subcommands that have --chaos.
CHAOS_ARGV = pytest.mark.parametrize("argv", [SERVE, DISPATCH], ids=["serve", "dispatch"])
BAD_CHAOS = [
    "exit-after-ack=0",
    "exit-after-ack=-1",
    "exit-after-ack=x",
    "exit-after-ack=",
    "exit-after-ac",
    "exit-after-ack=1.5",
    "exit-after-ack=\u0663",  # ARABIC-INDIC DIGIT THREE: a digit, but not ASCII
    "exit-after-ack=+2",
    "exit-after-ack=2=3",
    "EXIT-AFTER-ACK",
    "sigkill",
]


def one_chaos_usage_line(said: str) -> None:
    assert "Traceback" not in said
    assert len(said.splitlines()) == 1, said
    assert "argument --chaos" in said, said


@CHAOS_ARGV
def test_chaos_is_off_by_default(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).chaos is None


@CHAOS_ARGV
@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("exit-after-ack", 1),
        ("exit-after-ack=1", 1),
        ("exit-after-ack=5", 5),
        ("exit-after-ack=12", 12),
    ],
)
def test_chaos_exit_after_ack_gives_the_ack_count(argv: list[str], text: str, count: int) -> None:
    args = build_parser().parse_args([*argv, "--chaos", text])
    assert args.chaos == count
    assert type(args.chaos) is int


@CHAOS_ARGV
@pytest.mark.parametrize("text", BAD_CHAOS)
def test_a_bad_chaos_value_is_one_usage_line(argv: list[str], text: str) -> None:
    one_chaos_usage_line(usage_error(build_parser(), [*argv, "--chaos", text]))


@CHAOS_ARGV
def test_chaos_from_env(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    monkeypatch.setenv("OUTBOX_CHAOS", "exit-after-ack=3")
    args = build_parser().parse_args(argv)
    assert args.chaos == 3
    assert type(args.chaos) is int
    flag = build_parser().parse_args([*argv, "--chaos", "exit-after-ack"])
    assert flag.chaos == 1  # flag wins


@CHAOS_ARGV
@pytest.mark.parametrize("text", BAD_CHAOS)
def test_chaos_env_is_checked(monkeypatch: pytest.MonkeyPatch, argv: list[str], text: str) -> None:
    monkeypatch.setenv("OUTBOX_CHAOS", text)
    one_chaos_usage_line(usage_error(build_parser(), argv))


@pytest.mark.timeout(10)  # should the value pass, serve would run until stopped
@pytest.mark.parametrize("command", ["serve", "dispatch"])
def test_publisher_main_refuses_a_bad_chaos_before_doing_anything(
    tmp_path: Path, command: str
) -> None:
    # Through main, as `python -m publisher` runs it: exit 2, one line, no database made.
    source = tmp_path / "source.db"
    captured = io.StringIO()
    argv = [command, "--db", str(source), "--sink", "http://127.0.0.1:9/events"]
    if command == "serve":
        argv += ["--port", "0"]
    with contextlib.redirect_stderr(captured), pytest.raises(SystemExit) as exited:
        main([*argv, "--chaos", "exit-after-ack=0"])
    assert exited.value.code == 2
    assert len(captured.getvalue().splitlines()) == 1, captured.getvalue()
    assert captured.getvalue().startswith(f"outbox-publisher {command}: error: argument --chaos")
    assert not source.exists()


class Exited(Exception):
    pass


@pytest.mark.parametrize("count", [1, 3])
def test_the_exit_after_ack_hook_exits_with_73_at_the_nth_ack_only(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    def fake_exit(status: int) -> None:
        raise Exited(status)

    monkeypatch.setattr(os, "_exit", fake_exit)
    hook = exit_after_ack(count)
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):
        for n in range(1, count):
            hook(f"e{n}")
        assert captured.getvalue() == ""
        with pytest.raises(Exited) as exited:
            hook(f"e{count}")
    assert exited.value.args == (CHAOS_EXIT_STATUS,)
    assert CHAOS_EXIT_STATUS == 73
    assert f"e{count}" in captured.getvalue()


# ---------------------------------------------------------------- JSON log lines


@pytest.fixture
def json_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test_cli_options.json")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream
    logger.handlers.clear()
    logger.propagate = True


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_delivery_line_is_one_json_object_with_the_extra_fields(
    json_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = json_log
    fields = {"event_id": "order-1", "seq": 3, "attempt": 2, "outcome": "delivered"}
    logger.info("delivery", extra={**fields, "latency_ms": 12.5})

    [line] = lines(stream)

    assert line["message"] == "delivery"
    assert line["level"] == "info"
    assert line["logger"] == "test_cli_options.json"
    assert isinstance(line["time"], float)
    assert {k: line[k] for k in fields} == fields
    assert line["latency_ms"] == 12.5
    assert "args" not in line and "msg" not in line and "levelno" not in line


def test_message_with_newlines_stays_on_one_line(
    json_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = json_log
    logger.warning("head blocked\nsecond line %s", "arg", extra={"reason": 'say "409"\n'})

    text = stream.getvalue()
    assert text.count("\n") == 1
    [line] = lines(stream)
    assert line["message"] == "head blocked\nsecond line arg"
    assert line["reason"] == 'say "409"\n'


def test_values_json_cannot_hold_are_written_as_text(
    json_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = json_log
    logger.info("opened", extra={"path": Path("/data/source.db"), "ids": {"a"}})
    [line] = lines(stream)
    assert line["path"] == "/data/source.db"
    assert line["ids"] == "{'a'}"


def test_exception_is_kept_in_the_line(json_log: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = json_log
    try:
        raise RuntimeError("database gone")
    except RuntimeError:
        logger.exception("relay step failed")
    [line] = lines(stream)
    assert line["level"] == "error"
    assert "RuntimeError: database gone" in str(line["exception"])


# ---------------------------------------------------------------- text log lines

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def record_at(created: float) -> logging.LogRecord:
    record = logging.LogRecord("publisher.relay", logging.INFO, "", 0, "delivery", None, None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    return record


def test_text_line_times_are_utc_text_across_seconds() -> None:
    # The date and time part is kept per second: within a second, at the next one,
    # and back to an earlier one (a clock step) it must read as every view's time.
    ours = TextFormatter(TEXT_FORMAT)
    base = 1_790_000_000.0
    for created in (base + 0.001, base + 0.999, base + 1.5, base + 86_400.25, base + 0.5):
        record = record_at(created)
        second = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(created)))
        assert ours.formatTime(record) == f"{second}.{int(record.msecs):03d}Z"
        assert ours.format(record).startswith(f"{second}.")
    assert ours.formatTime(record_at(base + 0.5)) == "2026-09-21T14:13:20.500Z"
    assert ours.formatTime(record_at(base + 86_400.25)) == "2026-09-22T14:13:20.250Z"


def test_service_log_lines_carry_every_field_in_both_formats() -> None:
    # setup_logging turns off the thread, process and caller look-ups; a line still
    # says all it said (run apart: it configures the whole process's logging).
    script = (
        "import logging, sys; from plumbing.cli import setup_logging; "
        "setup_logging(sys.argv[1]); "
        "logging.getLogger('publisher.relay').info("
        "'delivery', extra={'event_id': 'order-1', 'seq': 3, 'outcome': 'delivered'})"
    )
    said = {}
    for log_format in ("text", "json"):
        done = subprocess.run(
            [sys.executable, "-c", script, log_format], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        said[log_format] = done.stderr.strip()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO publisher\.relay: delivery"
        r" event_id=order-1 seq=3 outcome=delivered",
        said["text"],
    ), said["text"]
    line = json.loads(said["json"])
    assert isinstance(line.pop("time"), float)
    assert line == {
        "level": "info",
        "logger": "publisher.relay",
        "message": "delivery",
        "event_id": "order-1",
        "seq": 3,
        "outcome": "delivered",
    }


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`parser` and every subcommand's parser under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_program_shows_each_default_in_its_help() -> None:
    from chaos.cli import build_parser as chaos_parser
    from sink.cli import build_parser as sink_parser

    checked = 0
    for top in (build_parser(), sink_parser(), chaos_parser()):
        for parser in _parsers(top):
            text = " ".join(parser.format_help().split())
            for action in parser._actions:
                shown = _default_shown(action.default)
                if not action.option_strings or action.dest == "help" or shown is None:
                    continue
                assert f"(default: {shown.replace('%%', '%')})" in text, (
                    parser.prog,
                    action.option_strings,
                )
                checked += 1
    assert checked > 40
