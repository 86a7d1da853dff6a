"""The one exception type that library code raises for bad input.

The CLI turns an `NmtError` into a single `error: ...` line on stderr and exit
status 1; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class NmtError(Exception):
    """A user-facing error: the message says what is wrong and where (file, line)."""


def where(path: object, line: int | None = None) -> str:
    """Format a location for error messages: `file` or `file:line`."""
    return f"{path}:{line}" if line is not None else f"{path}"


def first_difference(a: Mapping[Any, Any] | Sequence[Any], b: Mapping[Any, Any] | Sequence[Any]) -> tuple[Any, Any, Any] | None:
    """(key, a's value, b's value) where two mappings or two sequences first differ, for
    messages that name it; mappings in sorted key order (a missing key's value is None),
    sequences up to the shorter one's length. None where there is no such place."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys: Iterable[Any] = sorted(set(a) | set(b))
        return next(((k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)), None)
    return next(((i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
