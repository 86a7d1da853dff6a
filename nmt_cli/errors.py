"""The one exception type that library code raises for bad input.

The CLI turns an `NmtError` into a single `error: ...` line on stderr and exit
status 1; anything else is a bug and keeps its traceback.
"""


class NmtError(Exception):
    """A user-facing error: the message says what is wrong and where (file, line)."""


def where(path: object, line: int | None = None) -> str:
    """Format a location for error messages: `file` or `file:line`."""
    return f"{path}:{line}" if line is not None else f"{path}"
