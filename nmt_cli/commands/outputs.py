"""Opening output files for the commands: a path that cannot be written is one error line."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from nmt_cli.errors import NmtError


def make_parent_directory(path: Path) -> None:
    """Create the directory that will hold `path`, or raise NmtError naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise NmtError(f"cannot write {path}: {error.strerror or error} ({error.filename})") from None


def open_output_text(path: Path) -> TextIO:
    """`path` opened for writing UTF-8 text with `\\n` line ends, or NmtError naming it."""
    try:
        return open(path, "w", encoding="utf-8", newline="\n")
    except OSError as error:
        raise NmtError(f"cannot write {path}: {error.strerror or error}") from None
