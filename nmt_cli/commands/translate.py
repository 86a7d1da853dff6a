"""`nmt translate`: parse flags into a `TranslateConfig`, stream lines through the translator."""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO

import click

from nmt_cli.config import (
    ERROR_POLICIES,
    INPUT_FORMATS,
    LENPEN_STYLES,
    OUTPUT_FORMATS,
    TRANSLATE_PRECISIONS,
    DecodeConfig,
    TranslateConfig,
)
from nmt_cli.errors import NmtError
from nmt_cli.files import opened, published_output, refuse_overwriting_inputs

# Input lines per chunk: each chunk is sorted by length, translated, then written in order.
DEFAULT_BUFFER_SIZE = 2000


def _default_device(precision: str) -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and precision != "int8" else "cpu"


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--path", "path", required=True, metavar="CKPT[:CKPT...]",
              help="Checkpoint to translate with; several separated by ':' form an ensemble "
                   "(probabilities averaged; the models must share dictionaries).")
@click.option("--data-bin", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Directory with meta.json, dict.*.txt and the BPE model(s) [default: the checkpoint's "
                   "directory, where training copies them]. Its dictionaries must match the checkpoint's.")
@click.option("--input", "-i", "input_path", default="-", show_default=True, metavar="FILE",
              help="Text to translate, one sentence per line (UTF-8); - reads stdin.")
@click.option("--output", "-o", "output_path", default="-", show_default=True, metavar="FILE",
              help="Where translations go, one line per input line; - writes stdout. A file appears "
                   "only when complete (written under a hidden temporary name, then renamed).")
@click.option("--beam", type=int, default=5, show_default=True, help="Beam size (1: greedy decoding).")
@click.option("--nbest", type=int, default=1, show_default=True,
              help="Hypotheses kept per sentence; text and bpe output print the best only, "
                   "jsonl output lists all of them under \"nbest\".")
@click.option("--lenpen", type=float, default=1.0, show_default=True,
              help="Length penalty exponent alpha (the paper: 0.6 with --lenpen-style gnmt).")
@click.option("--lenpen-style", type=click.Choice(LENPEN_STYLES), default="fairseq", show_default=True,
              help="fairseq: score / len^alpha; gnmt: score / ((5 + len) / 6)^alpha (len counts </s>).")
@click.option("--max-len-a", type=float, default=0.0, show_default=True,
              help="Maximum output length is a * source length + b (the paper: a 1, b 50).")
@click.option("--max-len-b", type=int, default=200, show_default=True, help="See --max-len-a.")
@click.option("--min-len", type=int, default=1, show_default=True, help="Minimum number of tokens before </s>.")
@click.option("--no-repeat-ngram-size", type=int, default=0, show_default=True,
              help="Never repeat an n-gram of this size within a hypothesis (0: off).")
@click.option("--unk-penalty", type=float, default=0.0, show_default=True,
              help="Subtracted from the log-probability of <unk> (positive: fewer <unk>).")
@click.option("--temperature", type=float, default=1.0, show_default=True,
              help="Divide the logits by this before the softmax (< 1 sharper, > 1 flatter).")
@click.option("--sampling", is_flag=True,
              help="Sample instead of searching (back-translation): each of --beam hypotheses is one sample.")
@click.option("--sampling-topk", type=int, default=-1, show_default=True,
              help="With --sampling: draw only from the k most probable tokens (-1: all).")
@click.option("--sampling-topp", type=float, default=-1.0, show_default=True,
              help="With --sampling: draw only from the smallest set of tokens with this much probability (-1: all).")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed (for --sampling).")
@click.option("--input-format", type=click.Choice(INPUT_FORMATS), default="raw", show_default=True,
              help="raw: plain text (tokenized and BPE-segmented as in preprocessing); bpe: space-separated "
                   "pieces of the source dictionary; ids: space-separated source dictionary ids.")
@click.option("--output-format", type=click.Choice(OUTPUT_FORMATS), default="text", show_default=True,
              help="text: detokenized; bpe: space-separated target pieces; jsonl: one JSON object per line "
                   "with line, hyp, score, tokens, ids, positional_scores (and nbest when --nbest > 1).")
@click.option("--buffer-size", type=int, default=None,
              help="Lines read before translating them together (sorted by length for speed); output "
                   f"appears chunk by chunk [default: {DEFAULT_BUFFER_SIZE}; 1 when stdin is a terminal].")
@click.option("--max-tokens", type=int, default=None,
              help="Source tokens per batch, padding included [default: 4096 unless --batch-size is given].")
@click.option("--batch-size", type=int, default=None, help="Sentences per batch (at most).")
@click.option("--device", default=None,
              help="cpu, cuda or cuda:N [default: cuda when available (and not --precision int8), else cpu].")
@click.option("--threads", type=int, default=None,
              help="CPU threads for the model, in each process of --workers [default: torch's; 1 with --workers].")
@click.option("--workers", type=int, default=1, show_default=True,
              help="CPU only: processes translating at once, each with its own copy of the model. For "
                   "throughput on several cores (e.g. --workers 4 on 4 cores); threads speed up each batch.")
@click.option("--precision", type=click.Choice(TRANSLATE_PRECISIONS), default="fp32", show_default=True,
              help="bf16/fp16 run the model under autocast (fp16 on cuda only); int8: 8-bit integer linear "
                   "layers, on the CPU only; search stays in fp32.")
@click.option("--cuda-graphs/--no-cuda-graphs", default=None,
              help="Replay each decoding step (model and search) as one CUDA graph: one launch instead of "
                   "hundreds of small kernels; same translations [default: on with a cuda device].")
@click.option("--errors", type=click.Choice(ERROR_POLICIES), default="strict", show_default=True,
              help="Invalid UTF-8 input: strict stops with an error naming the line (lines before it are "
                   "translated and written to stdout; -o FILE is left as it was); replace substitutes U+FFFD.")
@click.option("--quiet", "-q", is_flag=True,
              help="No progress bar or information on stderr (warnings and errors still appear).")
def translate(path: str, data_bin: str | None, input_path: str, output_path: str, beam: int, nbest: int,
              lenpen: float, lenpen_style: str, max_len_a: float, max_len_b: int, min_len: int,
              no_repeat_ngram_size: int, unk_penalty: float, temperature: float, sampling: bool,
              sampling_topk: int, sampling_topp: float, seed: int, input_format: str, output_format: str,
              buffer_size: int | None, max_tokens: int | None, batch_size: int | None, device: str | None,
              threads: int | None, workers: int, precision: str, cuda_graphs: bool | None, errors: str, quiet: bool) -> None:
    """Translate text with beam search: exactly one output line per input line, in order.

    \b
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
    """
    decode = DecodeConfig(
        beam=beam, nbest=nbest, lenpen=lenpen, lenpen_style=lenpen_style, max_len_a=max_len_a,
        max_len_b=max_len_b, min_len=min_len, no_repeat_ngram_size=no_repeat_ngram_size,
        unk_penalty=unk_penalty, temperature=temperature, sampling=sampling, sampling_topk=sampling_topk,
        sampling_topp=sampling_topp, seed=seed,
    )
    reading_terminal = input_path == "-" and sys.stdin.isatty()
    cfg = TranslateConfig(
        checkpoints=tuple(path.split(":")), decode=decode, data_bin=data_bin, input_format=input_format,
        output_format=output_format,
        buffer_size=(1 if reading_terminal else DEFAULT_BUFFER_SIZE) if buffer_size is None else buffer_size,
        max_tokens=max_tokens, batch_size=batch_size, device=device or _default_device(precision), threads=threads,
        workers=workers, precision=precision, cuda_graphs=cuda_graphs, errors=errors, quiet=quiet,
    )
    run(cfg, input_path, output_path)


def run(cfg: TranslateConfig, input_path: str, output_path: str) -> None:
    """Translate `input_path` into `output_path` ("-": stdin / stdout)."""
    refuse_overwriting_inputs(output_path, _inputs_read(cfg, input_path))
    from nmt_cli.decode.lines import chunks, read_lines
    from nmt_cli.decode.translator import Translator, prepare_process
    from nmt_cli.decode.workers import ParallelTranslator

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
        started, lines_done = time.monotonic(), 0
        advance = stack.enter_context(_progress(input_path, cfg.quiet))
        for group, read_error in chunks(read_lines(source, source_name, cfg.errors), cfg.buffer_size):
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
    return ([("--input", input_path)] + [("--path", checkpoint) for checkpoint in cfg.checkpoints]
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
