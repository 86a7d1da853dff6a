"""Whole-file stages: split a file into line chunks, run the chunk jobs, merge in order.

The number of chunks grows with the file (so progress bars move and no single
job is huge) and is at least the number of workers; outputs are concatenated in
chunk order, so every result is byte-identical for any `--workers`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nmt_cli.data.dictionary import Dictionary
from nmt_cli.data.indexed import IndexedDatasetBuilder
from nmt_cli.preprocess.clean import CleanSettings
from nmt_cli.preprocess.progress import StageReporter
from nmt_cli.preprocess.stages import (
    BinarizeJob,
    BinarizeResult,
    JobRunner,
    SegmentJob,
    TokenizeJob,
    TokenizeResult,
    binarize,
    concatenate,
    segment,
    tokenize_pairs,
)
from nmt_cli.text.reader import line_chunks
from nmt_cli.text.tokenizer import TokenizerSettings

LINES_PER_CHUNK = 200_000


def num_chunks(num_lines: int, workers: int) -> int:
    return max(workers, math.ceil(num_lines / LINES_PER_CHUNK))


def run_jobs(work: Callable[[Any], Any], jobs: Sequence[Any], merge: Callable[[Any], object],
             runner: JobRunner, reporter: StageReporter, label: str) -> None:
    """Run `work` on every job as one progress stage, handing each result to `merge` in job order."""
    with reporter.stage(label, len(jobs)) as advance:
        results = runner.map(work, jobs, advance)
    for result in results:
        merge(result)


def _part(path: Path, i: int) -> Path:
    return path.with_name(f"{path.name}.part{i}")


def tokenize_parallel(
    src: Path,
    tgt: Path,
    num_lines: int,
    outputs: tuple[Path, Path],
    tokenizers: tuple[TokenizerSettings, TokenizerSettings],
    clean: CleanSettings | None,
    runner: JobRunner,
    reporter: StageReporter,
    label: str,
) -> TokenizeResult:
    """Tokenize a parallel corpus of `num_lines` pairs into `outputs` (cleaning pairs if `clean`)."""
    k = num_chunks(num_lines, runner.workers)
    src_chunks, tgt_chunks = line_chunks(src, num_lines, k), line_chunks(tgt, num_lines, k)
    jobs = [
        TokenizeJob(src, tgt, sc, tc, _part(outputs[0], i), _part(outputs[1], i), tokenizers[0], tokenizers[1], clean)
        for i, (sc, tc) in enumerate(zip(src_chunks, tgt_chunks, strict=True))
    ]
    total = TokenizeResult()
    run_jobs(tokenize_pairs, jobs, total.add, runner, reporter, label)
    concatenate([job.src_out for job in jobs], outputs[0])
    concatenate([job.tgt_out for job in jobs], outputs[1])
    return total


def segment_file(
    path: Path,
    num_lines: int,
    bpe_model: Path | None,
    dest: Path,
    count: bool,
    runner: JobRunner,
    reporter: StageReporter,
    label: str,
) -> Counter[str]:
    """Write the BPE pieces (or whitespace tokens) of each line of `path` to `dest`; count them if asked."""
    chunks = line_chunks(path, num_lines, num_chunks(num_lines, runner.workers))
    jobs = [SegmentJob(path, chunk, _part(dest, i), bpe_model, count) for i, chunk in enumerate(chunks)]
    total: Counter[str] = Counter()
    run_jobs(segment, jobs, total.update, runner, reporter, label)
    concatenate([job.out for job in jobs], dest)
    return total


def binarize_file(
    path: Path,
    num_lines: int,
    dict_path: Path,
    out_prefix: Path,
    runner: JobRunner,
    reporter: StageReporter,
    label: str,
) -> BinarizeResult:
    """Segmented text -> `{out_prefix}.bin/.idx` with the dictionary at `dict_path`."""
    chunks = line_chunks(path, num_lines, num_chunks(num_lines, runner.workers))
    if len(chunks) == 1:
        jobs = [BinarizeJob(path, chunks[0], dict_path, out_prefix)]
    else:
        jobs = [BinarizeJob(path, chunk, dict_path, _part(out_prefix, i)) for i, chunk in enumerate(chunks)]
    total = BinarizeResult()
    run_jobs(binarize, jobs, total.add, runner, reporter, label)
    if len(jobs) > 1:
        builder = IndexedDatasetBuilder(out_prefix, len(Dictionary.load(dict_path)))
        for job in jobs:
            builder.merge(job.out_prefix)
            Path(f"{job.out_prefix}.bin").unlink()
            Path(f"{job.out_prefix}.idx").unlink()
        builder.finalize()
    return total
