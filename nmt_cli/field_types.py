"""The type check of stored fields (meta.json, a checkpoint's entries)."""

from __future__ import annotations

from typing import Any


def has_type(value: Any, allowed: tuple[type, ...]) -> bool:
    """Whether `value` is of one of the `allowed` types. A bool is one only where `bool` is
    allowed: Python counts it as an int, but `true` is no count or epoch number."""
    if isinstance(value, bool):
        return bool in allowed
    return isinstance(value, allowed)
