"""The commands installing the package gives: `outbox-publisher` and `outbox-sink`,
run as installed (`pip install -e .`, as `make venv` and `make demo` do), are
`python -m publisher` and `python -m sink`. Nothing is installed here: the scripts are
looked up next to the interpreter running the tests, and a missing one fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support import LOOPBACK, http_request, listening, stop_process

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"outbox-publisher": "publisher", "outbox-sink": "sink"}
CLI_TIMEOUT_S = 30.0
SINK_LISTENING = re.compile(r"sink listening on (http://127\.0\.0\.1:(\d+)/events)")


def installed(script: str) -> Path:
    """The script in the environment's bin directory (not resolved: a virtualenv's
    python is often a link to the system's)."""
    path = Path(sys.executable).parent / script
    assert path.is_file() and os.access(path, os.X_OK), (
        f"{script} is not installed next to {sys.executable}: `pip install -e .` installs "
        f"it from [project.scripts] in pyproject.toml (make venv reinstalls when that changes)"
    )
    return path


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=CLI_TIMEOUT_S, check=False
    )


def test_pyproject_names_the_scripts_for_the_project() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {name: f"{module}.cli:main" for name, module in SCRIPTS.items()}


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["serve", "--help"],
        ["list", "--db", "source.db", "--state", "bogus"],  # one line on stderr, exit 2
        ["status", "--db", "missing-dir/none/source.db"],
    ],
    ids=["help", "serve-help", "bad-choice", "bad-db"],
)
def test_outbox_publisher_is_python_m_publisher(
    child_env: dict[str, str], tmp_path: Path, args: list[str]
) -> None:
    script = run([str(installed("outbox-publisher")), *args], child_env, tmp_path)
    module = run([sys.executable, "-m", "publisher", *args], child_env, tmp_path)
    assert (script.returncode, script.stdout, script.stderr) == (
        module.returncode,
        module.stdout,
        module.stderr,
    )
    assert "Traceback" not in script.stderr


def test_outbox_publisher_writes_and_reads_the_outbox(
    child_env: dict[str, str], tmp_path: Path
) -> None:
    publisher = str(installed("outbox-publisher"))
    db = str(tmp_path / "source.db")
    order = ["--id", "o-1", "--sku", "tea", "--qty", "2"]
    accepted = run([publisher, "accept", "--db", db, *order], child_env, tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    module = [sys.executable, "-m", "publisher"]
    listed = run([*module, "list", "--db", db, "--json"], child_env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert '"o-1"' in listed.stdout


def test_outbox_sink_serves_like_python_m_sink(child_env: dict[str, str], tmp_path: Path) -> None:
    assert run([str(installed("outbox-sink")), "--help"], child_env, tmp_path).stdout == (
        run([sys.executable, "-m", "sink", "--help"], child_env, tmp_path).stdout
    )
    sink_db = tmp_path / "sink.db"
    log = tmp_path / "sink.log"
    argv = [str(installed("outbox-sink")), "--db", str(sink_db), "--host", LOOPBACK, "--port", "0"]
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=stderr, env=child_env, cwd=tmp_path
        )
    try:
        port = int(listening(proc, log, SINK_LISTENING, "outbox-sink")[2])
        status, body = http_request(port, "POST", "/events", {"id": "o-1", "sku": "tea", "qty": 2})
        assert (status, body.get("ack")) == (200, "o-1"), body
    finally:
        assert stop_process(proc) == 0, log.read_text()
