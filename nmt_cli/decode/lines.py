"""Reading input lines for `translate`: streaming, UTF-8 checked, numbered.

Lines are split on `\\n` only (a trailing `\\r` is dropped, and a UTF-8 byte order
mark at the very start), so the output has exactly one line per input line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from nmt_cli.errors import NmtError, where

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class InputLine:
    number: int  # 1-based
    text: str


def read_lines(stream: BinaryIO, name: str, errors: str) -> Iterator[InputLine]:
    """Yield the lines of `stream` as they arrive.

    errors="strict": invalid UTF-8 raises NmtError naming the line (lines before it
    have been yielded); "replace": invalid bytes become U+FFFD.
    """
    for number, raw in enumerate(iter(stream.readline, b""), start=1):
        if number == 1 and raw.startswith(BOM):
            raw = raw[len(BOM) :]
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        try:
            text = raw.decode("utf-8", errors=errors)
        except UnicodeDecodeError as e:
            raise NmtError(
                f"invalid UTF-8 at {where(name, number)} (byte {e.start + 1} of the line); "
                "fix the input or pass --errors replace"
            ) from None
        yield InputLine(number, text)


def chunks(lines: Iterator[InputLine], size: int) -> Iterator[tuple[list[InputLine], NmtError | None]]:
    """Groups of up to `size` lines; a read error ends the stream after the lines before it.

    The error is handed over with the last group instead of raised at once, so that
    the caller can translate and write everything before the bad line first.
    """
    group: list[InputLine] = []
    try:
        for line in lines:
            group.append(line)
            if len(group) == size:
                yield group, None
                group = []
    except NmtError as error:
        yield group, error
        return
    if group:
        yield group, None
