"""`nmt learn-bpe` and `nmt apply-bpe`: the BPE stage of `nmt preprocess` on its own."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.config import ApplyBpeConfig, LearnBpeConfig
from nmt_cli.options import click_options, config_from_params
from nmt_cli.text.bpe_stage import apply_bpe_model, learn_bpe_model


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
    cfg = config_from_params(LearnBpeConfig, params)
    learned = learn_bpe_model(cfg)
    click.echo(f"wrote {learned.path} ({learned.pieces} pieces)")


@click.command(name="apply-bpe")
@click_options(ApplyBpeConfig)
def apply_bpe(**params: Any) -> None:
    """Segment tokenized text into BPE pieces (space-separated), or undo it with --decode.

    Streams line by line: exactly one output line per input line, in order
    (an empty line stays empty). An --output file appears only when complete.
    """
    apply_bpe_model(config_from_params(ApplyBpeConfig, params))
