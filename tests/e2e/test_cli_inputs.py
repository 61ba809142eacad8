"""What an operator types, refused or answered as a person needs it, by real `publisher`
processes: a bad value is one line on stderr and exit status 2 with nothing changed
(`list --limit` past its real maximum, a reason or a name the console would refuse, an
age for `prune` that is not digits and a unit); `list` says when nothing matches; and
--help shows each option's default."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support import query

from plumbing.cli import EXIT_USAGE
from publisher.cli import build_parser
from publisher.store import MAX_PAGE

if TYPE_CHECKING:
    from conftest import AcceptOrders, RunCli

pytestmark = pytest.mark.e2e

ORDER = {"id": "order-1", "sku": "snack", "qty": 2}


def assert_usage_error(done: object, *says: str) -> None:
    """Exit status 2, one line on stderr saying `says`, nothing on stdout."""
    status, out, err = done.returncode, done.stdout, done.stderr  # type: ignore[attr-defined]
    assert status == EXIT_USAGE, (status, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert out == ""
    for text in says:
        assert text in err, err


@pytest.fixture
def source(tmp_path: Path, accept_orders: AcceptOrders) -> Path:
    db = tmp_path / "source.db"
    accept_orders(db, ORDER)
    return db


def entry_state(db: Path) -> list[tuple[object, ...]]:
    return query(db, "SELECT id, sent, quarantined FROM outbox_entries") + query(
        db, "SELECT id, reason, quarantined_by FROM outbox_quarantines"
    )


def test_list_limit_past_the_real_maximum_is_a_usage_error(source: Path, run_cli: RunCli) -> None:
    done = run_cli("publisher", "list", "--db", str(source), "--limit", str(MAX_PAGE + 1))
    assert_usage_error(done, "--limit", f"from 1 to {MAX_PAGE}")
    listed = run_cli("publisher", "list", "--db", str(source), "--limit", str(MAX_PAGE))
    assert listed.returncode == 0, listed.stderr
    assert "order-1" in listed.stdout


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--reason", "red \x1b[31malert", "no control character"),
        ("--reason", "bell\x07", "U+0007"),
        ("--reason", "line\r\nbreak", "no control character"),
        ("--reason", "bad byte \udcff", "lone surrogate"),  # argv byte 0xFF
        ("--reason", "   ", "1 to 500 characters"),
        ("--reason", "r" * 501, "1 to 500 characters"),
        ("--by", "ops\nroot", "operator must be"),
        ("--by", "o" * 65, "operator must be"),
        ("--by", "ops\x1b[2J", "operator must be"),
    ],
)
def test_quarantine_takes_what_the_console_takes_and_changes_nothing_else(
    source: Path, run_cli: RunCli, option: str, value: str, says: str
) -> None:
    before = entry_state(source)
    given = {"--reason": "sink refuses it", option: value}
    done = run_cli("publisher", "quarantine", "order-1", "--db", str(source), *given_args(given))
    assert_usage_error(done, option, says)
    assert "\x1b" not in done.stderr and "\r" not in done.stderr
    assert entry_state(source) == before


def given_args(options: dict[str, str]) -> list[str]:
    return [part for pair in options.items() for part in pair]


def test_redrive_checks_its_name_as_quarantine_does(source: Path, run_cli: RunCli) -> None:
    held = run_cli(
        "publisher", "quarantine", "order-1", "--db", str(source), "--reason", " x ", "--by", "ops"
    )
    assert held.returncode == 0, held.stderr
    before = entry_state(source)
    assert before[-1] == ("order-1", "x", "ops")  # kept stripped, as the console keeps it

    done = run_cli("publisher", "redrive", "order-1", "--db", str(source), "--by", "a\tb")

    assert_usage_error(done, "--by", "operator must be")
    assert entry_state(source) == before


@pytest.mark.parametrize("age", ["7", "0", "1e3s", " 7d", "7d ", "\u0663d", "7 d", "7D"])
def test_prune_takes_ascii_digits_and_a_unit_only(source: Path, run_cli: RunCli, age: str) -> None:
    before = entry_state(source)
    done = run_cli("publisher", "prune", "--db", str(source), "--older-than", age)
    assert_usage_error(done, "--older-than", "digits and a unit")
    assert entry_state(source) == before


def test_prune_with_a_unit_prunes(source: Path, run_cli: RunCli) -> None:
    for age in ("7d", "1.5h", "0s"):
        done = run_cli("publisher", "prune", "--db", str(source), "--older-than", age)
        assert (done.returncode, done.stdout.strip()) == (0, "pruned 0 sent entries"), done.stderr


@pytest.mark.parametrize("given", ["", "s" * 1025])
def test_serve_refuses_a_source_every_sink_would_refuse(
    source: Path, run_cli: RunCli, given: str
) -> None:
    before = entry_state(source)
    sink = "http://127.0.0.1:9/events"
    done = run_cli(
        "publisher", "serve", "--db", str(source), "--sink", sink, "--port", "0", "--source", given
    )
    assert_usage_error(done, "--source", "1 to 1024 characters")
    assert entry_state(source) == before


@pytest.mark.parametrize(("flag", "value"), [("--qty", "0"), ("--id", "_x"), ("--sku", "a b")])
def test_accept_refuses_an_order_before_creating_a_database(
    tmp_path: Path, run_cli: RunCli, flag: str, value: str
) -> None:
    db = tmp_path / "new.db"
    given = {"--id": "order-9", "--sku": "snack", "--qty": "1", flag: value}
    done = run_cli("publisher", "accept", "--db", str(db), *given_args(given))
    assert_usage_error(done, "invalid order")
    assert list(tmp_path.glob("new.db*")) == []


def test_list_says_when_nothing_matches(source: Path, run_cli: RunCli) -> None:
    db = str(source)
    sent = run_cli("publisher", "list", "--db", db, "--state", "sent")
    of_type = run_cli("publisher", "list", "--db", db, "--type", "refund.issued", "--key", "k1")
    as_json = run_cli("publisher", "list", "--db", db, "--state", "sent", "--json")

    assert (sent.returncode, sent.stdout) == (0, "no sent entries\n"), sent.stderr
    assert of_type.stdout == "no pending entries of type refund.issued and key k1\n"
    assert (as_json.returncode, as_json.stdout) == (0, "")  # JSON Lines: no line is none


def test_help_shows_the_retry_cap_and_every_other_default(run_cli: RunCli) -> None:
    done = run_cli("publisher", "serve", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert re.search(r"--retry-cap RETRY_CAP longest retry wait, [^\[]*\(default: 30\)", text)
    assert "--quarantine-after" in text and "by default never" in text


def test_every_option_with_a_default_shows_it_in_its_help() -> None:
    parser = build_parser()
    [commands] = [a for a in parser._actions if a.dest == "command"]
    shown = 0
    for name, sub in commands.choices.items():  # type: ignore[attr-defined]
        for action in sub._actions:
            if action.dest == "help" or action.default in (None, False, []):
                continue
            assert "(default: " in (action.help or ""), (name, action.option_strings)
            shown += 1
    assert shown > 20


def test_a_reader_that_went_away_ends_the_command_quietly(source: Path) -> None:
    # `outbox-publisher list | head -1`: the pipe closes before the command writes.
    command = [sys.executable, "-m", "publisher", "list", "--db", str(source)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as running:
        assert running.stdout is not None and running.stderr is not None
        running.stdout.close()
        stderr = running.stderr.read().decode()
        status = running.wait(timeout=60)
    assert (status, stderr) == (0, "")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_an_answer_that_cannot_be_written_is_one_line_that_says_so(source: Path) -> None:
    # `outbox-publisher list > /dev/full`: the disk that takes its answer is full.
    command = [sys.executable, "-m", "publisher", "list", "--db", str(source)]
    with open("/dev/full", "wb") as full:
        done = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, timeout=60, check=False)
    stderr = done.stderr.decode()
    assert done.returncode == 1 and len(stderr.splitlines()) == 1, stderr
    assert "list: No space left on device" in stderr and "listen" not in stderr
