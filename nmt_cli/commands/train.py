"""`nmt train`: parse flags into a TrainConfig and a ModelConfig, then train."""

from __future__ import annotations

import re

import click

from nmt_cli.commands.model_options import model_options, overrides_from
from nmt_cli.config import LR_SCHEDULERS, TRAIN_PRECISIONS, TrainConfig
from nmt_cli.errors import NmtError


def parse_betas(text: str) -> tuple[float, float]:
    """`"(0.9, 0.98)"`, `"0.9,0.98"` or `"0.9 0.98"` -> (0.9, 0.98)."""
    numbers = [n for n in re.split(r"[\s,()\[\]]+", text) if n]
    try:
        values = tuple(float(n) for n in numbers)
    except ValueError:
        values = ()
    if len(values) != 2:
        raise NmtError(f"--adam-betas {text!r}: expected two numbers such as '(0.9, 0.98)'")
    return values  # type: ignore[return-value]


@click.command(context_settings={"show_default": True})
@click.argument("data_bin", type=click.Path(file_okay=False))
@click.option("--arch", "-a", default="transformer_base", help="Architecture preset (see `nmt info --arch NAME`).")
@click.option("--save-dir", required=True, help="Run directory for checkpoints, train_log.jsonl and config.json. "
              "If it holds checkpoint_last.pt, training resumes from it (on the same data-bin only). One "
              "training run at a time may use it (a lock, .NAME.lock beside it, says which process has it). "
              "Under torchrun only global rank 0 writes; a rank whose --save-dir lacks checkpoint_last.pt is "
              "sent rank 0's, and a rank holding another one than rank 0's (or one while rank 0 has none) "
              "stops training with an error.")
@click.option("--source-lang", "-s", default=None, help="Source language [default: the data-bin's meta.json].")
@click.option("--target-lang", "-t", default=None, help="Target language [default: the data-bin's meta.json].")
@click.option("--train-subset", default="train", help="Split to train on.")
@click.option("--valid-subset", default="valid", help="Split to validate on.")
@click.option("--max-tokens", type=int, default=4096,
              help="Padded tokens per batch: batch size * max(source length, target length).")
@click.option("--batch-size", "--max-sentences", "batch_size", type=int, default=None, help="Most sentences per batch.")
@click.option("--required-batch-size-multiple", type=int, default=8,
              help="Round batch sizes down to a multiple of this (fast matrix shapes).")
@click.option("--update-freq", type=int, default=1,
              help="Accumulate gradients over N batches per update (N times the batch, same memory).")
@click.option("--lr", type=float, default=5e-4,
              help="Peak learning rate (inverse_sqrt, fixed), or multiplier of the paper's formula (noam).")
@click.option("--lr-scheduler", type=click.Choice(LR_SCHEDULERS), default="inverse_sqrt",
              help="inverse_sqrt: linear warm-up to --lr, then lr*sqrt(warmup/step) (fairseq). "
              "noam: lr * d_model^-0.5 * min(step^-0.5, step*warmup^-1.5) (the paper). fixed: constant --lr.")
@click.option("--warmup-updates", type=int, default=4000, help="Warm-up updates of the schedule.")
@click.option("--warmup-init-lr", type=float, default=0.0, help="Learning rate at the start of inverse_sqrt warm-up.")
@click.option("--adam-betas", default="(0.9, 0.98)", help="Adam beta1 and beta2, e.g. '(0.9, 0.98)' or '0.9 0.98'.")
@click.option("--adam-eps", type=float, default=1e-9, help="Adam epsilon.")
@click.option("--weight-decay", "--wd", "weight_decay", type=float, default=0.0, help="Decoupled weight decay (AdamW).")
@click.option("--clip-norm", type=float, default=0.0, help="Clip the gradient norm to this value (0: no clipping).")
@click.option("--label-smoothing", type=float, default=0.1,
              help="Label smoothing epsilon (fairseq's formula: eps/(V-1) on every non-target symbol).")
@click.option("--max-update", type=int, default=0, help="Stop after this many updates (0: no limit).")
@click.option("--max-epoch", type=int, default=0, help="Stop after this many epochs (0: no limit).")
@click.option("--max-time", default="0",
              help="Wall-clock budget of this invocation: seconds or e.g. 90s, 15m, 2h, 1h30m; saves a "
              "checkpoint and stops cleanly (0: no limit).")
@click.option("--patience", type=int, default=0,
              help="Stop when the validation metric has not improved for N validations (0: never).")
