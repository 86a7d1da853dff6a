"""`nmt average`: parse flags into an `AverageConfig` and write the averaged checkpoint."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.config import AverageConfig
from nmt_cli.options import click_options, config_from_params


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click_options(AverageConfig)
@click.argument("more_inputs", nargs=-1, metavar="[PATH]...", type=click.Path())  # more --inputs, after it
def average(**params: Any) -> None:
    """Average the parameters of several checkpoints into one (fairseq's average_checkpoints.py).

    Vaswani et al. (2017) decode with the average of the last 5 (base) or 20 (big)
    checkpoints, written every 10 minutes; with update-numbered checkpoints that is
    e.g. `--num-update-checkpoints 5`.

    The result keeps the model, its configuration, languages and dictionaries and the
    list of averaged files; optimizer, scheduler, scaler, RNG and iterator state are
    dropped. Checkpoints of different architectures or dictionaries are refused.
    Prints the averaged files (oldest first) to stderr.

    \b
    Examples:
      nmt average --inputs run --num-update-checkpoints 5 --output run/avg5.pt
      nmt average --inputs run/checkpoint3.pt run/checkpoint4.pt --output avg.pt
    """
    from nmt_cli.checkpoints.average import average as run_average

    cfg = config_from_params(AverageConfig, params, inputs=params["inputs"] + params["more_inputs"])
    paths = run_average(cfg)
    click.echo(f"averaged {len(paths)} checkpoints into {cfg.output}:", err=True)
    for path in paths:
        click.echo(f"  {path}", err=True)
