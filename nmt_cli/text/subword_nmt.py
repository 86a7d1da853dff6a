"""subword-nmt BPE (Sennrich et al., 2016): apply merge codes, and undo the `@@ ` joints.

Models trained with fairseq on WMT data (and its published checkpoints) segment
Moses-tokenized text with subword-nmt's `apply_bpe.py`; an imported model needs the
same segmentation, symbol for symbol. This is that algorithm, written out here
instead of depending on the `subword-nmt` package (it is about 60 lines, and the
tests check it against the package itself):

* Codes: an optional `#version: 0.2` header, then one merge `left right` per line,
  ranked by line order (the first occurrence of a duplicate pair wins).
* A word becomes its characters, the last one marked `</w>` (version 0.2; version
  0.1 appends a separate `</w>` symbol), and the lowest-ranked pair present is
  merged everywhere (left to right, non-overlapping) until no pair has a code.
* Every piece but the last of a word gets the separator (`@@`) appended.

Like fairseq's `--bpe subword_nmt`, no vocabulary filter or glossaries are used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from nmt_cli.errors import NmtError, where

END_OF_WORD = "</w>"
DEFAULT_SEPARATOR = "@@"
# Words whose segmentation is kept: text's frequent words fit many times over, while a
# stream of distinct words (names, numbers, noise) would otherwise grow the cache without end.
CACHED_WORDS = 2**16


@dataclass
class SubwordNmtBpe:
    """Loaded merge codes: tokenized line <-> pieces."""

    merge_ranks: dict[tuple[str, str], int]
    version: tuple[int, int] = (0, 2)
    separator: str = DEFAULT_SEPARATOR
    # Segmentations of words already seen (text repeats words a lot), up to CACHED_WORDS.
    _cache: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: str | Path, separator: str = DEFAULT_SEPARATOR) -> "SubwordNmtBpe":
        path = Path(path)
        if not path.is_file():
            raise NmtError(f"BPE codes not found: {path}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise NmtError(f"BPE codes are not valid UTF-8: {path} (byte {e.start})") from None
        return cls.from_text(text, path, separator)

    @classmethod
    def from_text(cls, text: str, path: str | Path, separator: str = DEFAULT_SEPARATOR) -> "SubwordNmtBpe":
        lines = text.rstrip("\n").split("\n")
        version, first_line = (0, 1), 1
        if lines and lines[0].startswith("#version:"):
            version, first_line = parse_version(lines[0], path), 2
            lines = lines[1:]
        if version not in ((0, 1), (0, 2)):
            raise NmtError(f"unsupported subword-nmt codes version {version}: {where(path, 1)}")
        merge_ranks: dict[tuple[str, str], int] = {}
        for offset, line in enumerate(lines):
            pair = tuple(line.strip("\r\n ").split(" "))
            if len(pair) != 2:
                raise NmtError(f"bad BPE codes line (expected 'left right'): {where(path, offset + first_line)}")
            merge_ranks.setdefault(pair, offset)  # a duplicate keeps its first rank
        return cls(merge_ranks, version, separator)

    def segment_word(self, word: str) -> tuple[str, ...]:
        """One word -> its BPE units (without separators)."""
        cached = self._cache.get(word)
        if cached is None:
            cached = apply_merges(word, self.merge_ranks, self.version)
            if len(self._cache) >= CACHED_WORDS:
                self._cache.clear()  # simpler and no slower than an LRU: frequent words come back at once
            self._cache[word] = cached
        return cached

    def encode(self, line: str) -> list[str]:
        """A tokenized line -> pieces, every non-final piece of a word ending in the separator."""
        pieces = []
        for word in line.strip("\r\n ").split(" "):
            if not word:  # runs of spaces
                continue
            units = self.segment_word(word)
            pieces.extend(unit + self.separator for unit in units[:-1])
            pieces.append(units[-1])
        return pieces

    def decode(self, pieces: list[str]) -> str:
        """Pieces -> tokenized line (fairseq's `--remove-bpe`: drop every `@@ `)."""
        return remove_bpe(" ".join(pieces), self.separator)


def parse_version(header: str, path: str | Path) -> tuple[int, int]:
    """`#version: 0.2` -> (0, 2); trailing `.0` parts are dropped as subword-nmt does."""
    number = re.sub(r"(\.0+)*$", "", header.split()[-1])
    try:
        parts = tuple(int(x) for x in number.split("."))
    except ValueError:
        raise NmtError(f"bad subword-nmt version header {header!r}: {where(path, 1)}") from None
    return parts if len(parts) == 2 else (parts + (0, 0))[:2]


def apply_merges(word: str, merge_ranks: dict[tuple[str, str], int], version: tuple[int, int]) -> tuple[str, ...]:
    """subword-nmt's `encode`: merge the best-ranked adjacent pair until none is mergeable."""
    if len(word) == 1:
        return (word,)
    if version == (0, 1):
        symbols = list(word) + [END_OF_WORD]
    else:
        symbols = list(word[:-1]) + [word[-1] + END_OF_WORD]
    while len(symbols) > 1:
        ranked = [(merge_ranks[pair], i, pair) for i, pair in enumerate(zip(symbols, symbols[1:])) if pair in merge_ranks]
        if not ranked:
            break
        best = min(ranked)[2]
        positions = [i for _, i, pair in ranked if pair == best]
        merged, i = [], 0
        for j in positions:
            if j < i:  # overlapping occurrence ("x x x"): its left symbol is already merged
                continue
            merged.extend(symbols[i:j])
            merged.append(best[0] + best[1])
            i = j + 2
        merged.extend(symbols[i:])
        symbols = merged
    # The end-of-word marker is not part of the output.
    if symbols[-1] == END_OF_WORD:
        symbols = symbols[:-1]
    elif symbols[-1].endswith(END_OF_WORD):
        symbols[-1] = symbols[-1][: -len(END_OF_WORD)]
    return tuple(symbols)


def remove_bpe(line: str, separator: str = DEFAULT_SEPARATOR) -> str:
    """Undo BPE joints exactly as fairseq's `post_process` for subword-nmt: drop `@@ `."""
    return (line + " ").replace(separator + " ", "").rstrip()
