"""`nmt translate`: parse flags into a `TranslateConfig` and its `TranslateStreams`, stream lines through the translator."""

from __future__ import annotations

import sys
from typing import Any

import click

from nmt_cli.config import DEFAULT_BUFFER_SIZE, TranslateConfig, TranslateStreams
from nmt_cli.decode.streaming import translate_stream
from nmt_cli.machine import decoding_device
from nmt_cli.options import click_options, config_from_params


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click_options(TranslateConfig)
@click_options(TranslateStreams)
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
    streams = config_from_params(TranslateStreams, params)
    reading_terminal = streams.input_path == "-" and sys.stdin.isatty()
    buffer_size = params["buffer_size"]
    cfg = config_from_params(
        TranslateConfig, params,
        buffer_size=(1 if reading_terminal else DEFAULT_BUFFER_SIZE) if buffer_size is None else buffer_size,
        device=decoding_device(params["device"], params["precision"]),
    )
    result = translate_stream(cfg, streams, warn=lambda message: click.echo(message, err=True))
    if not cfg.quiet and sys.stderr.isatty():
        click.echo(f"translated {result.lines} lines in {result.seconds:.1f} s "
                   f"({result.lines / max(result.seconds, 1e-9):.1f} lines/s)", err=True)

