"""`nmt plot`: parse flags into a `PlotConfig` and draw the runs' learning curves."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.config import PlotConfig
from nmt_cli.options import click_options, config_from_params


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click_options(PlotConfig)
def plot(**params: Any) -> None:
    """Draw the train and valid loss (and BLEU / chrF when logged) of each RUN against
    updates and against wall time, all runs on one figure.

    RUN is a run directory of `nmt train` (its train_log.jsonl is read) or a
    train_log.jsonl itself. Needs matplotlib: pip install 'nmt-cli[plot]'.

    \b
    Examples:
      nmt plot run -o curves.png
      nmt plot run-base run-big -o compare.html
    """
    from nmt_cli.train.plot import plot as draw_plot

    cfg = config_from_params(PlotConfig, params)
    path = draw_plot(cfg)
    click.echo(f"curves of {len(cfg.runs)} run(s) in {path}", err=True)
