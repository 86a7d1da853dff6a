"""The Python API: load a model once, translate lists of sentences.

    import nmt_cli
    model = nmt_cli.load("run/")                      # a run directory or a checkpoint file
    model.translate(["A man is riding a bike."], beam=4, lenpen=0.6)   # -> ["Ein Mann ..."]
    model.translate_scored(["..."], nbest=2)[0].hypotheses             # text and score of each

Raw text in, detokenized text out, exactly as `nmt translate` gives for the same lines
and options (it is the same code: `decode/translator.py`). One output per input, in
order; an empty or blank string gives an empty string. A `Model` may be shared between
threads: calls take a lock around the model, so they run one at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_cli.checkpoints.names import resolve_checkpoint
from nmt_cli.config import DecodeConfig, TranslateConfig
from nmt_cli.json_text import lone_surrogate_at

if TYPE_CHECKING:  # torch is imported when a model is loaded, not with nmt_cli
    from nmt_cli.decode.translator import Translation, Translator

# The decoding settings a call may change (the fields of DecodeConfig).
DECODE_OPTIONS = tuple(field.name for field in dataclasses.fields(DecodeConfig))
# Translators kept for recently used decoding settings (each may hold CUDA graphs).
_KEPT_SETTINGS = 16
_log = logging.getLogger("nmt_cli")


@dataclass(frozen=True)
class Hypothesis:
    text: str  # detokenized
    score: float | None  # the length-normalized log-probability search ranks by; None if not finite


@dataclass(frozen=True)
class Result:
    """The hypotheses of one input sentence, best first (none for a blank input)."""

    hypotheses: tuple[Hypothesis, ...]

    @property
    def text(self) -> str:
        return self.hypotheses[0].text if self.hypotheses else ""

    @property
    def score(self) -> float | None:
        return self.hypotheses[0].score if self.hypotheses else None


def check_texts(texts: Any) -> list[str]:
    """`texts` as a list of one-line strings, or TypeError/ValueError saying what is wrong."""
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a list of strings, not a single string (wrap it: [text])")
    if not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a list of strings (got {type(texts).__name__})")
    for number, text in enumerate(texts, 1):
        if not isinstance(text, str):
            raise TypeError(f"texts item {number} is {type(text).__name__}, not str")
        if "\n" in text or "\r" in text:
            raise ValueError(f"texts item {number} has a line break; pass one sentence per item")
        surrogate = lone_surrogate_at(text)
        if surrogate is not None:
            raise ValueError(f"texts item {number} is not valid Unicode (character {surrogate + 1} is a lone "
                             "surrogate)")
    return list(texts)


class Model:
    """A loaded model (or ensemble) with its dictionaries and text pipelines."""

    def __init__(self, cfg: TranslateConfig, warn: Callable[[str], None] | None = None) -> None:
        from nmt_cli.decode.translator import Translator, prepare_process

        prepare_process(cfg)
        self.cfg = cfg
        self._translator = Translator(cfg, warn=warn or _log.warning)
        self._by_settings: OrderedDict[DecodeConfig, Translator] = OrderedDict({cfg.decode: self._translator})
        self._lock = threading.Lock()

    @property
    def source_lang(self) -> str:
        return self._translator.models.source_lang

    @property
    def target_lang(self) -> str:
        return self._translator.models.target_lang

    def decode_config(self, **options: Any) -> DecodeConfig:
        """The model's decoding settings with `options` (DecodeConfig field names) changed;
        NmtError for a bad value, TypeError for an unknown name."""
        unknown = sorted(set(options) - set(DECODE_OPTIONS))
        if unknown:
            raise TypeError(f"unknown decoding option(s) {', '.join(unknown)}; known: {', '.join(DECODE_OPTIONS)}")
        decode = dataclasses.replace(self.cfg.decode, **options)
        if self.cfg.engine == "ctranslate2":  # refused here, by name, rather than when its batch runs
            from nmt_cli.decode.ctranslate2_engine import check_engine_options

            check_engine_options(dataclasses.replace(self.cfg, decode=decode))
        return decode

    def translate(self, texts: Sequence[str], **options: Any) -> list[str]:
        """The best translation of each text, in order. `options`: beam, nbest, lenpen,
        lenpen_style, max_len_a, max_len_b, min_len, ... (`nmt translate`'s flags, as names)."""
        return [result.text for result in self.translate_scored(texts, **options)]

    def translate_scored(self, texts: Sequence[str], **options: Any) -> list[Result]:
        """Like `translate`, with the `nbest` hypotheses of each text and their scores."""
        texts = check_texts(texts)
        decode = self.decode_config(**options)
        return self.translate_encoded(texts, self.encode(texts), decode)

    def encode(self, texts: list[str]) -> list[list[int] | None]:
        """Source ids of each text (None: blank), as `nmt translate` makes them."""
        from nmt_cli.decode.lines import InputLine

        # The text pipeline is pure, so encoding needs no lock (the server encodes off the model's thread).
        return [self._translator.source_ids(InputLine(number, text), "<input>") for number, text in enumerate(texts, 1)]

    def translate_encoded(self, texts: list[str], encoded: list[list[int] | None], decode: DecodeConfig) -> list[Result]:
        """Translate texts already encoded by `encode`, searching with `decode`."""
        from nmt_cli.decode.lines import InputLine

        lines = [InputLine(number, text) for number, text in enumerate(texts, 1)]
        with self._lock:
            translator = self._translator_for(decode)
            translator.restart_sampling()
            translations = translator.translate_ids(lines, encoded, "<input>")
            return [self._result(translator, translation) for translation in translations]

    def _translator_for(self, decode: DecodeConfig) -> Translator:
        translator = self._by_settings.get(decode)
        if translator is None:
            translator = self._translator.with_decode(decode)
            self._by_settings[decode] = translator
            while len(self._by_settings) > _KEPT_SETTINGS:
                self._by_settings.popitem(last=False)
        self._by_settings.move_to_end(decode)
        return translator

    @staticmethod
    def _result(translator: Translator, translation: Translation) -> Result:
        return Result(tuple(
            Hypothesis(translator.hypothesis_text(hyp), hyp.score if math.isfinite(hyp.score) else None)
            for hyp in translation.hypotheses
        ))


def load(path: str | Path, *, device: str = "cpu", precision: str = "fp32", threads: int | None = None,
         max_tokens: int | None = None, batch_size: int | None = None, data_bin: str | None = None,
         engine: str = "nmt", warn: Callable[[str], None] | None = None, **decode_options: Any) -> Model:
    """Load a checkpoint file or a run directory (its checkpoint_best.pt, else checkpoint_last.pt);
    with engine="ctranslate2" also a directory of `nmt export --format ctranslate2`.

    `decode_options` (beam=4, lenpen=0.6, ...) become the defaults of every call; `device`,
    `precision`, `threads`, `max_tokens`, `batch_size`, `data_bin` and `engine` are those of
    `nmt translate`. Warnings (a truncated source) go to `warn`, by default the "nmt_cli" logger.
    As `nmt translate` does, loading sets the process's torch threads (when `threads` is
    given) and torch's seed.
    """
    unknown = sorted(set(decode_options) - set(DECODE_OPTIONS))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; decoding options: {', '.join(DECODE_OPTIONS)}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a Path (got {type(path).__name__})")
    # CTranslate2's engine resolves its --path itself: an export directory, or a checkpoint's cached export.
    checkpoint = str(path) if engine == "ctranslate2" else str(resolve_checkpoint(Path(path)))
    cfg = TranslateConfig(
        checkpoints=(checkpoint,), data_bin=data_bin, decode=DecodeConfig(**decode_options), max_tokens=max_tokens,
        batch_size=batch_size, device=device, threads=threads, precision=precision, engine=engine,
    )
    return Model(cfg, warn)
