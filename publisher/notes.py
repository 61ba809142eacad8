"""What an operator writes into the outbox's records: a reason (quarantine) and the
operator's name (quarantine, redrive). One rule each, for the CLI and the console
alike, checked before anything is written: a record keeps only text that every
backend stores as given and every reader can show (no control character, which a
terminal or a log would act on; no NUL, which PostgreSQL refuses in text; no lone
surrogate, which no UTF-8 encoder writes)."""

from __future__ import annotations

import re
import unicodedata
from typing import Final

MAX_REASON_CHARS: Final = 500
OPERATOR_RULE: Final = "1-64 of A-Z a-z 0-9 . _ @ - and spaces"
_OPERATOR: Final = re.compile(r"[A-Za-z0-9._@ -]{1,64}")


class BadNote(ValueError):
    """A reason or an operator name that no record may carry; `field` names which."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


def check_reason(value: object) -> str:
    """A reason as it is kept: `value` stripped, 1 to MAX_REASON_CHARS characters, none
    of them a control character or a lone surrogate; BadNote if not."""
    if not isinstance(value, str):
        raise BadNote("reason", "reason must be a string")
    reason = value.strip()
    if not 1 <= len(reason) <= MAX_REASON_CHARS:
        raise BadNote("reason", f"reason must be 1 to {MAX_REASON_CHARS} characters")
    for place, char in enumerate(reason):
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise BadNote(
                "reason",
                f"reason must hold no control character or lone surrogate"
                f" (U+{ord(char):04X} at character {place + 1})",
            )
    return reason


def check_operator(value: object) -> str:
    """An operator name as it is kept: `value` stripped, OPERATOR_RULE; BadNote if not."""
    if not isinstance(value, str):
        raise BadNote("operator", "operator must be a string")
    name = value.strip()
    if not _OPERATOR.fullmatch(name):
        raise BadNote("operator", f"operator must be {OPERATOR_RULE}")
    return name
