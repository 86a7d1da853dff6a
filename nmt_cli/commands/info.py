"""`nmt info`: print an architecture or a checkpoint's model, with its parameter count."""

from __future__ import annotations

import json

import click

from nmt_cli.commands.model_options import model_options, overrides_from
from nmt_cli.config import InfoConfig
from nmt_cli.options import click_options, config_from_params


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click_options(InfoConfig)
@model_options
def info(**params) -> None:
    """Print an architecture or a checkpoint's model: its settings and parameter count.

    \b
    Examples:
      nmt info --arch transformer_base --vocab-size 37000 --share-all-embeddings
      nmt info --arch transformer_small --encoder-layers 4
      nmt info --path run/checkpoint_best.pt

    Without vocabulary sizes, only the parameters outside the embeddings are counted.
    """
    from nmt_cli.models import describe

    cfg = config_from_params(InfoConfig, params)
    result = describe.describe(cfg, overrides_from(params))
    click.echo(json.dumps(result, indent=2) if cfg.as_json else describe.format_table(result))
