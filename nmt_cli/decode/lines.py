"""Reading input lines for `translate`: streaming, UTF-8 checked, numbered, and grouped
into chunks that end early when the writer has sent no more yet.

Lines are split as `text/reader.py` splits them (on `\\n` only; a trailing `\\r` and a
UTF-8 byte order mark at the very start are dropped), so the output has exactly one
line per input line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from nmt_cli.errors import NmtError
from nmt_cli.text.reader import ArrivingInput, decode_utf8, stream_lines, without_line_end


@dataclass(frozen=True)
class InputLine:
    number: int  # 1-based
    text: str
    # From the side files of guided decoding (decode/guided.py): the line of the same number.
    prefix: str | None = None  # --prefix-file
    reference: str | None = None  # --reference-file


def read_lines(stream: BinaryIO | ArrivingInput, name: str, errors: str) -> Iterator[InputLine]:
    """Yield the lines of `stream` as they arrive.

    errors="strict": invalid UTF-8 raises NmtError naming the line (lines before it
    have been yielded); "replace": invalid bytes become U+FFFD. NUL bytes are text here.
    """
    for number, raw in stream_lines(stream):
        text = decode_utf8(without_line_end(raw), name, number, errors, remedy="fix the input or pass --errors replace")
        yield InputLine(number, text)


def chunks(lines: Iterator[InputLine], size: int,
           line_ready: Callable[[], bool] = lambda: True) -> Iterator[tuple[list[InputLine], NmtError | None]]:
    """Groups of up to `size` lines; a group also ends early where `line_ready` says the
    next line is not at hand yet, so that a writer waiting for answers gets them. A read
    error ends the stream after the lines before it.

    The error is handed over with the last group instead of raised at once, so that
    the caller can translate and write everything before the bad line first.
    """
    group: list[InputLine] = []
    try:
        for line in lines:
            group.append(line)
            if len(group) == size or not line_ready():
                yield group, None
                group = []
    except NmtError as error:
        yield group, error
        return
    if group:
        yield group, None
