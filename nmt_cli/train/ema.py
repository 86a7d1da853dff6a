"""An exponential moving average of the weights (`nmt train --ema-decay D`; fairseq's
--ema-decay, OpenNMT-py's -average_decay, Marian's --exponential-smoothing).

The definition, counted in optimizer updates n = 1, 2, ... (an update skipped for lack
of GPU memory does not count): the EMA starts as the initial weights; after update n,
when n <= start_update it is a copy of the weights w_n, else, every `update_freq`-th
update (n % update_freq == 0), it becomes decay * EMA + (1 - decay) * w_n.

It is kept in float32 whatever `--precision` says: it follows the float32 weights that
the optimizer updates (the master weights under pure-bf16). Every rank keeps its own,
identical copy (the ranks' weights are identical), so that validation with the EMA
splits its batches over the ranks as usual; only rank 0 saves it. Integer buffers are
copied, not averaged. Tied weights (shared embeddings) stay one tensor.

A checkpoint holds it under "ema" (docs/FORMATS.md): {"decay", "start_update",
"update_freq", "weights"}, where "weights" is a state dict of the model's architecture,
so that `nmt translate --use-ema` and `nmt average --use-ema` can use it as the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nmt_cli.checkpoints.average import tied_keys
from nmt_cli.checkpoints.ema_weights import CHECKPOINT_KEY, stored_ema_weights
from nmt_cli.config import TrainConfig
from nmt_cli.errors import NmtError


@dataclass(frozen=True)
class EmaSettings:
    decay: float
    start_update: int = 0
    update_freq: int = 1


class Ema:
    """The float32 moving average of a model's state dict (see the module's definition)."""

    def __init__(self, model: nn.Module, settings: EmaSettings) -> None:
        self.settings = settings
        state = model.state_dict()
        self.tied = tied_keys(state)  # key -> earlier key of the same model tensor
        self.weights: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for key, tensor in state.items():
                if key in self.tied:
                    self.weights[key] = self.weights[self.tied[key]]
                else:
                    dtype = torch.float32 if tensor.is_floating_point() else tensor.dtype
                    self.weights[key] = tensor.detach().to(dtype=dtype, copy=True)
        self._averaged = [k for k, t in self.weights.items() if k not in self.tied and t.is_floating_point()]
        self._copied = [k for k, t in self.weights.items() if k not in self.tied and not t.is_floating_point()]
        self._averaged_tensors = [self.weights[k] for k in self._averaged]

    def after_update(self, model: nn.Module, num_updates: int) -> None:
        """Fold in the weights after update `num_updates` (1 for the first)."""
        settings = self.settings
        copying = num_updates <= settings.start_update
        folding = not copying and num_updates % settings.update_freq == 0
        if not (copying or folding or self._copied):
            return  # an update between folds (--ema-update-freq)
        current = model.state_dict()
        with torch.no_grad():
            if copying or folding:
                new = [current[k].float() for k in self._averaged]
                if copying:
                    torch._foreach_copy_(self._averaged_tensors, new)
                else:
                    # ema + (1 - decay) * (w - ema) = decay * ema + (1 - decay) * w, in one pass
                    torch._foreach_lerp_(self._averaged_tensors, new, 1.0 - settings.decay)
            for key in self._copied:
                self.weights[key].copy_(current[key])

    def checkpoint_state(self) -> dict[str, Any]:
        settings = self.settings
        return {"decay": settings.decay, "start_update": settings.start_update, "update_freq": settings.update_freq,
                "weights": self.weights}

    def load_checkpoint_state(self, state: dict[str, Any], path: Path) -> None:
        """Restore the average exactly from a checkpoint's "ema" (the settings are this run's)."""
        weights = stored_ema_weights(state, path)
        for key, tensor in self.weights.items():
            if key not in weights or tuple(weights[key].shape) != tuple(tensor.shape):
                raise NmtError(f"{path}: its EMA weights do not fit the model (at {key})")
        with torch.no_grad():
            for key, tensor in self.weights.items():
                if key not in self.tied:
                    tensor.copy_(weights[key])

    @contextmanager
    def weights_swapped_into(self, model: nn.Module) -> Iterator[None]:
        """Run the block with the EMA in `model`'s tensors (rounded to their dtype), then
        put the model's own values back bit for bit. In place: the optimizer, DDP and
        compiled graphs keep seeing the same parameters, and no random number is drawn.
        For validation: around the forward passes, never around an update."""
        own = {key: tensor.detach().clone() for key, tensor in model.state_dict().items()}
        try:
            _copy_into(model, self.weights)
            yield
        finally:
            _copy_into(model, own)


def _copy_into(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            tensor.copy_(weights[key])


def start_ema(cfg: TrainConfig, model: nn.Module, resume: dict[str, Any] | None, path: Path,
              warn: Callable[[str], None]) -> Ema | None:
    """This run's EMA (None without --ema-decay / --store-ema): the resumed checkpoint's,
    exactly, or else one that starts from the current weights."""
    decay = cfg.ema_decay_in_use
    if decay is None:
        if resume is not None and resume.get(CHECKPOINT_KEY) is not None:
            warn(f"{path} holds EMA weights but this run keeps none (no --ema-decay): its checkpoints will lack them")
        return None
    ema = Ema(model, EmaSettings(decay, cfg.ema_start_update, cfg.ema_update_freq))
    if resume is not None:
        if resume.get(CHECKPOINT_KEY) is None:
            warn(f"{path} holds no EMA weights: the EMA starts from its weights at update {resume.get('num_updates')}")
        else:
            ema.load_checkpoint_state(resume, path)
    return ema
