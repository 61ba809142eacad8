"""A real full disk: a small tmpfs mounted in the test's directory, and a file that
fills it. Mounting needs the privilege to; without it the test is skipped."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SIZE = "8m"  # room for the databases and their WAL files, small enough to fill at once


@contextlib.contextmanager
def small_disk(where: Path, size: str = SIZE) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` for the duration; skip if none can be."""
    where.mkdir(parents=True, exist_ok=True)
    mount, umount = shutil.which("mount"), shutil.which("umount")
    if mount is None or umount is None:
        pytest.skip("no mount command here")
    mounted = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run([umount, "-l", str(where)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the file system is full; returns it (remove it to free)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = b"\0" * 65536
        while True:
            try:
                os.write(fd, block)
            except OSError:
                if len(block) == 1:
                    break
                block = block[: len(block) // 2]
    finally:
        os.close(fd)
    return filler
