"""Strict line reading: UTF-8 only, errors that name the file and line.

Lines are split on `\\n` alone (never on the Unicode line separators that
`str.splitlines` also honours, which would silently misalign parallel files).
A trailing `\\r` (CRLF files) is removed, as is a UTF-8 byte order mark at the
very start of a file. NUL bytes and invalid UTF-8 are errors.

Files are read in byte ranges that start at line starts, so several processes
can each read one part of a large file (`line_chunks`) and their outputs can be
concatenated in order. Standard input is read as its lines arrive (`ArrivingInput`),
so that a command can answer a writer that waits for each line's output.
"""

from __future__ import annotations

import os
import select
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from nmt_cli.errors import NmtError, where

BOM = b"\xef\xbb\xbf"
# The longest line, in characters, that the commands which can neither cut a line nor work
# on it in parts take (apply-bpe, score: either would give a result unlike the line's). Their
# work on a line costs tens of times its size, gigabytes for a megabyte; no sentence comes
# near this, a file whose line breaks were lost does.
LONGEST_LINE = 2**20
_BLOCK = 1 << 24  # bytes per read when scanning for newlines
_LINES_BLOCK = 1 << 20  # bytes per read in read_lines


def check_line_length(line: str, number: int, name: str, command: str) -> None:
    """NmtError naming `name`:`number` where `line` is longer than LONGEST_LINE."""
    if len(line) > LONGEST_LINE:
        raise NmtError(f"line of {len(line)} characters, more than {command} takes ({LONGEST_LINE}; are the "
                       f"file's line breaks lost?) at {where(name, number)}")


@dataclass(frozen=True)
class Chunk:
    """Lines [first_line, first_line + num_lines) of a file, at bytes [start, end)."""

    start: int
    end: int
    first_line: int  # 1-based number of the chunk's first line (for error messages)
    num_lines: int


def check_readable(path: Path) -> None:
    """Raise a clear error for a missing, non-regular or empty input file."""
    if not path.exists():
        raise NmtError(f"file not found: {path}")
    if not path.is_file():
        raise NmtError(f"not a regular file: {path}")
    if path.stat().st_size == 0:
        raise NmtError(f"empty file: {path}")


def count_lines(path: Path) -> int:
    """Number of lines; a last line without a final newline still counts."""
    check_readable(path)
    count, last = 0, b""
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (1 if last != b"\n" else 0)


def line_start_offsets(path: Path, line_indices: list[int]) -> list[int]:
    """Byte offset where each 0-based line index starts (an index == the line count maps to EOF)."""
    wanted = sorted(set(line_indices))
    found: dict[int, int] = {}
    newlines_before, position = 0, 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            # Line k starts one byte after the k-th newline.
            newline_at = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            for k in wanted:
                if k == 0:
                    found[0] = 0
                elif k not in found and newlines_before < k <= newlines_before + len(newline_at):
                    found[k] = position + int(newline_at[k - newlines_before - 1]) + 1
            newlines_before += len(newline_at)
            position += len(block)
    for k in wanted:
        found.setdefault(k, position)
    return [found[k] for k in line_indices]


