"""`nmt binarize`: already-segmented text + an existing dictionary -> .bin/.idx."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.config import BinarizeConfig
from nmt_cli.options import click_options, config_from_params


@click.command(name="binarize")
@click_options(BinarizeConfig)
def binarize(**params: Any) -> None:
    """Binarize segmented text with an existing dictionary.

    Every line becomes one sentence with `</s>` appended; symbols missing from
    the dictionary become `<unk>`. Prints sentences, tokens and the <unk> rate.
    The files appear only once complete (written under a temporary name first).
    """
    from nmt_cli.preprocess.binarize import binarize_text

    prefix, result = binarize_text(config_from_params(BinarizeConfig, params))
    unk_rate = 100 * result.unk / max(result.tokens, 1)
    click.echo(f"{prefix}: {result.sentences} sentences, {result.tokens} tokens, {unk_rate:.2f}% <unk>")
