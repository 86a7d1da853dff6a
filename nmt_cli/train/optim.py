"""Adam(W) and the learning-rate schedules, as pure `lr(step)` functions.

`step` is the 1-based number of the update about to be made. Two forms of the paper's
inverse square-root schedule are offered:

* `inverse_sqrt` (fairseq's form, `--lr` is the peak): linear warm-up from
  `--warmup-init-lr` to `--lr` over `--warmup-updates`, then `lr * sqrt(warmup / step)`.
* `noam` (the paper's formula, `--lr` is a multiplier):
  `lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`; with `--lr 1` and
  d_model 512, warm-up 4000 it peaks at about 7e-4.

`fixed` (fairseq's) keeps `--lr`; with `--warmup-updates N` > 0 it rises to it linearly
first: update `step` uses `lr * min(1, step / N)`, the rate fairseq sets for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nmt_cli.errors import NmtError

SCHEDULES = ("inverse_sqrt", "noam", "fixed")


def inverse_sqrt_lr(step: int, peak_lr: float, warmup_updates: int, warmup_init_lr: float = 0.0) -> float:
    """fairseq's inverse_sqrt: linear warm-up to `peak_lr`, then decay as 1/sqrt(step)."""
    if step < warmup_updates:
        return warmup_init_lr + (peak_lr - warmup_init_lr) * step / warmup_updates
    return peak_lr * math.sqrt(warmup_updates / step)


def noam_lr(step: int, d_model: int, warmup_updates: int, factor: float = 1.0) -> float:
    """The paper's schedule (Vaswani et al., 2017, eq. 3), scaled by `factor`."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_updates**-1.5)


@dataclass(frozen=True)
class LrSchedule:
    """Which schedule, and its constants; `lr_at(step)` is the rate for update `step`."""

    name: str
    lr: float
    warmup_updates: int
    warmup_init_lr: float = 0.0
    d_model: int = 512

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise NmtError(f"unknown --lr-scheduler {self.name!r}; choose from {', '.join(SCHEDULES)}")
        if self.name != "fixed" and self.warmup_updates <= 0:
            raise NmtError(f"--lr-scheduler {self.name} needs --warmup-updates > 0")
        if self.lr <= 0:
            raise NmtError("--lr must be positive")

    def lr_at(self, step: int) -> float:
        if self.name == "inverse_sqrt":
            return inverse_sqrt_lr(step, self.lr, self.warmup_updates, self.warmup_init_lr)
        if self.name == "noam":
            return noam_lr(step, self.d_model, self.warmup_updates, self.lr)
        if self.warmup_updates > 0:  # fixed with warm-up: fairseq's (num_updates + 1) / warmup_updates
            return self.lr * min(1.0, step / self.warmup_updates)
        return self.lr


def build_optimizer(
    params: list[torch.nn.Parameter],
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    device: torch.device,
) -> torch.optim.AdamW:
    """AdamW (decoupled weight decay; plain Adam when it is 0), fused on CPU and GPU.

    The fused kernel updates all parameters in one pass; on a CPU torch's default
    otherwise runs a dozen operators per parameter. The learning rate is set before
    every update from the schedule, so it starts at 0.
    """
    fused = True if device.type in ("cpu", "cuda") else None  # None: torch's default elsewhere
    return torch.optim.AdamW(params, lr=0.0, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)


def set_hyperparameters(optimizer: torch.optim.Optimizer, betas: tuple[float, float], eps: float,
                        weight_decay: float) -> None:
    """Give every param group the settings build_optimizer gives it (one group, all
    parameters decayed alike). A loaded optimizer state brings the saved run's settings
    with its moments; a resumed run with new --adam-betas, --adam-eps or --weight-decay
    uses the new ones, as it does a new --lr."""
    for group in optimizer.param_groups:
        group["betas"], group["eps"], group["weight_decay"] = tuple(betas), eps, weight_decay


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
