"""The CPU a benchmark counts for a server: its own and its children's, live or ended."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.procs import tree_cpu_s

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")

BURN_S = 0.4
# A parent that stays idle itself: it runs one child that burns CPU and ends (and
# waits for it), starts another that burns CPU and then sleeps, and says so.
PARENT = f"""
import subprocess, sys
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < {BURN_S}: pass\\n"
subprocess.run([sys.executable, "-c", burn], check=True)
live = subprocess.Popen(
    [sys.executable, "-c", burn + "print('burnt', flush=True)\\nimport time\\ntime.sleep(60)"],
    stdout=subprocess.PIPE,
)
assert live.stdout.readline() == b"burnt\\n"
print(live.pid, flush=True)
sys.stdin.read()
live.kill()
"""


def own_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_counts_the_children_that_ended_and_those_still_running() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        live_pid = int(parent.stdout.readline())
        total = tree_cpu_s(parent.pid)
        own = own_cpu_s(parent.pid)
        assert own < BURN_S  # the parent itself mostly waited
        assert total >= own + 2 * BURN_S * 0.9, (total, own)
        assert tree_cpu_s(live_pid) >= BURN_S * 0.9
        assert tree_cpu_s(live_pid) < total
    finally:
        parent.communicate(b"", timeout=30)


def test_a_process_that_is_gone_counts_as_unknown() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert math.isnan(tree_cpu_s(gone.pid))
