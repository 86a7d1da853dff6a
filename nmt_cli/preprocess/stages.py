"""The per-chunk work of preprocessing, run in worker processes.

Each job reads one run of lines (a `Chunk`) and writes its own output file;
the caller concatenates the outputs in chunk order, so the result does not
depend on how many processes did the work. Jobs are plain frozen dataclasses
and the functions are module-level, so they work with the `spawn` start method.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt_cli.data.dictionary import UNK_ID, Dictionary
from nmt_cli.data.indexed import IndexedDatasetBuilder
from nmt_cli.machine import exit_with_parent, start_resource_tracker_quietly, workers_cannot_start
from nmt_cli.preprocess.clean import REASONS, CleanSettings, drop_reason, too_long_to_tokenize
from nmt_cli.signals import workers_ignore_interrupts
from nmt_cli.text.bpe import BpeModel
from nmt_cli.text.reader import Chunk, read_lines
from nmt_cli.text.tokenizer import Tokenizer, TokenizerSettings

LINES_PER_BATCH = 10_000  # lines segmented per call


@dataclass(frozen=True)
class TokenizeJob:
    """Tokenize one chunk of a parallel corpus; drop bad pairs when `clean` is set."""

    src_path: Path
    tgt_path: Path
    src_chunk: Chunk
    tgt_chunk: Chunk
    src_out: Path
    tgt_out: Path
    src_tokenizer: TokenizerSettings
    tgt_tokenizer: TokenizerSettings
    clean: CleanSettings | None


@dataclass
class TokenizeResult:
    pairs_read: int = 0
    pairs_kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))

    def add(self, other: "TokenizeResult") -> None:
        self.pairs_read += other.pairs_read
        self.pairs_kept += other.pairs_kept
        for reason, count in other.dropped.items():
            self.dropped[reason] += count


def tokenize_pairs(job: TokenizeJob) -> TokenizeResult:
    src_tokenizer, tgt_tokenizer = Tokenizer(job.src_tokenizer), Tokenizer(job.tgt_tokenizer)
    result = TokenizeResult()
    src_lines = read_lines(job.src_path, job.src_chunk)
    tgt_lines = read_lines(job.tgt_path, job.tgt_chunk)
    with open(job.src_out, "w", encoding="utf-8", newline="\n") as src_out, open(
        job.tgt_out, "w", encoding="utf-8", newline="\n"
    ) as tgt_out:
        for src_line, tgt_line in zip(src_lines, tgt_lines, strict=True):
            result.pairs_read += 1
            if job.clean is not None and (too_long_to_tokenize(src_line, job.clean)
                                          or too_long_to_tokenize(tgt_line, job.clean)):
                result.dropped[_raw_drop_reason(src_line, tgt_line, src_tokenizer, tgt_tokenizer, job.clean)] += 1
                continue
            src, tgt = src_tokenizer.tokenize(src_line), tgt_tokenizer.tokenize(tgt_line)
            if job.clean is not None:
                reason = drop_reason(len(src.split()), len(tgt.split()), job.clean)
                if reason is not None:
                    result.dropped[reason] += 1
                    continue
            src_out.write(src + "\n")
            tgt_out.write(tgt + "\n")
            result.pairs_kept += 1
    return result


def _raw_drop_reason(src_line: str, tgt_line: str, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer,
                     clean: CleanSettings) -> str:
    """drop_reason of a pair with a side too long to tokenize: that side counts as one token
    over --max-len; the other is tokenized (an empty or too short side is the reason first)."""
    over = clean.max_len + 1

    def length(line: str, tokenizer: Tokenizer) -> int:
        return over if too_long_to_tokenize(line, clean) else len(tokenizer.tokenize(line).split())

    return drop_reason(length(src_line, src_tokenizer), length(tgt_line, tgt_tokenizer), clean)


@dataclass(frozen=True)
class SegmentJob:
    """Split one chunk of tokenized text into BPE pieces (or whitespace tokens)."""

    path: Path
    chunk: Chunk
    out: Path
    bpe_model: Path | None
    count: bool  # return piece counts (for building a dictionary)


def segment(job: SegmentJob) -> Counter[str]:
    bpe = BpeModel(job.bpe_model) if job.bpe_model is not None else None
    counts: Counter[str] = Counter()
    with open(job.out, "w", encoding="utf-8", newline="\n") as out:
        for lines in _batches(read_lines(job.path, job.chunk)):
            pieces = bpe.encode_lines(lines) if bpe is not None else [line.split() for line in lines]
            if job.count:
                counts.update(itertools.chain.from_iterable(pieces))
            out.write("\n".join(map(" ".join, pieces)) + "\n")
    return counts


@dataclass(frozen=True)
class BinarizeJob:
    """Turn one chunk of segmented text into ids (`</s>` appended) in `{out_prefix}.bin/.idx`."""

    path: Path
    chunk: Chunk
    dict_path: Path
    out_prefix: Path


@dataclass
class BinarizeResult:
    sentences: int = 0
    tokens: int = 0  # ids written, `</s>` included (fairseq's count)
    unk: int = 0

    def add(self, other: "BinarizeResult") -> None:
        self.sentences += other.sentences
        self.tokens += other.tokens
        self.unk += other.unk


def binarize(job: BinarizeJob) -> BinarizeResult:
    dictionary = Dictionary.load(job.dict_path)
    builder = IndexedDatasetBuilder(job.out_prefix, len(dictionary))
    result = BinarizeResult()
    for line in read_lines(job.path, job.chunk):
        ids = dictionary.encode(line.split())
        builder.add(ids)
        result.sentences += 1
        result.tokens += len(ids)
        result.unk += ids.count(UNK_ID)
    builder.finalize()
    return result


def _batches(lines: Iterator[str]) -> Iterator[list[str]]:
    """Lists of `LINES_PER_BATCH` consecutive lines (the last one shorter)."""
    while batch := list(itertools.islice(lines, LINES_PER_BATCH)):
        yield batch


class JobRunner:
    """Runs jobs in this process (`workers == 1`) or in a pool of spawned processes."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool = None
        if workers > 1:
            try:
                start_resource_tracker_quietly()
                # The workers end themselves if this process dies without stopping them.
                self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=exit_with_parent, initargs=(os.getpid(),))
            except OSError as error:  # the pool's queues lock with POSIX semaphores, files in /dev/shm
                raise workers_cannot_start(error, "their locks need a writable /dev/shm") from None

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], on_done: Callable[[], None] | None = None) -> list:
        """Results in job order; `on_done` is called once per finished job (for progress)."""
        results = []
        if self._pool is not None:
            with workers_ignore_interrupts():  # the pool starts its processes as the jobs are submitted
                try:
                    outputs = self._pool.map(fn, jobs)
                except OSError as error:  # no process slots or memory left (a job's own errors come later)
                    raise workers_cannot_start(error) from None
        else:
            outputs = map(fn, jobs)
        for output in outputs:
            results.append(output)
            if on_done is not None:
                on_done()
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def stop(self) -> None:
        """End the worker processes now, their jobs unfinished (after an error or a signal)."""
        if self._pool is None:
            return
        # ProcessPoolExecutor has no public way to end running jobs before Python 3.14.
        processes = list(getattr(self._pool, "_processes", {}).values())
        for process in processes:
            process.terminate()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.join()

    def __enter__(self) -> "JobRunner":
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.stop()


def concatenate(parts: Sequence[Path], dest: Path) -> None:
    """Concatenate text files in order into `dest`, deleting the parts."""
    with open(dest, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)
            part.unlink()
