"""Command-line conventions both services share: one line per error, fixed exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Final, NoReturn

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def fail(prog: str, message: object, status: int = EXIT_FAILED) -> int:
    """Print one line on stderr and return the exit status to use."""
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
    return status


def setup_logging(level: str = "INFO") -> None:
    """Plain log lines on stderr; stdout is kept for results."""
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
