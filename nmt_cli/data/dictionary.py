"""Dictionary: symbols <-> ids, with fairseq's layout of the special symbols.

The first four ids are always `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, exactly as in
fairseq, so that dictionaries (and models) move between the two toolkits with the
same ids. The file format is fairseq's `dict.txt`: one `symbol count` per line,
specials not listed, most frequent first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.errors import NmtError, first_difference, where

BOS, PAD, EOS, UNK = "<s>", "<pad>", "</s>", "<unk>"
BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIALS = (BOS, PAD, EOS, UNK)
OVERWRITE_FLAG = "#fairseq:overwrite"


@dataclass(frozen=True)
class DictLine:
    """One `symbol count [#fairseq:overwrite]` line of a `dict.txt`."""

    lineno: int
    symbol: str
    count: int
    overwrite: bool


def read_dict_lines(path: Path) -> list[DictLine]:
    """The lines of a `dict.txt`, read and split as fairseq's `Dictionary.add_from_file` does:
    lines end at `\\n`, `\\r\\n` or a lone `\\r` (the universal newlines of its text-mode
    `readlines`), never at the other separators `str.splitlines` honours, so a symbol may hold
    `\\u2028` or `\\x0c`; the count is the last space-separated field, so a symbol may hold spaces.
    A missing file, invalid UTF-8 or a line without a count is an NmtError naming it."""
    if not path.is_file():
        raise NmtError(f"dictionary not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")  # text mode: \r\n and \r arrive as \n
    except UnicodeDecodeError as e:
        raise NmtError(f"dictionary is not valid UTF-8: {path} (byte {e.start})") from None
    lines = text.split("\n")
    if lines[-1] == "":  # the final newline ends the last line; it does not start another
        lines.pop()
    entries = []
    for lineno, line in enumerate(lines, start=1):
        fields = line.rstrip().rsplit(" ", 1)
        overwrite = len(fields) == 2 and fields[1] == OVERWRITE_FLAG
        if overwrite:
            fields = fields[0].rsplit(" ", 1)
        count = _count_or_none(fields[1]) if len(fields) == 2 else None
        if count is None:
            raise NmtError(f"bad dictionary line (expected 'symbol count'): {where(path, lineno)}")
        entries.append(DictLine(lineno, fields[0], count, overwrite))
    return entries


def _count_or_none(field: str) -> int | None:
    try:
        return int(field) if field.lstrip("-").isdigit() else None
    except ValueError:  # "--5", or a digit int() does not read such as "²"
        return None


def check_same_symbols(subject: str, symbols: Sequence[str], checkpoint: str, expected: Sequence[str],
                       advice: str = "") -> None:
    """Raise unless `symbols` (those of `subject`, "the target dictionary of DATA") are
    `expected`, the symbols of `checkpoint`'s dictionary, id for id: with any other list
    the model's ids would mean other words. The one message for every such mismatch:
    "{subject} does not match checkpoint {checkpoint} (N vs M symbols; id I is X vs Y){advice}",
    `subject`'s value first."""
    if list(symbols) == list(expected):
        return
    difference = first_difference(symbols, expected)
    at = "" if difference is None else "; id {} is {!r} vs {!r}".format(*difference)
    raise NmtError(f"{subject} does not match checkpoint {checkpoint} "
                   f"({len(symbols)} vs {len(expected)} symbols{at}){advice}")


