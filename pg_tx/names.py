"""Table names written with their schema, in every statement of a side.

A side's tables live in the user's database beside the user's own. With a schema
named (`schema=NAME` in the URI, or `--schema`), every statement names each of its
tables as `"NAME".table`, whatever the search_path of the connection it runs on:
the search_path of a caller's own transaction (publish_in) stays the caller's.
Without one, table names are left as written and found by the search_path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from types import ModuleType, SimpleNamespace
from typing import Any, Final

from plumbing.storage import BadLocation

SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
SCHEMA_RULE: Final = "1 to 63 of A-Z a-z 0-9 _, not starting with a digit"

Qualify = Callable[[str], str]


def check_schema(name: str) -> str:
    """A schema name as given (BadLocation unless it is a plain identifier)."""
    if SCHEMA_NAME.fullmatch(name) is None:
        raise BadLocation(f"schema must be {SCHEMA_RULE}, not {name!r}")
    return name


def qualifier(schema: str | None, tables: Iterable[str]) -> Qualify:
    """The function that writes each of `tables` in a statement as `"schema".table`
    (the identity without a schema). A name is replaced where it stands as a word of
    its own and is not already qualified: `FROM outbox_entries AS e`, and inside the
    literal of `'outbox_entries'::regclass`; not `outbox_entries_pkey`, not `e.seq`,
    not the new name of `ALTER TABLE ... RENAME TO` (which must be unqualified)."""
    if schema is None:
        return _unchanged
    names = "|".join(sorted((re.escape(t) for t in tables), key=len, reverse=True))
    # Not after RENAME TO: the new name of a table stays in the table's schema.
    pattern = re.compile(rf'(?<![\w."$])(?<!RENAME TO )({names})(?![\w"$])')
    prefix = f'"{check_schema(schema)}".'
    return lambda statement: pattern.sub(lambda m: prefix + m.group(1), statement)


def _unchanged(statement: str) -> str:
    return statement


def qualified(module: ModuleType, qualify: Qualify) -> Any:
    """A backend's SQL module as its statements run: each of its upper-case text
    (or bytes) constants with its tables qualified, every other constant as it is."""

    def statement(value: object) -> object:
        if isinstance(value, str):
            return qualify(value)
        if isinstance(value, bytes):
            return qualify(value.decode()).encode()
        return value

    return SimpleNamespace(
        **{name: statement(value) for name, value in vars(module).items() if name.isupper()}
    )
