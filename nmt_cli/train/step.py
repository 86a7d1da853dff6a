"""One optimizer update and one validation pass, built for speed on GPU.

An update runs `update_freq` forward/backward passes on this rank's batches and one
optimizer step. Losses are summed over tokens and the gradient is scaled by
`1 / total target tokens of the whole update` (all accumulated batches, all ranks; known
from the batch plan without communication), so accumulation and several processes are
exactly one big batch. Gradients are summed over processes by DDP (which averages, so
the scale is multiplied by the world size) or, under `--precision pure-bf16`, by one
all-reduce of the float32 gradient sum (`master_weights.py`). Nothing here waits for
the GPU: statistics stay device tensors until the trainer logs them.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nmt_cli.config import ModelConfig, TrainConfig
from nmt_cli.data.dictionary import PAD_ID
from nmt_cli.data.pairs import PairDataset, collate
from nmt_cli.models.registry import build_model
from nmt_cli.train.distributed import DistInfo, all_reduce_sum
from nmt_cli.train.loss import LossKernels, label_smoothed_nll_loss
from nmt_cli.train.master_weights import MasterWeights
from nmt_cli.train.optim import LrSchedule, build_optimizer, set_lr
from nmt_cli.train.resume_state import seed_for_update

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "pure-bf16": None}


class ModelWithLoss(nn.Module):
    """The model followed by the loss: the unit that DDP wraps and torch.compile
    compiles, so that the compiler can fuse the loss into the output projection."""

    def __init__(self, model: nn.Module, label_smoothing: float, device_type: str, autocast_dtype: torch.dtype | None,
                 loss_kernels: LossKernels = LossKernels.AUTO) -> None:
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.loss_kernels = loss_kernels
        self.device_type = device_type
        self.autocast_dtype = autocast_dtype

    def forward(self, src_tokens: torch.Tensor, prev_output_tokens: torch.Tensor, target: torch.Tensor,
                src_padded: bool = True):
        if self.autocast_dtype is None:
            logits = self.model(src_tokens, prev_output_tokens, src_padded=src_padded)  # (B, T, V)
        else:
            with torch.autocast(self.device_type, dtype=self.autocast_dtype):
                logits = self.model(src_tokens, prev_output_tokens, src_padded=src_padded)
        return label_smoothed_nll_loss(logits, target, self.label_smoothing, PAD_ID, self.loss_kernels)


@dataclass
class Engine:
    """The model and everything that updates it."""

    cfg: TrainConfig
    dist: DistInfo
    model: nn.Module  # the plain model, in float32: what the optimizer updates and checkpoints hold
    runner: nn.Module  # what training calls: ModelWithLoss, wrapped in DDP and/or torch.compile
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None  # fp16 only
    schedule: LrSchedule
    master: MasterWeights | None = None  # pure-bf16 only: `model` is its master, runner runs its working copy

    @property
    def device(self) -> torch.device:
        return self.dist.device

    @property
    def working_model(self) -> nn.Module:
        """The model that runs forward passes: the bf16 copy under pure-bf16, else `model`."""
        return self.master.working if self.master is not None else self.model

    def discard_gradients(self) -> None:
        """Forget the gradients of an update that failed part way (out of memory)."""
        if self.master is not None:
            self.master.working_grads.zero_()  # the master's are overwritten by the next update's first pass
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict)
        if self.master is not None:
            self.master.copy_to_working()

    def autocast(self) -> contextlib.AbstractContextManager:
        dtype = AUTOCAST_DTYPES[self.cfg.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)


@dataclass
class UpdateStats:
    """Device tensors: summed loss and nll (nats) of this rank, the gradient norm."""

    loss: torch.Tensor
    nll: torch.Tensor
    grad_norm: torch.Tensor


def build_engine(cfg: TrainConfig, model_cfg: ModelConfig, src_vocab: int, tgt_vocab: int, dist: DistInfo,
                 loss_kernels: LossKernels = LossKernels.AUTO) -> Engine:
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    if dist.device.type == "cuda" and cfg.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = build_model(model_cfg, src_vocab, tgt_vocab).to(dist.device)
    master = MasterWeights(model, torch.bfloat16) if cfg.precision == "pure-bf16" else None
    working = master.working if master is not None else model
    runner: nn.Module = ModelWithLoss(working, cfg.label_smoothing, dist.device.type, AUTOCAST_DTYPES[cfg.precision],
                                      loss_kernels)
    # Under pure-bf16 the update all-reduces the float32 gradient sum itself (train_update).
    if dist.world_size > 1 and master is None:
        device_ids = [dist.device.index] if dist.device.type == "cuda" else None
        runner = DistributedDataParallel(runner, device_ids=device_ids)
    if cfg.compile:
        runner = torch.compile(runner)
    optimizer = build_optimizer(list(model.parameters()), cfg.adam_betas, cfg.adam_eps, cfg.weight_decay, dist.device)
    scaler = torch.amp.GradScaler(dist.device.type) if cfg.precision == "fp16" else None
    schedule = LrSchedule(cfg.lr_scheduler, cfg.lr, cfg.warmup_updates, cfg.warmup_init_lr, model_cfg.encoder_embed_dim)
    return Engine(cfg, dist, model, runner, optimizer, scaler, schedule, master)


def _no_sync_unless(runner: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """DDP all-reduces gradients only in the last backward pass of an update."""
    ddp = getattr(runner, "_orig_mod", runner)
    if sync or not isinstance(ddp, DistributedDataParallel):
        return contextlib.nullcontext()
    return ddp.no_sync()


def train_update(
    engine: Engine,
    data: PairDataset,
    shares: list[np.ndarray],
    fallback: np.ndarray,
    update_ntokens: int,
    num_updates: int,
) -> UpdateStats:
    """Update `num_updates + 1`: forward/backward on `shares`, then one optimizer step.

    Every rank runs exactly `update_freq` passes so that DDP's all-reduces line up; a
    rank short of batches at the end of an epoch reruns `fallback` with weight 0.
    """
    cfg, runner, optimizer, scaler, master = engine.cfg, engine.runner, engine.optimizer, engine.scaler, engine.master
    runner.train()
    set_lr(optimizer, engine.schedule.lr_at(num_updates + 1))
    seed_for_update(cfg.seed, num_updates, engine.dist.rank)
    passes = [(b, 1.0) for b in shares] + [(fallback, 0.0)] * (cfg.update_freq - len(shares))
    # DDP averages over ranks; pure-bf16's own all-reduce sums.
    grad_scale = (1 if master is not None else engine.dist.world_size) / update_ntokens
    loss_sum = torch.zeros((), device=engine.device)
    nll_sum = torch.zeros((), device=engine.device)
    for i, (indices, weight) in enumerate(passes):
        batch = collate(data, indices).to(engine.device)
        with _no_sync_unless(runner, sync=i == len(passes) - 1):
            loss, nll = runner(batch.src_tokens, batch.prev_output_tokens, batch.target, batch.src_padded)
            scaled = loss * (grad_scale * weight)
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        if master is not None:
            master.collect_gradients(first=i == 0)
        loss_sum += loss.detach() * weight
        nll_sum += nll * weight
    if master is not None:
        all_reduce_sum(master.master_grads, engine.dist)
    params = [p for p in engine.model.parameters() if p.grad is not None]
    if scaler is not None:
        scaler.unscale_(optimizer)
    if cfg.clip_norm > 0 or not hasattr(torch.nn.utils, "get_total_norm"):  # the latter: torch < 2.6
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm if cfg.clip_norm > 0 else math.inf)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if scaler is not None:
        scaler.step(optimizer)  # skipped when the gradients overflowed
        scaler.update()
    else:
        optimizer.step()
    if master is not None:
        master.copy_to_working()  # the master's gradients are overwritten by the next update's first pass
    else:
        optimizer.zero_grad(set_to_none=True)
    return UpdateStats(loss_sum, nll_sum, grad_norm)


@torch.no_grad()
def evaluate(engine: Engine, data: PairDataset, batches: list[np.ndarray]) -> dict[str, float]:
    """Label-smoothed loss and nll (bits per token) and perplexity over `batches`.

    Ranks split the batches and sum their totals.
    """
    model = engine.working_model
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=engine.device)  # loss, nll, tokens
    for indices in batches[engine.dist.rank :: engine.dist.world_size]:
        batch = collate(data, indices).to(engine.device)
        with engine.autocast():
            logits = model(batch.src_tokens, batch.prev_output_tokens, src_padded=batch.src_padded)  # (B, T, V)
        loss, nll = label_smoothed_nll_loss(logits, batch.target, engine.cfg.label_smoothing, PAD_ID)
        totals += torch.stack([loss.double(), nll.double(), torch.tensor(float(batch.ntokens), dtype=torch.float64, device=engine.device)])
    loss, nll, tokens = all_reduce_sum(totals, engine.dist).tolist()
    tokens = max(tokens, 1.0)
    loss_bits, nll_bits = loss / tokens / math.log(2), nll / tokens / math.log(2)
    return {"loss": loss_bits, "nll": nll_bits, "ppl": 2.0**nll_bits, "tokens": int(tokens)}
