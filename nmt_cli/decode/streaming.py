"""`nmt translate`'s pipeline: an input file or stdin translated chunk by chunk into an
output file or stdout, one line per input line, in order.

The input is opened before the model is loaded (a missing input is the error reported,
even beside a bad checkpoint), an output that would replace a file translate reads is
refused before anything is loaded, and the output file appears only when complete
(`files.published_output`).
"""

from __future__ import annotations

import gc
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.config import TranslateConfig, TranslateStreams
from nmt_cli.data.meta import text_files
from nmt_cli.files import opened, published_output, refuse_overwriting_inputs, write_output
from nmt_cli.host_memory import release_freed_memory

# Lines translated between two returns of freed memory to the system. Batches of other
# shapes free and allocate blocks of other sizes; glibc's heap, which keep_freed_memory
# lets keep what is freed, fragments and grows with the input's length unless trimmed.
# A trim costs milliseconds; this many lines take seconds at least.
RELEASE_MEMORY_EVERY = 2000


@dataclass(frozen=True)
class StreamResult:
    lines: int  # input lines translated
    seconds: float  # from the model loaded to the output complete


def translate_stream(cfg: TranslateConfig, streams: TranslateStreams, warn: Callable[[str], None]) -> StreamResult:
    """Translate `streams.input_path` into `streams.output_path` ("-": stdin / stdout);
    `warn` gets the translator's warnings (a truncated source line, ...)."""
    input_path, output_path = streams.input_path, streams.output_path
    refuse_overwriting_inputs(output_path, inputs_read(cfg, input_path))
    from nmt_cli.decode.guided import with_side_file
    from nmt_cli.decode.lines import chunks, read_lines
    from nmt_cli.decode.translator import Translator, prepare_process
    from nmt_cli.decode.workers import ParallelTranslator
    from nmt_cli.text.reader import ArrivingInput

    prepare_process(cfg)
    source_name = "<stdin>" if input_path == "-" else input_path
    with ExitStack() as stack:
        # Opened first: a missing input is the error reported, even beside a bad checkpoint.
        source = stack.enter_context(opened(input_path, "rb"))
        # The workers load the model while this process loads its own (and reports its errors).
        workers = stack.enter_context(ParallelTranslator(cfg)) if cfg.workers > 1 else None
        translator = Translator(cfg, warn=warn)
        if workers is not None:
            translator = workers.use(translator)
        sink = stack.enter_context(published_output(output_path))
        # What is alive now (the modules, the model) stays alive while lines stream through:
        # the cyclic collector need not scan it in the full collections their objects cause.
        gc.freeze()
        stack.callback(gc.unfreeze)
        started, lines_done, released_at = time.monotonic(), 0, 0
        advance = stack.enter_context(_progress(input_path, cfg.quiet))
        arriving = ArrivingInput(source)
        lines = read_lines(arriving, source_name, cfg.errors)
        for side_path, field in ((cfg.guided.prefix_file, "prefix"), (cfg.guided.reference_file, "reference")):
            if side_path is not None:  # guided decoding's line-by-line side inputs
                lines = with_side_file(lines, stack.enter_context(opened(side_path, "rb")), side_path, field, cfg.errors)
        for group, read_error in chunks(lines, cfg.buffer_size, arriving.line_ready):
            text = "".join(translator.format(translation) + "\n" for translation in translator.translate(group, source_name))
            write_output(sink, text.encode("utf-8"), output_path)
            advance(len(group))
            lines_done += len(group)
            if lines_done - released_at >= RELEASE_MEMORY_EVERY:
                release_freed_memory()
                released_at = lines_done
            if read_error is not None:
                raise read_error
    return StreamResult(lines_done, time.monotonic() - started)


def inputs_read(cfg: TranslateConfig, input_path: str) -> list[tuple[str, str | Path]]:
    """Every file translate reads, as (flag, path): the text, the checkpoints and the
    data-bin's (or run directory's) text files that turn text into ids and back."""
    data_dir = Path(cfg.data_bin) if cfg.data_bin else Path(cfg.checkpoints[0]).parent
    side_files = [(flag, path) for flag, path in (("--prefix-file", cfg.guided.prefix_file),
                                                  ("--reference-file", cfg.guided.reference_file)) if path]
    return ([("--input", input_path)] + side_files + [("--path", checkpoint) for checkpoint in cfg.checkpoints]
            + [("--data-bin file" if cfg.data_bin else "data file", p) for p in text_files(data_dir)])


def _is_regular_file(input_path: str) -> bool:
    try:
        return input_path != "-" and stat.S_ISREG(os.stat(input_path).st_mode)
    except (OSError, ValueError):
        return False


@contextmanager
def _progress(input_path: str, quiet: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar over the input file's lines, on stderr when it is a terminal."""
    if quiet or not sys.stderr.isatty() or not _is_regular_file(input_path):
        # Counting lines reads the input: only a regular file can be read again (a pipe,
        # `<(zcat x.gz)` or /dev/stdin would be drained before translating).
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from nmt_cli.text.reader import count_lines

    path = Path(input_path)
    total = count_lines(path) if path.stat().st_size else 0  # count_lines refuses an empty file
    columns = (TextColumn("translating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("translate", total=total)
        yield lambda n: progress.advance(task, n)
