"""Opening the commands' files: a path that cannot be read or written is one error line."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from nmt_cli.errors import NmtError
from nmt_cli.streams import closed_error


def make_parent_directory(path: Path) -> None:
    """Create the directory that will hold `path`, or raise NmtError naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise NmtError(f"cannot write {path}: {error.strerror or error} ({error.filename})") from None


def file_prefix(prefix: str, flag: str, suffixes: tuple[str, ...]) -> Path:
    """`prefix` (to which the command appends `suffixes`) as a Path, or NmtError unless it
    ends in a file name. An empty prefix or one ending in `/`, `.` or `..` names a
    directory: `{prefix}.model` would be a hidden file in it, and Path drops a trailing
    `/`, so that `bz/` would write `bz.bin` beside the directory bz, not in it."""
    if os.path.basename(prefix) in ("", ".", ".."):
        names = " and ".join(f"DIR/NAME{suffix}" for suffix in suffixes)
        raise NmtError(f"{flag} must name a file, e.g. DIR/NAME for {names} (got {prefix!r})")
    return Path(prefix)


@contextmanager
def opened(path: str, mode: str) -> Iterator[IO]:
    """`path` opened in `mode`: "rb", "wb" or "w" (UTF-8 text with `\\n` line ends, whatever
    the locale); "-" is stdin or stdout.

    Failing to open or to close (where a full disk shows) is NmtError naming the file.
    After any other failure the file is closed quietly, so that the first error shows.
    """
    if path == "-":
        standard = {"rb": sys.stdin.buffer, "wb": sys.stdout.buffer, "w": sys.stdout}[mode]
        closed = closed_error(standard)
        if closed is not None:
            raise closed
        yield standard
        return
    verb = "read" if mode == "rb" else "write"
    try:
        stream = open(path, mode) if "b" in mode else open(path, mode, encoding="utf-8", newline="\n")
    except OSError as error:
        raise NmtError(f"cannot {verb} {path}: {error.strerror or error}") from None
    try:
        yield stream
    except BaseException:
        close_quietly(stream)
        raise
    try:
        stream.close()
    except OSError as error:
        raise NmtError(f"cannot {verb} {path}: {error.strerror or error}") from None


def close_quietly(stream: IO) -> None:
    """Close after a failure: closing flushes again, and that error must not hide the first."""
    try:
        stream.close()
    except OSError:
        pass


def refuse_overwriting_input(output_path: str | Path, input_path: str | Path, flag: str = "--output") -> None:
    """Raise if `output_path` is the regular file read as input ("-": stdin), also through
    a link or another spelling: opening the output for writing would empty the input."""
    if str(output_path) == "-":
        return
    try:
        output_stat = os.stat(output_path)
        input_stat = os.fstat(sys.stdin.fileno()) if str(input_path) == "-" else os.stat(input_path)
    except (OSError, ValueError):
        return  # a path that does not exist yet (or cannot be read) is not the input
    if stat.S_ISREG(output_stat.st_mode) and os.path.samestat(input_stat, output_stat):
        source = "standard input" if str(input_path) == "-" else str(input_path)
        raise NmtError(f"{flag} {output_path} is the input ({source}): writing it would destroy the input")
