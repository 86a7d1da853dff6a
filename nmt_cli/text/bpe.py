"""BPE with sentencepiece: learn a model from tokenized text, segment and restore lines.

sentencepiece runs on Moses-tokenized text with its own normalization turned off
(`identity`), so `decode(encode(line)) == line` for every canonical tokenized
line (tokens separated by single spaces): pieces that start a word carry `▁`,
which is how decoding knows where the spaces go. One consequence: a literal
U+2581 (`▁`) in the input text is read back as a word boundary.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

from nmt_cli.errors import NmtError
from nmt_cli.staging import replace_atomically

# sentencepiece's learned model depends on its thread count; a fixed count keeps
# the model (and everything after it) identical whatever --workers is.
TRAIN_THREADS = 4
# sentencepiece parses its sizes as C ints; a larger value fails inside it with a traceback.
SENTENCEPIECE_MAX_INT = 2**31 - 1


def learn_bpe(
    sentences: Iterable[str],
    model_path: Path,
    vocab_size: int,
    sample_size: int,
    seed: int,
) -> None:
    """Learn a BPE model from `sentences` and write it to `model_path`.

    At most `sample_size` sentences (a seeded random sample, <= 0: all) are kept in
    memory, so arbitrarily large corpora can be streamed through `sentences`.
    The same sentences, size and seed give a byte-identical model file.
    """
    if vocab_size < 2:
        raise NmtError(f"BPE vocabulary size must be at least 2, got {vocab_size}")
    check_sentencepiece_sizes(vocab_size, sample_size)
    spm.set_random_generator_seed(seed)
    # Serialized in memory: a model written by sentencepiece itself records its output path.
    model = io.BytesIO()
    source = _RecordingIterator(sentences)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=source,
            model_writer=model,
            model_type="bpe",
            vocab_size=vocab_size,
            character_coverage=1.0,
            input_sentence_size=max(sample_size, 0),
            shuffle_input_sentence=True,
            normalization_rule_name="identity",
            byte_fallback=False,
            num_threads=TRAIN_THREADS,
            minloglevel=2,
        )
    except (RuntimeError, SystemError) as e:  # older sentencepiece releases raise SystemError
        if source.error is not None:  # our own error (a bad input line), not sentencepiece's
            raise source.error from None
        if "[!sentences_.empty()]" in str(e):
            raise NmtError("no text to learn BPE from: the input has no non-empty lines") from None
        too_high = re.search(r"Vocabulary size too high \((\d+)\).*<= (\d+)", str(e))
        if too_high:
            raise NmtError(
                f"BPE vocabulary size {too_high.group(1)} is too large for this training text "
                f"(at most {too_high.group(2)}); use a smaller --bpe-size/--vocab-size"
            ) from None
        raise NmtError(f"sentencepiece could not learn a model: {e}") from None
    _write_file(Path(model_path), model.getvalue())


def check_sentencepiece_sizes(vocab_size: int, sample_size: int, flags: str = "--bpe-size/--vocab-size",
                              sample_flag: str = "--bpe-sample/--sample") -> None:
    """NmtError for a size beyond what sentencepiece can take."""
    for flag, value in ((flags, vocab_size), (sample_flag, sample_size)):
        if value > SENTENCEPIECE_MAX_INT:
            raise NmtError(f"{flag} must be at most {SENTENCEPIECE_MAX_INT} (sentencepiece's limit; got {value})")


class _RecordingIterator:
    """`sentences`, remembering the exception they raised (an `NmtError` for a bad line).

    sentencepiece turns an exception of the iterator it consumes into a RuntimeError whose
    message holds a Python traceback; `learn_bpe` re-raises the original instead.
    """

    def __init__(self, sentences: Iterable[str]) -> None:
        self._sentences = iter(sentences)
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        try:
            return next(self._sentences)
        except StopIteration:
            raise
        except BaseException as error:  # KeyboardInterrupt too: it must stay an interrupt
            self.error = error
            raise


def _write_file(path: Path, data: bytes) -> None:
    """Write under a temporary name, then rename: the model never exists half-written."""
    try:
        replace_atomically(path, lambda tmp: tmp.write_bytes(data))
    except OSError as error:
        raise NmtError(f"cannot write {path}: {error.strerror or error}") from None


class BpeModel:
    """A loaded sentencepiece model: tokenized line <-> pieces."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        if not path.is_file():
            raise NmtError(f"BPE model not found: {path}")
        self.path = path
        self._sp = spm.SentencePieceProcessor()
        try:
            # From its bytes: sentencepiece takes a path only as UTF-8 text, and a path name may not be.
            self._sp.load(model_proto=path.read_bytes())
        except OSError as error:
            raise NmtError(f"cannot read {path}: {error.strerror or error}") from None
        except RuntimeError:
            raise NmtError(f"not a sentencepiece model: {path}") from None

    def size(self) -> int:
        """Number of pieces in the model."""
        return self._sp.get_piece_size()

    def encode(self, line: str) -> list[str]:
        return self._sp.encode(line, out_type=str)

    def decode(self, pieces: list[str]) -> str:
        return self._sp.decode_pieces(pieces)

    def encode_lines(self, lines: list[str]) -> list[list[str]]:
        """The pieces of each line, in one call (a call per line costs more than short lines' encoding).

        One thread: preprocessing's parallelism is its worker processes.
        """
        return self._sp.encode(lines, out_type=str, num_threads=1)
