"""What the Makefile's targets install, read from `make -n` (which prints the commands
and runs none) with the virtualenv pointed at an empty place: the demos and chaos runs
take the runtime dependencies only, the targets that test, lint or type-check take the
test extra too."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE_TIMEOUT_S = 30.0
RUNTIME_ONLY = ("demo", "demo-postgres", "chaos", "soak", "soak-workers", "runtime")
WITH_TEST_TOOLS = ("test", "check", "lint", "typecheck", "venv")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def dry_run(target: str, venv: Path) -> list[str]:
    """The commands `make TARGET` would run with a virtualenv yet to be made at `venv`."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=MAKE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def pip_installs(commands: list[str], venv: Path) -> list[str]:
    installs = [line for line in commands if f"{venv}/bin/pip install" in line]
    assert all(f"{venv}/bin/pip" in line for line in commands if "pip " in line), commands
    return installs


@pytest.mark.parametrize("target", RUNTIME_ONLY)
def test_the_demos_install_the_runtime_dependencies_only(target: str, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    installs = pip_installs(dry_run(target, venv), venv)
    assert installs, f"make {target} installs nothing into {venv}"
    for line in installs:
        assert line.rstrip().endswith(" -e ."), f"make {target} installs more: {line}"


@pytest.mark.parametrize("target", WITH_TEST_TOOLS)
def test_the_test_tools_come_with_the_targets_that_use_them(target: str, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    installs = pip_installs(dry_run(target, venv), venv)
    extras = [
        set(line.rstrip().removesuffix("]'").split(" -e '.[", 1)[1].split(","))
        for line in installs
        if " -e '.[" in line
    ]
    assert any("test" in chosen for chosen in extras), installs


def test_a_demo_runs_with_the_environments_python(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    commands = dry_run("demo", venv)
    assert any(line.startswith(f"{venv}/bin/python -m chaos scenario") for line in commands)
