"""`nmt learn-bpe` and `nmt apply-bpe`: the BPE stage of `nmt preprocess` on its own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from nmt_cli.config import ApplyBpeConfig, LearnBpeConfig
from nmt_cli.options import click_options, config_from_params


@click.command(name="learn-bpe")
@click_options(LearnBpeConfig)
def learn_bpe(**params: Any) -> None:
    """Learn a sentencepiece BPE model from tokenized text.

    Uses the same settings as `nmt preprocess`: model type bpe, full character
    coverage, no normalization inside sentencepiece (so applying and undoing the
    model gives back the input, but for runs of spaces, which become one, and
    leading or trailing spaces), no byte fallback. Input is streamed
    (read once, so - works); only the sample is held in memory. Lines of
    any length are learned from (up to sentencepiece's limit, 1 GiB).
    """
    import itertools

    from nmt_cli.errors import NmtError
    from nmt_cli.files import file_prefix, make_parent_directory, refuse_overwriting_inputs
    from nmt_cli.text.bpe import BpeModel, learn_bpe as learn

    cfg = config_from_params(LearnBpeConfig, params)
    inputs, model_prefix = cfg.inputs, cfg.model_prefix
    file_prefix(model_prefix, "--model-prefix", (".model",))  # '' would write a hidden `.model`
    if inputs.count("-") > 1:
        raise NmtError("--input - (standard input) can be given only once")
    sources = [_input_lines(name) for name in inputs]  # every file is checked before learning starts
    model_path = Path(f"{model_prefix}.model")
    refuse_overwriting_inputs(model_path, [("--input", name) for name in inputs], "--model-prefix")
    make_parent_directory(model_path)
    learn(itertools.chain.from_iterable(sources), model_path, cfg.vocab_size, cfg.sample, cfg.seed,
          text="the --input text")
    click.echo(f"wrote {model_path} ({BpeModel(model_path).size()} pieces)")


def _input_lines(name: str) -> Iterator[str]:
    """The lines of one --input (- : stdin), read lazily; a file is checked now."""
    from nmt_cli.text.reader import check_readable, read_lines, read_stream

    if name == "-":
        return read_stream(sys.stdin.buffer, "<stdin>")
    check_readable(Path(name))
    return read_lines(Path(name))


@click.command(name="apply-bpe")
@click_options(ApplyBpeConfig)
def apply_bpe(**params: Any) -> None:
    """Segment tokenized text into BPE pieces (space-separated), or undo it with --decode.

    Streams line by line: exactly one output line per input line, in order
    (an empty line stays empty). An --output file appears only when complete.
    """
    from nmt_cli.errors import NmtError
    from nmt_cli.files import published_output, refuse_overwriting_inputs
    from nmt_cli.text.bpe import BpeModel
    from nmt_cli.text.reader import ArrivingInput, read_stream

    cfg = config_from_params(ApplyBpeConfig, params)
    model, input_path, output_path, decode = cfg.model, cfg.input_path, cfg.output_path, cfg.decode
    refuse_overwriting_inputs(output_path, [("--input", input_path), ("--model", model)])
    bpe = BpeModel(Path(model))
    stdin = ArrivingInput(sys.stdin.buffer) if input_path == "-" else None
    lines = read_stream(stdin, "<stdin>") if stdin is not None else _input_lines(input_path)
    with published_output(output_path, "w") as out:
        try:
            for line in lines:
                # Pieces are separated by single spaces; a tab or a no-break space is a piece of its own.
                out.write((bpe.decode([p for p in line.split(" ") if p]) if decode else " ".join(bpe.encode(line))) + "\n")
                if stdin is not None and not stdin.line_ready():  # a terminal, or a writer waiting for this line
                    out.flush()
            out.flush()
        except BrokenPipeError:
            raise  # the reader went away (`| head`): the CLI ends quietly
        except OSError as error:
            raise NmtError(f"cannot write {output_path if output_path != '-' else '<stdout>'}: {error.strerror or error}") from None
