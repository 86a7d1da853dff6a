"""`nmt train`: parse flags into a TrainConfig and a ModelConfig, then train."""

from __future__ import annotations

import click

from nmt_cli.commands.model_options import model_options, overrides_from
from nmt_cli.config import TrainConfig
from nmt_cli.options import click_options, config_from_params, given_params


@click.command(context_settings={"show_default": True})
@click_options(TrainConfig)
@model_options
def train(**params) -> None:
    """Train a Transformer on DATA_BIN (a directory written by `nmt preprocess`).

    \b
    The paper's base recipe on one GPU (about 25k target tokens per update):
      nmt train data-bin --arch transformer_base --save-dir run \\
          --max-tokens 4096 --update-freq 6 --lr 7e-4 --warmup-updates 4000 \\
          --label-smoothing 0.1 --max-update 100000 --precision bf16
    Several GPUs (each takes its share of every update):
      torchrun --nproc-per-node 8 -m nmt_cli train data-bin ... --save-dir run
    Running the same command again resumes from RUN/checkpoint_last.pt.
    """
    from nmt_cli.models.registry import resolve_config
    from nmt_cli.train.trainer import train as run_training

    # fixed warms up only over a --warmup-updates given, as fairseq's (its default there is 0;
    # nmt's 4000 is that of inverse_sqrt and noam).
    fixed_default = params["lr_scheduler"] == "fixed" and "warmup_updates" not in given_params()
    cfg = config_from_params(TrainConfig, params, **({"warmup_updates": 0} if fixed_default else {}))
    cfg.eval_bleu_search(given_params())  # an --eval-bleu-beam 5 given is no default to override
    model_cfg = resolve_config(cfg.arch, overrides_from(params))
    result = run_training(cfg, model_cfg)
    best = f"{result.best_metric:.3f}" if result.best_metric is not None else "n/a"
    click.echo(f"stopped ({result.stop_reason}) after {result.num_updates} updates in epoch {result.epoch}; "
               f"best valid {cfg.best_checkpoint_metric} {best}; checkpoints in {cfg.save_dir}")
