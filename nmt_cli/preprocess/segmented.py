"""Text that is already split into subword pieces: found, so that it is never segmented twice.

fairseq's recipes binarize text that subword-nmt (`qu@@ ick`) or sentencepiece
(`▁qu ick`) has already segmented. Moses tokenization of such text would split the
markers (`qu@@` -> `qu @ @`) and a second BPE would segment the pieces again, both
silently. `resolve_segmentation` looks at the start of the training files: with the
`auto` settings (the defaults) segmented text is taken as it is (no normalization, no
tokenization, no BPE: what fairseq-preprocess does); an explicit setting that would
corrupt it is refused, naming the flags to use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.config import PreprocessConfig
from nmt_cli.errors import NmtError
from nmt_cli.text.pipeline import SENTENCEPIECE_MARKER, SUBWORD_NMT_MARKER

SAMPLE_LINES = 1000
# A share of sampled lines this large with a marker cannot be ordinary text: a word
# ending in "@@" is all but absent from natural text, and sentencepiece marks the
# first piece of every line.
SUBWORD_NMT_SHARE = 0.02
SENTENCEPIECE_SHARE = 0.5
# The markers meta.json's segmented_input records, as translate reads them back.
SUBWORD_NMT, SENTENCEPIECE = SUBWORD_NMT_MARKER, SENTENCEPIECE_MARKER


@dataclass(frozen=True)
class Segmentation:
    """Evidence that a file is already segmented."""

    marker: str  # SUBWORD_NMT or SENTENCEPIECE
    path: Path
    line: int  # the first line holding the marker (1-based)

    def describe(self) -> str:
        kind = "subword-nmt '@@ '" if self.marker == SUBWORD_NMT else "sentencepiece '▁'"
        return f"{self.path} is already segmented ({kind} pieces, e.g. line {self.line})"


def find_segmentation(path: Path, sample_lines: int = SAMPLE_LINES) -> Segmentation | None:
    """Whether the first `sample_lines` non-empty lines of `path` are subword pieces."""
    subword_lines, sentencepiece_lines, seen = [], [], 0
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                tokens = line.split()
                if not tokens:
                    continue
                seen += 1
                if any(_continues(token) for token in tokens[:-1]):
                    subword_lines.append(number)
                if tokens[0].startswith(SENTENCEPIECE):
                    sentencepiece_lines.append(number)
                if seen >= sample_lines:
                    break
    except OSError:
        return None  # a missing or unreadable input is reported by the stage that needs it
    if seen and len(subword_lines) >= max(1, SUBWORD_NMT_SHARE * seen):
        return Segmentation(SUBWORD_NMT, path, subword_lines[0])
    if seen and len(sentencepiece_lines) >= SENTENCEPIECE_SHARE * seen:
        return Segmentation(SENTENCEPIECE, path, sentencepiece_lines[0])
    return None


def _continues(token: str) -> bool:
    """A subword-nmt piece continued by the next one: `qu@@` (a bare `@@` is a symbol, not a piece)."""
    return token.endswith("@@") and len(token) > 2 and token[-3] != "@"


def resolve_segmentation(cfg: PreprocessConfig) -> tuple[PreprocessConfig, str | None]:
    """`cfg` with its `auto` settings decided from the training text, and the marker of
    pre-segmented input (None for raw text)."""
    found = None
    for lang in (cfg.source_lang, cfg.target_lang):
        found = found or find_segmentation(Path(f"{cfg.trainpref}.{lang}"))
    if found is None:
        return dataclasses.replace(
            cfg, tokenizer="moses" if cfg.tokenizer == "auto" else cfg.tokenizer,
            bpe="sentencepiece" if cfg.bpe == "auto" else cfg.bpe,
            normalize_punctuation=True if cfg.normalize_punctuation is None else cfg.normalize_punctuation,
        ), None
    if cfg.tokenizer == "moses":
        raise NmtError(f"{found.describe()}: Moses would split its markers (qu@@ -> qu @ @); "
                       "use --tokenizer none --bpe none (or leave both out)")
    if cfg.bpe == "sentencepiece":
        raise NmtError(f"{found.describe()}: --bpe sentencepiece would segment the pieces again; "
                       "use --bpe none (or leave it out)")
    return dataclasses.replace(
        cfg, tokenizer="none", bpe="none",
        normalize_punctuation=False if cfg.normalize_punctuation is None else cfg.normalize_punctuation,
    ), found.marker
