"""`nmt learn-bpe` and `nmt apply-bpe`: the BPE stage of `nmt preprocess` on its own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click

from nmt_cli.config import DEFAULT_BPE_SAMPLE


@click.command(name="learn-bpe")
@click.option("--input", "inputs", multiple=True, required=True,
              help="Tokenized text to learn from (UTF-8, one sentence per line); repeat for several files; "
                   "- for stdin.")
@click.option("--vocab-size", required=True, type=int, help="Number of BPE pieces (e.g. 32000).")
@click.option("--model-prefix", required=True, help="Write the model to PREFIX.model.")
@click.option("--sample", default=DEFAULT_BPE_SAMPLE, show_default=True,
              help="Learn on at most this many sentences (a seeded random sample; 0: all).")
@click.option("--seed", default=1, show_default=True, help="Seed of the sentence sample.")
def learn_bpe(inputs: tuple[str, ...], vocab_size: int, model_prefix: str, sample: int, seed: int) -> None:
    """Learn a sentencepiece BPE model from tokenized text.

    Uses the same settings as `nmt preprocess`: model type bpe, full character
    coverage, no normalization inside sentencepiece (so applying and undoing the
    model gives back the input, but for runs of spaces, which become one, and
    leading or trailing spaces), no byte fallback. Input is streamed
    (read once, so - works); only the sample is held in memory.
    """
    import itertools

    from nmt_cli.commands.outputs import file_prefix, make_parent_directory, refuse_overwriting_inputs
    from nmt_cli.config import check_seed
    from nmt_cli.errors import NmtError
    from nmt_cli.text.bpe import BpeModel, check_sentencepiece_sizes, learn_bpe as learn

    if sample < 0:
        raise NmtError(f"--sample must be >= 0 (0: all sentences; got {sample})")
    check_sentencepiece_sizes(vocab_size, sample, "--vocab-size", "--sample")
    check_seed(seed)
    file_prefix(model_prefix, "--model-prefix", (".model",))  # '' would write a hidden `.model`
    if inputs.count("-") > 1:
        raise NmtError("--input - (standard input) can be given only once")
    sources = [_input_lines(name) for name in inputs]  # every file is checked before learning starts
    model_path = Path(f"{model_prefix}.model")
    refuse_overwriting_inputs(model_path, [("--input", name) for name in inputs], "--model-prefix")
    make_parent_directory(model_path)
    learn(itertools.chain.from_iterable(sources), model_path, vocab_size, sample, seed)
    click.echo(f"wrote {model_path} ({BpeModel(model_path).size()} pieces)")


def _input_lines(name: str) -> Iterator[str]:
    """The lines of one --input (- : stdin), read lazily; a file is checked now."""
    from nmt_cli.text.reader import check_readable, read_lines, read_stream

    if name == "-":
        return read_stream(sys.stdin.buffer, "<stdin>")
    check_readable(Path(name))
    return read_lines(Path(name))


@click.command(name="apply-bpe")
@click.option("--model", required=True, help="sentencepiece model (e.g. data-bin/bpe.model).")
@click.option("--input", "input_path", default="-", show_default=True, help="Input text file; - for stdin.")
@click.option("--output", "output_path", default="-", show_default=True, help="Output text file; - for stdout.")
@click.option("--decode", is_flag=True, help="Undo BPE: space-separated pieces in, tokenized text out.")
def apply_bpe(model: str, input_path: str, output_path: str, decode: bool) -> None:
    """Segment tokenized text into BPE pieces (space-separated), or undo it with --decode.

    Streams line by line: exactly one output line per input line, in order
    (an empty line stays empty). An --output file appears only when complete.
    """
    from nmt_cli.commands.outputs import published_output, refuse_overwriting_inputs
    from nmt_cli.errors import NmtError
    from nmt_cli.text.bpe import BpeModel

    refuse_overwriting_inputs(output_path, [("--input", input_path), ("--model", model)])
    bpe = BpeModel(Path(model))
    lines = _input_lines(input_path)
    interactive = input_path == "-" and sys.stdin.isatty()
    with published_output(output_path, "w") as out:
        try:
            for line in lines:
                # Pieces are separated by single spaces; a tab or a no-break space is a piece of its own.
                out.write((bpe.decode([p for p in line.split(" ") if p]) if decode else " ".join(bpe.encode(line))) + "\n")
                if interactive:
                    out.flush()
            out.flush()
        except BrokenPipeError:
            raise  # the reader went away (`| head`): the CLI ends quietly
        except OSError as error:
            raise NmtError(f"cannot write {output_path if output_path != '-' else '<stdout>'}: {error.strerror or error}") from None