def line_chunks(path: Path, num_lines: int, num_chunks: int) -> list[Chunk]:
    """Split a file into `num_chunks` runs of consecutive lines (as equal in lines as possible)."""
    num_chunks = max(1, min(num_chunks, num_lines))
    bounds = [num_lines * i // num_chunks for i in range(num_chunks + 1)]
    offsets = line_start_offsets(path, bounds) if num_chunks > 1 else [0, path.stat().st_size]
    return [
        Chunk(start=offsets[i], end=offsets[i + 1], first_line=bounds[i] + 1, num_lines=bounds[i + 1] - bounds[i])
        for i in range(num_chunks)
    ]


def without_line_end(raw: bytes) -> bytes:
    """A raw line without its `\\n`, then without one `\\r` (CRLF files)."""
    return raw.removesuffix(b"\n").removesuffix(b"\r")


def decode_utf8(raw: bytes, name: object, lineno: int, errors: str = "strict", remedy: str = "") -> str:
    """A line's bytes as text. errors="strict": invalid UTF-8 is an `NmtError` naming file,
    line and byte (and `remedy`, what to do about it); "replace": invalid bytes become U+FFFD."""
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        advice = f"; {remedy}" if remedy else ""
        raise NmtError(f"invalid UTF-8 at {where(name, lineno)} (byte {e.start + 1} of the line){advice}") from None


def decode_line(raw: bytes, name: object, lineno: int) -> str:
    """One raw line (with or without its newline) -> text, or an `NmtError` naming file and line."""
    raw = without_line_end(raw)
    if b"\x00" in raw:
        raise NmtError(f"NUL byte (binary data?) at {where(name, lineno)}")
    return decode_utf8(raw, name, lineno)


def read_lines(path: Path, chunk: Chunk | None = None) -> Iterator[str]:
    """Yield the lines of `path` (or of one chunk of it), decoded and without line endings.

    Reads and decodes blocks of whole lines (a `readline` and a `decode` per line cost more
    than most lines' processing); a block with a bad line is redone line by line, so the
    error names the first bad line, after every line before it was yielded.
    """
    start, end = (chunk.start, chunk.end) if chunk is not None else (0, None)
    lineno = chunk.first_line if chunk is not None else 1
    at_file_start = start == 0  # a BOM can begin the first line decoded
    with open(path, "rb") as f:
        f.seek(start)
        # partial: what was read since the last newline (a list, so a very long line costs linear time)
        position, partial = start, []
        while data := f.read(_LINES_BLOCK if end is None else min(_LINES_BLOCK, end - position)):
            position += len(data)
            cut = data.rfind(b"\n") + 1
            if not cut:
                partial.append(data)
                continue
            block, partial = b"".join([*partial, data[:cut]]), [data[cut:]]
            if at_file_start:
                block, at_file_start = block.removeprefix(BOM), False
            yield from _decode_lines(block, path, lineno)
            lineno += block.count(b"\n")
        if last := b"".join(partial):  # the file's last line, without a newline
            yield from _decode_lines(last.removeprefix(BOM) if at_file_start else last, path, lineno)


def _decode_lines(block: bytes, name: object, lineno: int) -> Iterator[str]:
    """The lines of `block`: whole lines, each ending with a newline but maybe the file's last."""
    text = _utf8_or_none(block)
    if text is None:  # a bad line somewhere: decode one at a time, for the error that names it
        raw_lines = block.split(b"\n")
        if block.endswith(b"\n"):
            raw_lines.pop()
        yield from (decode_line(raw, name, lineno + i) for i, raw in enumerate(raw_lines))
        return
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    yield from (line.removesuffix("\r") for line in lines) if "\r" in text else lines


def _utf8_or_none(block: bytes) -> str | None:
    """`block` decoded, or None if it holds a NUL byte or invalid UTF-8."""
    if b"\x00" in block:
        return None
    try:
        return block.decode("utf-8")
    except UnicodeDecodeError:
        return None


def stream_lines(stream: BinaryIO | ArrivingInput) -> Iterator[tuple[int, bytes]]:
    """(1-based number, raw line with its line end) for each line of `stream` as it
    arrives, the byte order mark that may begin the first line removed."""
    for lineno, raw in enumerate(iter(stream.readline, b""), start=1):
        yield lineno, raw.removeprefix(BOM) if lineno == 1 else raw


class ArrivingInput:
    """A binary input whose lines may come from a writer that waits for their answers
    (a program driving `nmt translate` or `nmt apply-bpe` through pipes, a line at a time).

    `readline` is a file's; `line_ready` says whether the next line can be had without
    waiting: one read already, more bytes in the pipe, or the end. From a pipe, socket or
    terminal (on POSIX) the descriptor is read directly, so that what is read ahead is
    known; a regular file or an in-memory stream is always ready.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._fd = _waitable_descriptor(stream)
        self._lines: deque[bytes] = deque()  # complete lines read ahead, line ends kept
        self._partial: list[bytes] = []  # the start of the line after them
        self._ended = False

    def readline(self) -> bytes:
        if self._fd is None:
            return self._stream.readline()
        while not self._lines:
            if self._ended:
                last = b"".join(self._partial)
                self._partial = []
                return last
            self._receive()
        return self._lines.popleft()

    def line_ready(self) -> bool:
        if self._fd is None or self._lines or self._ended:
            return True
        readable, _, _ = select.select([self._fd], [], [], 0)
        return bool(readable)

    def _receive(self) -> None:
        data = os.read(self._fd, 1 << 16)
        if not data:
            self._ended = True
            return
        complete, newline, rest = data.rpartition(b"\n")
        if not newline:
            self._partial.append(data)
            return
        lines = (b"".join(self._partial) + complete).split(b"\n")
        self._lines.extend(line + b"\n" for line in lines)
        self._partial = [rest] if rest else []


def _waitable_descriptor(stream: BinaryIO) -> int | None:
    """The descriptor of a pipe, socket or terminal behind `stream`, or None."""
    if os.name != "posix":
        return None
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both OSError and ValueError
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) else None


def read_stream(stream: BinaryIO | ArrivingInput, name: str) -> Iterator[str]:
    """Like `read_lines`, for an already-open binary stream such as stdin."""
    for lineno, raw in stream_lines(stream):
        yield decode_line(raw, name, lineno)