@click.option("--validate-interval", type=int, default=1, help="Validate every N epochs (0: not at epoch ends).")
@click.option("--validate-interval-updates", type=int, default=0, help="Also validate every N updates (0: off).")
@click.option("--disable-validation", is_flag=True, help="Never validate (no valid split needed).")
@click.option("--best-checkpoint-metric", type=click.Choice(["loss", "nll"]), default="loss",
              help="Validation metric that selects checkpoint_best.pt (lower is better).")
@click.option("--save-interval", type=int, default=1, help="Write checkpoint{EPOCH}.pt every N epochs (0: never).")
@click.option("--save-interval-updates", type=int, default=0,
              help="Write checkpoint_{EPOCH}_{UPDATES}.pt and checkpoint_last.pt every N updates (0: off).")
@click.option("--keep-last-epochs", type=int, default=-1, help="Keep only the newest N epoch checkpoints (-1: all).")
@click.option("--keep-interval-updates", type=int, default=-1,
              help="Keep only the newest N update checkpoints (-1: all).")
@click.option("--reset-optimizer", is_flag=True,
              help="When resuming: keep weights and progress, start a fresh optimizer state.")
@click.option("--reset-run", is_flag=True,
              help="Delete the earlier run in --save-dir (its checkpoints and train_log.jsonl) and train from "
              "scratch. Without it, a --save-dir holding checkpoints or a log but no checkpoint_last.pt is refused.")
@click.option("--finetune-from", type=click.Path(dir_okay=False), default=None,
              help="Start from this checkpoint's weights with a fresh optimizer and schedule "
              "(ignored when --save-dir already holds checkpoint_last.pt).")
@click.option("--seed", type=int, default=1, help="Random seed (initial weights, batch order, dropout).")
@click.option("--device", default="auto", help="auto (GPU when available), cpu, cuda or cuda:N.")
@click.option("--precision", type=click.Choice(TRAIN_PRECISIONS), default="fp32",
              help="fp32 (TF32 matmuls on GPU), bf16 autocast, fp16 autocast with dynamic loss scaling, or "
              "pure-bf16: the model runs in bf16 and the optimizer updates float32 master weights (fairseq's --bf16).")
@click.option("--compile", "compile_model", is_flag=True, help="Compile the model with torch.compile.")
@click.option("--log-interval", type=int, default=100, help="Log training statistics every N updates.")
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
    from nmt_cli.train.log import parse_duration
    from nmt_cli.train.trainer import train as run_training

    cfg = TrainConfig(
        data=params["data_bin"], save_dir=params["save_dir"], arch=params["arch"],
        source_lang=params["source_lang"], target_lang=params["target_lang"],
        train_subset=params["train_subset"], valid_subset=params["valid_subset"],
        max_tokens=params["max_tokens"], batch_size=params["batch_size"],
        required_batch_size_multiple=params["required_batch_size_multiple"], update_freq=params["update_freq"],
        lr=params["lr"], lr_scheduler=params["lr_scheduler"], warmup_updates=params["warmup_updates"],
        warmup_init_lr=params["warmup_init_lr"], adam_betas=parse_betas(params["adam_betas"]),
        adam_eps=params["adam_eps"], weight_decay=params["weight_decay"], clip_norm=params["clip_norm"],
        label_smoothing=params["label_smoothing"], max_update=params["max_update"], max_epoch=params["max_epoch"],
        max_time=parse_duration(params["max_time"]), patience=params["patience"],
        validate_interval=params["validate_interval"], validate_interval_updates=params["validate_interval_updates"],
        disable_validation=params["disable_validation"], best_checkpoint_metric=params["best_checkpoint_metric"],
        save_interval=params["save_interval"], save_interval_updates=params["save_interval_updates"],
        keep_last_epochs=params["keep_last_epochs"], keep_interval_updates=params["keep_interval_updates"],
        reset_optimizer=params["reset_optimizer"], reset_run=params["reset_run"],
        finetune_from=params["finetune_from"], seed=params["seed"],
        device=params["device"], precision=params["precision"], compile=params["compile_model"],
        log_interval=params["log_interval"],
    )
    model_cfg = resolve_config(cfg.arch, overrides_from(params))
    result = run_training(cfg, model_cfg)
    best = f"{result.best_metric:.3f}" if result.best_metric is not None else "n/a"
    click.echo(f"stopped ({result.stop_reason}) after {result.num_updates} updates in epoch {result.epoch}; "
               f"best valid {cfg.best_checkpoint_metric} {best}; checkpoints in {cfg.save_dir}")
