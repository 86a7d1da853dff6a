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
# The pieces of every model besides the text's (sentencepiece's defaults, no <pad>).
SPECIAL_PIECES = ("<unk>", "<s>", "</s>")
# The fewest pieces any text can be learned with: the special ones, ▁ (a word's start) and one character.
MIN_VOCAB_SIZE = len(SPECIAL_PIECES) + 2
# sentencepiece refuses to sample 1 to 100 sentences.
MIN_SAMPLE = 101
# The longest line sentencepiece learns from, in bytes: its upper bound for max_sentence_length.
# Its default (4192) skips longer lines silently; the sample bounds how many lines it holds.
MAX_SENTENCE_BYTES = 1 << 30


def learn_bpe(
    sentences: Iterable[str],
    model_path: Path,
    vocab_size: int,
    sample_size: int,
    seed: int,
    *,
    size_flag: str = "--vocab-size",
    sample_flag: str = "--sample",
    text: str = "this training text",
) -> None:
    """Learn a BPE model from `sentences` and write it to `model_path`.

    At most `sample_size` sentences (a seeded random sample, 0: all) are kept in
    memory, so arbitrarily large corpora can be streamed through `sentences`.
    The same sentences, size and seed give a byte-identical model file. Errors name
    the sizes by `size_flag` and `sample_flag`, and the sentences as `text`.
    """
    check_sentencepiece_sizes(vocab_size, sample_size, size_flag, sample_flag)
    spm.set_random_generator_seed(seed)
    # Serialized in memory: a model written by sentencepiece itself records its output path.
    model = io.BytesIO()
    source = _RecordingIterator(sentences, text)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=source,
            model_writer=model,
            model_type="bpe",
            vocab_size=vocab_size,
            character_coverage=1.0,
            input_sentence_size=sample_size,
            shuffle_input_sentence=True,
            max_sentence_length=MAX_SENTENCE_BYTES,
            normalization_rule_name="identity",
            byte_fallback=False,
            num_threads=TRAIN_THREADS,
            minloglevel=2,
        )
    except (RuntimeError, SystemError) as e:  # older sentencepiece releases raise SystemError
        if source.error is not None:  # our own error (a bad input line), not sentencepiece's
            raise source.error from None
        raise NmtError(_sentencepiece_failure(str(e), vocab_size, size_flag, text)) from None
    _write_file(Path(model_path), model.getvalue())


def _sentencepiece_failure(message: str, vocab_size: int, size_flag: str, text: str) -> str:
    """The line for a failure of sentencepiece's training, in nmt's terms where its `message` is known."""
    if "[!sentences_.empty()]" in message or "[(all_chars_count) > (0)]" in message:
        return f"no text to learn BPE from: every line of {text} is empty or blank"
    # sentencepiece's "N vs M": M counts one piece per character, ▁ included, and the special pieces.
    too_small = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", message)
    if too_small:
        needed = int(too_small.group(1))
        return (f"{size_flag} {vocab_size} is too small for {text}: it needs at least {needed}, a piece for each "
                f"of its {needed - len(SPECIAL_PIECES)} distinct characters (▁, which starts each word, included) "
                f"and {len(SPECIAL_PIECES)} for {', '.join(SPECIAL_PIECES)}")
    too_high = re.search(r"Vocabulary size too high \(\d+\).*<= (\d+)", message)
    if too_high:
        return (f"{size_flag} {vocab_size} is too large for {text} (at most {too_high.group(1)}: "
                "every piece BPE can make of it)")
    return f"sentencepiece could not learn a model: {message}"


def check_sentencepiece_sizes(vocab_size: int, sample_size: int, size_flag: str, sample_flag: str) -> None:
    """NmtError for a BPE size or sample size (given as `size_flag`, `sample_flag`) that no text can be learned with."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise NmtError(f"{size_flag} {vocab_size} is too small: BPE needs at least {MIN_VOCAB_SIZE} pieces "
                       f"({', '.join(SPECIAL_PIECES)}, ▁ for a word's start and one character)")
    if sample_size < 0 or 0 < sample_size < MIN_SAMPLE:
        raise NmtError(f"{sample_flag} must be 0 (all sentences) or at least {MIN_SAMPLE} "
                       f"(sentencepiece's smallest sample; got {sample_size})")
    for flag, value in ((size_flag, vocab_size), (sample_flag, sample_size)):
        if value > SENTENCEPIECE_MAX_INT:
            raise NmtError(f"{flag} must be at most {SENTENCEPIECE_MAX_INT} (sentencepiece's limit; got {value})")


class _RecordingIterator:
    """`sentences`, remembering the exception they raised (an `NmtError` for a bad line), or
    the NmtError for a line too long for sentencepiece, which would skip it silently.

    sentencepiece turns an exception of the iterator it consumes into a RuntimeError whose
    message holds a Python traceback; `learn_bpe` re-raises the original instead.
    """

    def __init__(self, sentences: Iterable[str], text: str) -> None:
        self._sentences = iter(sentences)
        self._text = text
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        try:
            line = next(self._sentences)
        except StopIteration:
            raise
        except BaseException as error:  # KeyboardInterrupt too: it must stay an interrupt
            self.error = error
            raise
        # A character takes at most 4 bytes: only a line this long can exceed the limit.
        if len(line) > MAX_SENTENCE_BYTES // 4 and len(line.encode("utf-8")) > MAX_SENTENCE_BYTES:
            self.error = NmtError(f"a line of {self._text} has {len(line.encode('utf-8'))} bytes, more than "
                                  f"sentencepiece learns from ({MAX_SENTENCE_BYTES}); split or drop it")
            raise self.error
        return line


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
