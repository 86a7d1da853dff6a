"""Training statistics between two log lines, kept on the device.

Adding an update's numbers launches a few tiny kernels and never waits for the GPU;
only `totals()` (once per `--log-interval` updates) copies them to the host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt_cli.errors import NmtError
from nmt_cli.train.distributed import DistInfo, all_reduce_max, all_reduce_sum
from nmt_cli.train.step import UpdateStats


@dataclass
class WindowTotals:
    loss: float  # nats, summed over all ranks
    nll: float
    tokens: int
    grad_norm: float  # mean over the window's updates
    overflows: int  # fp16 updates skipped for inf/NaN gradients


@dataclass
class Window:
    sums: torch.Tensor  # (4,) loss, nll, grad norm, overflows
    first_bad_update: torch.Tensor  # () first update with a non-finite loss, 0 if none
    updates: int
    tokens: int
    start_time: float

    @classmethod
    def start(cls, device: torch.device) -> "Window":
        zero = torch.zeros((), dtype=torch.int64, device=device)
        return cls(torch.zeros(4, dtype=torch.float64, device=device), zero, 0, 0, time.monotonic())

    def add(self, stats: UpdateStats, ntokens: int, update: int, fp16: bool) -> None:
        finite_norm = torch.isfinite(stats.grad_norm)
        # fp16 overflows are the scaler's business (the step was skipped); keep them out of the means.
        norm = torch.where(finite_norm, stats.grad_norm, 0.0) if fp16 else stats.grad_norm
        overflow = (~finite_norm).double() if fp16 else torch.zeros((), dtype=torch.float64, device=norm.device)
        loss = torch.where(torch.isfinite(stats.loss), stats.loss, 0.0) if fp16 else stats.loss
        nll = torch.where(torch.isfinite(stats.nll), stats.nll, 0.0) if fp16 else stats.nll
        self.sums += torch.stack([loss.double(), nll.double(), norm.double(), overflow])
        bad = (self.first_bad_update == 0) & ~torch.isfinite(stats.loss)
        self.first_bad_update = torch.where(bad, update, self.first_bad_update)
        self.updates += 1
        self.tokens += ntokens

    def checkpoint_state(self, dist: DistInfo) -> dict[str, Any]:
        """The window so far (loss and nll summed over ranks), for a checkpoint: a run resumed
        from it writes the same next log line as an uninterrupted run. Every rank calls this."""
        sums = self.sums.clone()
        sums[:2] = all_reduce_sum(sums[:2].contiguous(), dist)
        return {"sums": sums.cpu(), "first_bad_update": int(self.first_bad_update.item()),
                "updates": self.updates, "tokens": self.tokens}

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any], device: torch.device, is_main: bool) -> "Window":
        sums = state["sums"].to(device=device, dtype=torch.float64)
        if not is_main:
            sums[:2] = 0  # rank 0 carries the loss and nll summed over all ranks
        first_bad = torch.tensor(int(state["first_bad_update"]), dtype=torch.int64, device=device)
        return cls(sums, first_bad, int(state["updates"]), int(state["tokens"]), time.monotonic())

    def totals(self, dist: DistInfo) -> WindowTotals:
        sums = self.sums.clone()
        sums[:2] = all_reduce_sum(sums[:2].contiguous(), dist)
        loss, nll, norm, overflows = sums.tolist()
        counted = max(self.updates - int(overflows), 1)
        return WindowTotals(loss, nll, self.tokens, norm / counted, int(overflows))

    def raise_if_not_finite(self, fp16: bool, dist: DistInfo, last_checkpoint: Path) -> None:
        """NmtError naming the first update whose loss was NaN/inf (fp16: never, the
        scaler skips such steps), and `last_checkpoint` if it exists: every save calls
        this first, so a checkpoint on disk predates the NaN."""
        if fp16:
            return
        bad = int(all_reduce_max(self.first_bad_update.clone(), dist).item())
        if bad:
            saved = f" ({last_checkpoint.name} predates it)" if last_checkpoint.exists() else ""
            raise NmtError(
                f"the training loss became NaN/inf at update {bad}; lower --lr, set --clip-norm, "
                f"or use --precision bf16/fp32{saved}"
            )
