"""`python -m docsgen` rewrites the generated reference pages; `--check` only
compares them, exit status 1 naming each stale page on a line of its own."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from docsgen.pages import check, write


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m docsgen", description="Write the generated reference pages."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1, naming each page that differs from what the code produces",
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        for path in stale:
            print(
                f"{path}: differs from what the code produces (run python -m docsgen)",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for path in write():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
