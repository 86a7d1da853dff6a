"""Training-pair filtering, as Moses' `clean-corpus-n.perl` does it.

Lengths are counted in tokens of the tokenized text (before BPE); a side of more than
CHARS_PER_TOKEN x --max-len characters (not whitespace alone) is too long without being
tokenized, which would cost some 35 times its size. Text has a few characters per token,
so this drops nothing that --max-len keeps but a single word of thousands of characters
(at the default --max-len, a side of more than 250,000 characters). The default
ratio limit is 9, Moses' own default: it removes only badly misaligned pairs.
(fairseq's WMT14 recipe passes 1.5, which also drops many legitimate pairs of
short sentences; recipes that want it can pass `--max-ratio 1.5`.)
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt_cli.errors import NmtError

# Why a pair was dropped; the keys of the drop counts in meta.json.
EMPTY, TOO_SHORT, TOO_LONG, RATIO = "empty", "too_short", "too_long", "ratio"
REASONS = (EMPTY, TOO_SHORT, TOO_LONG, RATIO)
CHARS_PER_TOKEN = 1000


@dataclass(frozen=True)
class CleanSettings:
    min_len: int = 1
    max_len: int = 250
    max_ratio: float = 9.0

    def __post_init__(self) -> None:
        if self.min_len < 1:
            raise NmtError(f"--min-len must be at least 1, got {self.min_len}")
        if self.max_len < self.min_len:
            raise NmtError(f"--max-len {self.max_len} is below --min-len {self.min_len}")
        if self.max_ratio < 1.0:
            raise NmtError(f"--max-ratio must be at least 1, got {self.max_ratio}")


def drop_reason(src_len: int, tgt_len: int, settings: CleanSettings) -> str | None:
    """Why a pair of `src_len` and `tgt_len` tokens is dropped, or None to keep it."""
    if src_len == 0 or tgt_len == 0:
        return EMPTY
    if min(src_len, tgt_len) < settings.min_len:
        return TOO_SHORT
    if max(src_len, tgt_len) > settings.max_len:
        return TOO_LONG
    if src_len / tgt_len > settings.max_ratio or tgt_len / src_len > settings.max_ratio:
        return RATIO
    return None


def too_long_to_tokenize(line: str, settings: CleanSettings) -> bool:
    """A raw side longer than any side --max-len keeps: more than CHARS_PER_TOKEN characters
    per token allowed, and more than whitespace (that tokenizes to nothing, an empty side)."""
    return len(line) > CHARS_PER_TOKEN * settings.max_len and not line.isspace()
