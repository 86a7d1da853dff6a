"""The preprocessing of one language, rebuilt from a data-bin/ (or run) directory.

`translate` builds one `TextPipeline` per side at start-up and calls `encode` /
`decode` per line; construction loads the tokenizer and the BPE model once.
meta.json's `bpe` entry is `null` (pre-segmented text), a sentencepiece model
(`{"type": "sentencepiece", "model": ...}` or per side `model_src`/`model_tgt`),
or subword-nmt codes (`{"type": "subword_nmt", "codes": ..., "separator": "@@"}`,
for models imported from fairseq). `"marian": true` beside a sentencepiece model
segments and restores text as Hugging Face's MarianTokenizer (models imported from Marian).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Protocol

from nmt_cli.data.dictionary import UNK
from nmt_cli.data.meta import read_meta
from nmt_cli.errors import NmtError
from nmt_cli.text.bpe import BpeModel
from nmt_cli.text.subword_nmt import DEFAULT_SEPARATOR, SubwordNmtBpe, remove_bpe
from nmt_cli.text.tokenizer import Tokenizer, TokenizerSettings


class Segmenter(Protocol):
    """Tokenized line <-> subword pieces."""

    def encode(self, line: str) -> list[str]: ...

    def decode(self, pieces: list[str]) -> str: ...


class TextPipeline:
    """Raw line -> pieces (normalize, tokenize, BPE) and pieces -> raw-ish line."""

    def __init__(self, tokenizer: TokenizerSettings, bpe_model: Path | None = None, bpe: Segmenter | None = None) -> None:
        """`bpe_model`: a sentencepiece model file; or pass any loaded `bpe` segmenter."""
        if bpe_model is not None and bpe is not None:
            raise ValueError("pass bpe_model or bpe, not both")
        self.tokenizer = Tokenizer(tokenizer)
        self.bpe: Segmenter | None = BpeModel(bpe_model) if bpe_model is not None else bpe

    @classmethod
    def from_data_bin(cls, data_bin_dir: str | Path, lang: str) -> "TextPipeline":
        """The exact text processing `nmt preprocess` applied to language `lang`."""
        directory = Path(data_bin_dir)
        meta = read_meta(directory)
        sides = {meta.get("source_lang"): "src", meta.get("target_lang"): "tgt"}
        if lang not in sides:
            raise NmtError(
                f"language {lang!r} is not in {directory / 'meta.json'} "
                f"(it has {meta.get('source_lang')} and {meta.get('target_lang')})"
            )
        tokenizer, bpe = meta.get("tokenizer") or {"name": "none"}, meta.get("bpe")
        if not isinstance(tokenizer, dict) or not (bpe is None or isinstance(bpe, dict)):
            raise NmtError(f"{directory / 'meta.json'}: 'tokenizer' must be a JSON object and 'bpe' an object or null")
        try:
            settings = TokenizerSettings.from_meta(tokenizer, lang)
        except NmtError as error:
            raise NmtError(f"{directory / 'meta.json'}: {error}") from None
        if bpe and bpe.get("type") == "subword_nmt":
            codes = directory / bpe.get("codes", "bpe.codes")
            return cls(settings, bpe=SubwordNmtBpe.load(codes, bpe.get("separator", DEFAULT_SEPARATOR)))
        marker = meta.get("segmented_input")
        if not bpe and marker in (SUBWORD_NMT_MARKER, SENTENCEPIECE_MARKER):
            return cls(settings, bpe=PresegmentedPieces(marker))
        model = bpe_model_path(directory, meta, sides[lang])
        if model is not None and bpe.get("marian"):
            return cls(settings, bpe=MarianPieces(BpeModel(model)))
        return cls(settings, model)

    def encode(self, line: str) -> list[str]:
        tokenized = self.tokenizer.tokenize(line)
        return self.bpe.encode(tokenized) if self.bpe is not None else tokenized.split()

    def join_pieces(self, pieces: list[str]) -> str:
        """Pieces -> the tokenized line they segment (BPE removed, not detokenized)."""
        return self.bpe.decode(pieces) if self.bpe is not None else " ".join(pieces)

    def decode(self, pieces: list[str], whole_words: Collection[int] = ()) -> str:
        """Pieces -> detokenized line. The pieces at `whole_words` (--replace-unk's copies of
        source words) are words as they are: the pieces between them are joined apart (a
        sentencepiece model would keep a word it lacks verbatim, `▁` and all, glued to the
        word before)."""
        words, run = [], []
        for i, piece in enumerate(pieces):
            if i in whole_words:
                words += [self.join_pieces(run), piece]
                run = []
            else:
                run.append(piece)
        words.append(self.join_pieces(run))
        return self.tokenizer.detokenize(" ".join(words).split())


SUBWORD_NMT_MARKER = "@@ "
SENTENCEPIECE_MARKER = "▁"


class PresegmentedPieces:
    """Pieces of text that was segmented before preprocessing (meta.json's `segmented_input`):
    input is taken as pieces already, output pieces are joined back into words."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def encode(self, line: str) -> list[str]:
        return line.split()

    def decode(self, pieces: list[str]) -> str:
        return remove_bpe_symbols(" ".join(pieces), "sentencepiece" if self.marker == SENTENCEPIECE_MARKER else "@@ ")


def remove_bpe_symbols(text: str, symbol: str | None) -> str:
    """fairseq's `post_process` of space-separated pieces, for the values of `--remove-bpe`
    nmt takes (None: the text as it is)."""
    if symbol == "sentencepiece":
        return text.replace(" ", "").replace(SENTENCEPIECE_MARKER, " ").strip()
    if symbol in ("@@ ", "subword_nmt"):
        return remove_bpe(text)
    if symbol == "@@":  # fairseq removes the bare marker wherever it is
        return (text + " ").replace(symbol, "").rstrip()
    return text


class MarianPieces:
    """A sentencepiece model used as Hugging Face's MarianTokenizer uses it (models imported
    from Marian): a line's leading `>>xx<<` (the target language of a multilingual OPUS-MT
    model) stays one piece; output pieces lose `<unk>` (skip_special_tokens), are decoded
    by the model, and any `▁` left (a piece the model lacks) becomes a space."""

    def __init__(self, model: BpeModel) -> None:
        self.model = model

    def encode(self, line: str) -> list[str]:
        end = line.find("<<") if line.startswith(">>") else -1
        if end == -1:
            return self.model.encode(line)
        return [line[: end + 2], *self.model.encode(line[end + 2:])]

    def decode(self, pieces: list[str]) -> str:
        text = self.model.decode([piece for piece in pieces if piece != UNK])
        return text.replace(SENTENCEPIECE_MARKER, " ").strip()


def bpe_model_path(directory: Path, meta: dict, side: str) -> Path | None:
    """The BPE model file of one side ("src" or "tgt"), or None for pre-segmented text."""
    bpe = meta.get("bpe")
    if not bpe:
        return None
    if bpe.get("type", "sentencepiece") != "sentencepiece":
        raise NmtError(f"unknown BPE type {bpe.get('type')!r} in {directory / 'meta.json'}")
    name = bpe.get("model") or bpe.get(f"model_{side}")
    if not name:
        raise NmtError(f"meta.json in {directory} names no BPE model for the {side} side")
    return directory / name
