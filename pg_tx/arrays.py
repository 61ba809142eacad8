"""Array parameters written as one literal.

psycopg quotes a list element by element in Python; a group's arrays are written
here as one string instead, about ten times faster (see array_literal).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def array_literal(values: Sequence[str | int | float | bool | None]) -> str:
    """An array's text form (`{"a",NULL,"b\\"c"}`), for a parameter the statement
    casts (`%(ids)s::text[]`). psycopg quotes a list element by element in Python,
    about ten times slower than this for a group's arrays; the literal is then quoted
    once, as any string. Elements are strings (double-quoted, `"` and `\\` escaped),
    None (NULL), booleans and numbers."""
    return "{" + ",".join(map(_array_element, values)) + "}"


def _array_element(value: str | int | float | bool | None) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | float) and math.isfinite(value):
        return repr(value)
    raise TypeError(f"no array literal for {value!r}")
