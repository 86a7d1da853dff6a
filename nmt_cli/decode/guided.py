"""What guided decoding reads from each input line, and how alignments become words.

Input (GuidedConfig): a plain line is the source; with --constraints it is
`source<TAB>phrase<TAB>phrase...`; with --score-reference `source<TAB>reference`
(or the source only, with --reference-file). A prefix comes from --prefix-file, one
line per input line. With --json-input every line is one JSON object instead:
`{"text": ..., "prefix": ..., "constraints": [...], "reference": ...}`.

Alignments are found between subword pieces (decode/forced.py); they are reported
between words: the words of the tokenized text, which are the whitespace-separated
words of the text itself when the pipeline has no word tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from typing import BinaryIO

from nmt_cli.config import GuidedConfig
from nmt_cli.decode.lines import InputLine, read_lines
from nmt_cli.errors import NmtError, where
from nmt_cli.json_text import lone_surrogate_at
from nmt_cli.text.bpe import BpeModel
from nmt_cli.text.subword_nmt import SubwordNmtBpe

# sentencepiece's mark of a piece that starts a word.
WORD_START = "\u2581"


@dataclass(frozen=True)
class GuidedLine:
    """One input line's parts."""

    source: str
    prefix: str | None = None  # target text the output must start with
    constraints: tuple[str, ...] = ()  # target phrases the output must contain
    reference: str | None = None  # the translation to score (--score-reference)


def parse_line(line: InputLine, cfg: GuidedConfig, source_name: str) -> GuidedLine:
    """The parts of `line` under `cfg` (see the module docstring); NmtError naming the line."""
    if cfg.json_input:
        return _parse_json(line, source_name)
    text, prefix, reference = line.text, line.prefix, line.reference
    constraints: tuple[str, ...] = ()
    if cfg.constraints is not None:
        text, *phrases = text.split("\t")
        constraints = tuple(p for p in phrases if p.strip())
    elif cfg.score_reference and cfg.reference_file is None:
        fields = text.split("\t")
        if text.strip() and len(fields) != 2:
            raise NmtError(f"--score-reference: expected source<TAB>reference (2 fields), got {len(fields)} "
                           f"at {where(source_name, line.number)}")
        text, reference = fields[0], fields[-1] if len(fields) == 2 else ""
    return GuidedLine(text, prefix or None, constraints, reference)


def _parse_json(line: InputLine, source_name: str) -> GuidedLine:
    if not line.text.strip():
        return GuidedLine("")
    at = where(source_name, line.number)
    try:
        record = json.loads(line.text)
    except json.JSONDecodeError as error:
        raise NmtError(f"--json-input: not JSON ({error.msg}) at {at}") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise NmtError(f"--json-input: expected an object with a \"text\" string at {at}")
    for key in ("prefix", "reference"):
        if record.get(key) is not None and not isinstance(record[key], str):
            raise NmtError(f"--json-input: \"{key}\" must be a string at {at}")
    constraints = record.get("constraints") or []
    if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
        raise NmtError(f"--json-input: \"constraints\" must be a list of strings at {at}")
    # JSON's \ud800-style escapes can give lone surrogates, which are no text (nor UTF-8).
    for key, values in (("text", [record["text"]]), ("prefix", [record.get("prefix") or ""]),
                        ("constraints", constraints), ("reference", [record.get("reference") or ""])):
        if any(lone_surrogate_at(value) is not None for value in values):
            raise NmtError(f"--json-input: \"{key}\" holds a lone surrogate escape (not text) at {at}")
    return GuidedLine(record["text"], record.get("prefix") or None, tuple(c for c in constraints if c.strip()),
                      record.get("reference"))


def with_side_file(lines: Iterator[InputLine], side: BinaryIO, side_name: str, field: str,
                   errors: str) -> Iterator[InputLine]:
    """`lines` with field `field` ("prefix" or "reference") set from the line of the same
    number of `side`; NmtError when the two have different numbers of lines."""
    side_lines = read_lines(side, side_name, errors)
    count = 0
    for line in lines:
        side_line = next(side_lines, None)
        if side_line is None:
            raise NmtError(f"{side_name} has {count} lines but the input has more (line {line.number})")
        count += 1
        yield replace(line, **{field: side_line.text})
    if next(side_lines, None) is not None:
        raise NmtError(f"{side_name} has more lines than the input ({count})")


def word_indices(pieces: list[str], segmenter: object | None, whole_words: Collection[int] = ()) -> list[int]:
    """The word (0-based) of each piece of a tokenized line segmented by `segmenter`; the
    pieces at `whole_words` (--replace-unk's copies) are words of their own."""
    words, word = [], -1
    for i, piece in enumerate(pieces):
        if isinstance(segmenter, SubwordNmtBpe):
            starts = i == 0 or not pieces[i - 1].endswith(segmenter.separator)
        else:
            starts = not isinstance(segmenter, BpeModel) or i == 0 or piece.startswith(WORD_START)
        word += starts or i in whole_words or i - 1 in whole_words
        words.append(word)
    return words


def word_alignment(source_positions: list[int], source_words: list[int], target_words: list[int]) -> list[tuple[int, int]]:
    """(source word, target word) pairs from each target piece's most attended source
    piece, each pair once, in target order."""
    pairs: list[tuple[int, int]] = []
    for target, source in enumerate(source_positions):
        pair = (source_words[source], target_words[target])
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def format_alignment(pairs: list[tuple[int, int]]) -> str:
    """fairseq's `A-` line body: `src-tgt` pairs separated by spaces."""
    return " ".join(f"{s}-{t}" for s, t in pairs)


def replace_unknowns(target_pieces: list[str], source_pieces: list[str], source_positions: list[int],
                     source_segmenter: object | None, unk: str) -> dict[int, str]:
    """The source word to put in place of each `unk` of `target_pieces`, by its index: the
    whole source word (of `source_pieces`, as segmented before the dictionary lookup, so a
    word the dictionary lacks is still there) that its piece attends most."""
    source_words = word_indices(source_pieces, source_segmenter)
    copies = {}
    for i, (piece, source) in enumerate(zip(target_pieces, source_positions)):
        if piece == unk:
            word = source_words[source]
            copies[i] = word_text([p for p, w in zip(source_pieces, source_words) if w == word], source_segmenter)
    return copies


def word_text(pieces: list[str], segmenter: object | None) -> str:
    """The word that one word's pieces spell, their subword marks taken off (not by the
    segmenter's decode: sentencepiece turns a piece it lacks into ` ⁇ `)."""
    if isinstance(segmenter, SubwordNmtBpe):
        return "".join(piece.removesuffix(segmenter.separator) for piece in pieces)
    if isinstance(segmenter, BpeModel):
        return "".join(pieces).replace(WORD_START, "")
    return "".join(pieces)


def as_piece(word: str, segmenter: object | None) -> str:
    """A copied word as one target piece that starts a word (--output-format bpe)."""
    return WORD_START + word if isinstance(segmenter, BpeModel) else word
