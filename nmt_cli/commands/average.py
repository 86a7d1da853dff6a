"""`nmt average`: parse flags into an `AverageConfig` and write the averaged checkpoint."""

from __future__ import annotations

import click

from nmt_cli.config import AverageConfig


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--inputs", required=True, multiple=True, metavar="PATH",
              help="Checkpoint files to average (repeat the flag, or list several after it), or with "
                   "--num-update-checkpoints / --num-epoch-checkpoints one run directory.")
@click.argument("more_inputs", nargs=-1, metavar="[PATH]...", type=click.Path())
@click.option("--num-update-checkpoints", type=int, metavar="N",
              help="Average the last N checkpoint_{EPOCH}_{UPDATES}.pt files of the run directory, by update count.")
@click.option("--num-epoch-checkpoints", type=int, metavar="N",
              help="Average the last N checkpoint{EPOCH}.pt files of the run directory, by epoch.")
@click.option("--checkpoint-upper-bound", type=int, metavar="NUM",
              help="Ignore checkpoints numbered above NUM (an update count or an epoch, as selected).")
@click.option("--output", "-o", required=True, metavar="FILE",
              help="Where to write the averaged checkpoint (written atomically).")
def average(
    inputs: tuple[str, ...],
    more_inputs: tuple[str, ...],
    num_update_checkpoints: int | None,
    num_epoch_checkpoints: int | None,
    checkpoint_upper_bound: int | None,
    output: str,
) -> None:
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

    cfg = AverageConfig(
        inputs=inputs + more_inputs,
        output=output,
        num_update_checkpoints=num_update_checkpoints,
        num_epoch_checkpoints=num_epoch_checkpoints,
        checkpoint_upper_bound=checkpoint_upper_bound,
    )
    paths = run_average(cfg)
    click.echo(f"averaged {len(paths)} checkpoints into {cfg.output}:", err=True)
    for path in paths:
        click.echo(f"  {path}", err=True)
