"""The one exception type that library code raises for bad input.

The CLI turns an `NmtError` into a single `error: ...` line on stderr and exit
status 1; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# C0 and C1 control characters and DEL: a newline in a file name would split a message.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class NmtError(Exception):
    """A user-facing error: the message says what is wrong and where (file, line)."""


def where(path: object, line: int | None = None) -> str:
    """Format a location for error messages: `file` or `file:line`."""
    return f"{path}:{line}" if line is not None else f"{path}"


def one_line(message: str) -> str:
    """`message` as one printable line: control characters as Python writes them in a
    string (a newline as `\\n`, an escape as `\\x1b`); all else, file names too, as it is."""
    return _CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), message)


def first_difference(a: Mapping[Any, Any] | Sequence[Any], b: Mapping[Any, Any] | Sequence[Any]) -> tuple[Any, Any, Any] | None:
    """(key, a's value, b's value) where two mappings or two sequences first differ, for
    messages that name it; mappings in sorted key order (a missing key's value is None),
    sequences up to the shorter one's length. None where there is no such place."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys: Iterable[Any] = sorted(set(a) | set(b))
        return next(((k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)), None)
    return next(((i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
