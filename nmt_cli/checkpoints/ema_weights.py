"""The EMA weights a checkpoint may hold (its "ema" entry, written by `nmt train
--ema-decay`, see train/ema.py and docs/FORMATS.md), for `--use-ema` of translate and average."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nmt_cli.errors import NmtError

CHECKPOINT_KEY = "ema"


def stored_ema_weights(state: dict[str, Any], path: str | Path) -> dict[str, torch.Tensor]:
    """The EMA weights a checkpoint holds, or one NmtError naming the file."""
    ema = state.get(CHECKPOINT_KEY)
    if ema is None:
        raise NmtError(f"{path} holds no EMA weights (it was not trained with --ema-decay)")
    weights = ema.get("weights") if isinstance(ema, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in weights.items()):
        raise NmtError(f"{path}: its 'ema' entry has no dict of weights")
    return weights


def with_ema_as_model(state: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """The checkpoint `state` with its EMA weights as its model weights (`--use-ema`)."""
    return {**state, "model": stored_ema_weights(state, path)}
