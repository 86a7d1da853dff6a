"""`nmt learn-bpe` and `nmt apply-bpe`: the BPE stage of `nmt preprocess` on its own,
over files and the standard streams."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.config import ApplyBpeConfig, LearnBpeConfig
from nmt_cli.files import make_parent_directory, published_output, refuse_overwriting_inputs, write_output
from nmt_cli.text.bpe import BpeModel, learn_bpe
from nmt_cli.text.reader import ArrivingInput, check_line_length, check_readable, read_lines, read_stream


@dataclass(frozen=True)
class LearnedModel:
    path: Path  # PREFIX.model
    pieces: int


def learn_bpe_model(cfg: LearnBpeConfig) -> LearnedModel:
    """Learn PREFIX.model from every --input in turn (the text streamed, read once)."""
    sources = [_input_lines(name) for name in cfg.inputs]  # every file is checked before learning starts
    model_path = Path(f"{cfg.model_prefix}.model")
    refuse_overwriting_inputs(model_path, [("--input", name) for name in cfg.inputs], "--model-prefix")
    make_parent_directory(model_path)
    learn_bpe(itertools.chain.from_iterable(sources), model_path, cfg.vocab_size, cfg.sample, cfg.seed,
              text="the --input text")
    return LearnedModel(model_path, BpeModel(model_path).size())


def apply_bpe_model(cfg: ApplyBpeConfig) -> None:
    """Segment --input into --output line by line (or undo it with --decode): one output line
    per input line, in order; an --output file appears only when complete."""
    input_path, output_path = cfg.input_path, cfg.output_path
    refuse_overwriting_inputs(output_path, [("--input", input_path), ("--model", cfg.model)])
    bpe = BpeModel(Path(cfg.model))
    stdin = ArrivingInput(sys.stdin.buffer) if input_path == "-" else None
    lines = read_stream(stdin, "<stdin>") if stdin is not None else _input_lines(input_path)
    name = "<stdin>" if input_path == "-" else input_path
    with published_output(output_path, "w") as out:
        for number, line in enumerate(lines, 1):
            check_line_length(line, number, name, "apply-bpe")  # its pieces cost some 45 times its size
            # Pieces are separated by single spaces; a tab or a no-break space is a piece of its own.
            text = bpe.decode([p for p in line.split(" ") if p]) if cfg.decode else " ".join(bpe.encode(line))
            # Flushed for a terminal, or a writer waiting for this line before it sends the next.
            write_output(out, text + "\n", output_path, flush=stdin is not None and not stdin.line_ready())
        write_output(out, "", output_path)  # flushes the lines still buffered


def _input_lines(name: str) -> Iterator[str]:
    """The lines of one --input (- : stdin), read lazily; a file is checked now."""
    if name == "-":
        return read_stream(sys.stdin.buffer, "<stdin>")
    check_readable(Path(name))
    return read_lines(Path(name))
