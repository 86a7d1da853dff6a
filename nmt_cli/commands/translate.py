"""`nmt translate`: parse flags into a `TranslateConfig`, stream lines through the translator."""

from __future__ import annotations

import gc
import os
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import click

from nmt_cli.config import DEFAULT_BUFFER_SIZE, TranslateConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import opened, published_output, refuse_overwriting_inputs
from nmt_cli.machine import decoding_device
from nmt_cli.options import click_options, config_from_params, option


@dataclass(frozen=True)
class Streams:
    """Where `nmt translate` reads and writes: the command's own, as the library takes open streams."""

    input_path: str = option("--input", "-i", default="-", show_default=True, metavar="FILE",
                             help="Text to translate, one sentence per line (UTF-8); - reads stdin.")
    output_path: str = option(
        "--output", "-o", default="-", show_default=True, metavar="FILE",
        help="Where translations go, one line per input line; - writes stdout. A file appears "
             "only when complete (written under a hidden temporary name, then renamed).")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click_options(TranslateConfig)
@click_options(Streams)
def translate(**params: Any) -> None:
    """Translate text with beam search: one output line per input line (N with --nbest N), in order.

    DATA_DIR, as fairseq-interactive's, is the same as --data-bin.

    \b
    With --nbest N, text and bpe output have N lines per input line, best first.
    Blank lines give empty output lines (the model is not run). A source longer than
    the model's maximum source positions is truncated to fit, with a warning on stderr
    naming the line. Lines are read in chunks of --buffer-size, so a large input
    streams with bounded memory.

    \b
    Examples:
      nmt translate --path run/checkpoint_best.pt < test.en > hyp.de
      nmt translate --path run/checkpoint_best.pt --beam 4 --lenpen 0.6 --lenpen-style gnmt \\
          --max-len-a 1 --max-len-b 50 -i test.en -o hyp.de
      nmt translate --path a.pt:b.pt --data-bin data-bin --output-format jsonl --nbest 4
      nmt translate --path run/checkpoint_best.pt --precision int8 --threads 4 -i test.en -o hyp.de
    fairseq-interactive's way (a data directory, --cpu, --fp16, --remove-bpe, ...):
      nmt translate --path run/checkpoint_best.pt data-bin --beam 5 --source-lang en --target-lang de
    Guided decoding (a forced prefix, terminology constraints, alignments, scoring references):
      nmt translate --path run/checkpoint_best.pt --prefix-file prefixes.de --print-alignment -i test.en
      paste test.en terms.de | nmt translate --path run/checkpoint_best.pt --constraints unordered
      paste test.en test.de | nmt translate --path run/checkpoint_best.pt --score-reference
    """
    streams = config_from_params(Streams, params)
    reading_terminal = streams.input_path == "-" and sys.stdin.isatty()
    buffer_size = params["buffer_size"]
    cfg = config_from_params(
        TranslateConfig, params,
        buffer_size=(1 if reading_terminal else DEFAULT_BUFFER_SIZE) if buffer_size is None else buffer_size,
        device=decoding_device(params["device"], params["precision"]),
    )
    run(cfg, streams.input_path, streams.output_path)


def run(cfg: TranslateConfig, input_path: str, output_path: str) -> None:
    """Translate `input_path` into `output_path` ("-": stdin / stdout)."""
    refuse_overwriting_inputs(output_path, _inputs_read(cfg, input_path))
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
        translator = Translator(cfg, warn=lambda message: click.echo(message, err=True))
        if workers is not None:
            translator = workers.use(translator)
        sink = stack.enter_context(published_output(output_path))
        # What is alive now (the modules, the model) stays alive while lines stream through:
        # the cyclic collector need not scan it in the full collections their objects cause.
        gc.freeze()
        stack.callback(gc.unfreeze)
        started, lines_done = time.monotonic(), 0
        advance = stack.enter_context(_progress(input_path, cfg.quiet))
        arriving = ArrivingInput(source)
        lines = read_lines(arriving, source_name, cfg.errors)
        for side_path, field in ((cfg.guided.prefix_file, "prefix"), (cfg.guided.reference_file, "reference")):
            if side_path is not None:  # guided decoding's line-by-line side inputs
                lines = with_side_file(lines, stack.enter_context(opened(side_path, "rb")), side_path, field, cfg.errors)
        for group, read_error in chunks(lines, cfg.buffer_size, arriving.line_ready):
            text = "".join(translator.format(translation) + "\n" for translation in translator.translate(group, source_name))
            _write(sink, text.encode("utf-8"), output_path)
            advance(len(group))
            lines_done += len(group)
            if read_error is not None:
                raise read_error
    if not cfg.quiet and sys.stderr.isatty():
        seconds = time.monotonic() - started
        click.echo(f"translated {lines_done} lines in {seconds:.1f} s ({lines_done / max(seconds, 1e-9):.1f} lines/s)", err=True)


def _inputs_read(cfg: TranslateConfig, input_path: str) -> list[tuple[str, str | Path]]:
    """Every file translate reads, as (flag, path): the text, the checkpoints and the
    data-bin files (meta.json, dictionaries, BPE models) that turn text into ids and back."""
    data_dir = Path(cfg.data_bin) if cfg.data_bin else Path(cfg.checkpoints[0]).parent
    data_files = [p for pattern in ("meta.json", "dict.*.txt", "*.model", "*.codes") for p in sorted(data_dir.glob(pattern))]
    side_files = [(flag, path) for flag, path in (("--prefix-file", cfg.guided.prefix_file),
                                                  ("--reference-file", cfg.guided.reference_file)) if path]
    return ([("--input", input_path)] + side_files + [("--path", checkpoint) for checkpoint in cfg.checkpoints]
            + [("--data-bin file" if cfg.data_bin else "data file", p) for p in data_files])


def _write(sink: BinaryIO, data: bytes, output_path: str) -> None:
    """Write and flush one chunk's translations; a full disk is one error line naming the output."""
    try:
        sink.write(data)
        sink.flush()
    except BrokenPipeError:
        raise  # the reader went away (`| head`): the CLI ends quietly
    except OSError as error:
        name = "<stdout>" if output_path == "-" else output_path
        raise NmtError(f"cannot write {name}: {error.strerror or error}") from None


def _is_regular_file(input_path: str) -> bool:
    try:
        return input_path != "-" and stat.S_ISREG(os.stat(input_path).st_mode)
    except (OSError, ValueError):
        return False


@contextmanager
def _progress(input_path: str, quiet: bool) -> Iterator:
    """A progress bar over the input file's lines, on stderr when it is a terminal."""
    if quiet or not sys.stderr.isatty() or not _is_regular_file(input_path):
        # Counting lines reads the input: only a regular file can be read again (a pipe,
        # `<(zcat x.gz)` or /dev/stdin would be drained before translating).
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    total, last = 0, b"\n"
    with open(input_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            total, last = total + block.count(b"\n"), block[-1:]
    total += last != b"\n"  # a last line without a newline
    columns = (TextColumn("translating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("translate", total=total)
        yield lambda n: progress.advance(task, n)
