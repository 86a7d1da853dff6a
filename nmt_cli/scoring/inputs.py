"""Reading references and hypotheses for scoring: plain text or `nmt translate` JSON lines.

Lines are split on `\\n` alone and strictly decoded as UTF-8 (see
`nmt_cli/text/reader.py`); trailing whitespace is then removed from every line,
exactly as the `sacrebleu` command line does, so that both report the same numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nmt_cli.config import HYP_FORMATS
from nmt_cli.errors import NmtError, where
from nmt_cli.text.reader import check_line_length, check_readable, read_lines, read_stream

STDIN = "-"
# Fields of an `nmt translate --output-format jsonl` record that hold the hypothesis, in order of preference.
JSONL_TEXT_FIELDS = ("hyp", "text")
# Optional field: the 1-based input line a record translates; checked so that reordered or lost
# records are an error rather than a silently misaligned score.
JSONL_LINE_FIELD = "line"


def display_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def read_text(path: str) -> list[str]:
    """All lines of a file (or stdin for `-`), without line endings; an error for a missing or empty input."""
    if path == STDIN:
        if sys.stdin.isatty():
            print("reading hypotheses from stdin (end with Ctrl-D; or give --hyp FILE)", file=sys.stderr)
        lines = list(read_stream(sys.stdin.buffer, display_name(path)))
    else:
        check_readable(Path(path))
        lines = list(read_lines(Path(path)))
    if not lines:
        raise NmtError(f"empty input: {display_name(path)}")
    return lines


def looks_like_jsonl(first_line: str) -> bool:
    """True when a line is a JSON object carrying a hypothesis field (what `auto` detection checks)."""
    if not first_line.lstrip().startswith("{"):
        return False
    try:
        record = json.loads(first_line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and any(isinstance(record.get(f), str) for f in JSONL_TEXT_FIELDS)


def hypothesis_from_record(line: str, name: str, lineno: int) -> str:
    """The hypothesis text of one JSON line, or an error naming the file and line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise NmtError(f"invalid JSON at {where(name, lineno)}: {error.msg}") from None
    if not isinstance(record, dict):
        raise NmtError(f"expected a JSON object at {where(name, lineno)}")
    number = record.get(JSONL_LINE_FIELD)
    if isinstance(number, int) and number != lineno:
        raise NmtError(
            f"record for input line {number} found at {where(name, lineno)}: records are out of order or missing"
        )
    for field in JSONL_TEXT_FIELDS:
        value = record.get(field)
        if isinstance(value, str):
            return value
    raise NmtError(f"no string field {' or '.join(map(repr, JSONL_TEXT_FIELDS))} at {where(name, lineno)}")


def read_hypotheses(path: str, hyp_format: str = "auto") -> list[str]:
    """Hypotheses, one per input line, from plain text or JSON lines (`hyp_format` auto|text|jsonl)."""
    if hyp_format not in HYP_FORMATS:
        raise NmtError(f"--hyp-format must be one of {', '.join(HYP_FORMATS)} (got {hyp_format!r})")
    lines = read_text(path)
    is_jsonl = hyp_format == "jsonl" or (hyp_format == "auto" and looks_like_jsonl(lines[0]))
    if is_jsonl:
        name = display_name(path)
        lines = [hypothesis_from_record(line, name, i) for i, line in enumerate(lines, start=1)]
    return checked_lengths([line.rstrip() for line in lines], path)


def read_references(path: str) -> list[str]:
    """Reference lines of a plain text file."""
    return checked_lengths([line.rstrip() for line in read_text(path)], path)


def checked_lengths(lines: list[str], path: str) -> list[str]:
    """`lines`, or an error naming the first too long to score (sacreBLEU's n-gram counts
    and TER's edit distance of a line cost many times its size)."""
    for number, line in enumerate(lines, start=1):
        check_line_length(line, number, display_name(path), "score")
    return lines


def check_same_length(named_streams: list[tuple[str, list[str]]]) -> None:
    """Every stream must have as many lines as the first; the error names both files and counts."""
    first_name, first = named_streams[0]
    for name, stream in named_streams[1:]:
        if len(stream) != len(first):
            raise NmtError(
                f"line counts differ: {display_name(first_name)} has {len(first)} lines, "
                f"{display_name(name)} has {len(stream)}"
            )