class Dictionary:
    """An ordered symbol table; ids are list positions."""

    def __init__(self, symbols: Sequence[str] = (), counts: Sequence[int] | None = None) -> None:
        self.symbols: list[str] = list(SPECIALS)
        self.counts: list[int] = [1] * len(SPECIALS)
        self.index: dict[str, int] = {s: i for i, s in enumerate(SPECIALS)}
        # What a token of text maps to: the index without the specials that start, pad and end
        # sentences (kept apart so that `encode` looks each token up once).
        self._text_index: dict[str, int] = {UNK: UNK_ID}
        counts = counts if counts is not None else [1] * len(symbols)
        for symbol, count in zip(symbols, counts, strict=True):
            self.add_symbol(symbol, count)

    bos, pad, eos, unk = BOS_ID, PAD_ID, EOS_ID, UNK_ID
    nspecial = len(SPECIALS)

    def __len__(self) -> int:
        return len(self.symbols)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dictionary) and self.symbols == other.symbols

    def __contains__(self, symbol: str) -> bool:
        return symbol in self.index

    def __getitem__(self, idx: int) -> str:
        return self.symbols[idx]

    def add_symbol(self, symbol: str, count: int = 1) -> int:
        """Add `symbol` (or add to its count); return its id."""
        if symbol in self.index:
            idx = self.index[symbol]
            self.counts[idx] += count
            return idx
        self.index[symbol] = self._text_index[symbol] = len(self.symbols)
        self.symbols.append(symbol)
        self.counts.append(count)
        return self.index[symbol]

    def encode(self, tokens: Iterable[str], append_eos: bool = True) -> list[int]:
        """Tokens -> ids (unknown tokens -> `<unk>`), with `</s>` appended.

        A token `<s>`, `<pad>` or `</s>` of the text is `<unk>` too: as its special id it
        would end the sentence there (`</s>`) or be masked out as padding (`<pad>`).
        """
        ids = [self._text_index.get(t, UNK_ID) for t in tokens]
        if append_eos:
            ids.append(EOS_ID)
        return ids

    def decode(self, ids: Iterable[int], strip_specials: bool = True) -> list[str]:
        """Ids -> tokens; stops at the first `</s>` and drops `<s>`/`<pad>` by default."""
        tokens = []
        for i in ids:
            i = int(i)
            if strip_specials and i == EOS_ID:
                break
            if strip_specials and i in (BOS_ID, PAD_ID):
                continue
            tokens.append(self.symbols[i])
        return tokens

    def save(self, path: str | Path) -> None:
        lines = [f"{s} {c}\n" for s, c in zip(self.symbols[self.nspecial:], self.counts[self.nspecial:])]
        Path(path).write_text("".join(lines), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "Dictionary":
        """Read a fairseq-format `dict.txt`; listed specials keep their fixed ids, a symbol
        listed twice is an error."""
        path = Path(path)
        symbols, counts, seen = [], [], set()
        for line in read_dict_lines(path):
            if line.symbol in SPECIALS:
                continue
            if line.symbol in seen:  # a set: a list lookup here made loading quadratic
                raise NmtError(f"duplicate symbol {line.symbol!r} in dictionary: {where(path, line.lineno)}")
            seen.add(line.symbol)
            symbols.append(line.symbol)
            counts.append(line.count)
        return cls(symbols, counts)

    @classmethod
    def build(
        cls,
        counter: Counter[str],
        threshold: int = 0,
        nwords: int = -1,
        padding_factor: int = 8,
    ) -> "Dictionary":
        """Build from token counts as fairseq does.

        Most frequent first (ties alphabetical), drop symbols seen fewer than
        `threshold` times, keep at most `nwords` symbols counting the four specials
        (fairseq's meaning; <= 0: all), then pad the size to a
        multiple of `padding_factor` with `madeupwordNNNN` (fast matrix shapes).
        """
        ordered = sorted(((s, c) for s, c in counter.items() if s not in SPECIALS), key=lambda sc: (-sc[1], sc[0]))
        ordered = [(s, c) for s, c in ordered if c >= threshold]
        if nwords > 0:
            ordered = ordered[: max(0, nwords - len(SPECIALS))]
        d = cls([s for s, _ in ordered], [c for _, c in ordered])
        i = 0
        while padding_factor > 1 and len(d) % padding_factor != 0:
            d.add_symbol(f"madeupword{i:04d}", 0)
            i += 1
        return d
