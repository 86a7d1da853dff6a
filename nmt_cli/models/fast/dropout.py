"""Dropout whose random mask is cheap to draw on a CPU.

torch's CPU dropout draws one random number per element, serially (`bernoulli_`,
whatever the thread count). Here each 64-bit draw of the generator makes four 16-bit
lanes, and an element is kept when its lane is at or above a threshold: a quarter of
the draws, and the mask is made once, with the scale in it, so that the forward and
backward passes are one product each (benchmarks/HISTORY.md). The drop probability is rounded
to a multiple of 1/65536 (0.1 becomes 0.1000061) and the kept elements are scaled by
the exact 1 / (1 - rounded p), so the output's expectation is still its input.

Elsewhere (a GPU, whose dropout kernel draws its mask in parallel, or inside
torch.compile, which generates its own), for p >= 1, and in a model built with
`lane_mask_dropout=False` (`Transformer`, `build_model`, `set_lane_mask_dropout`),
this is F.dropout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LANES = 1 << 16  # values of one 16-bit lane


def keep_mask(shape: torch.Size, drop_count: int) -> Tensor:
    """A bool tensor of `shape`, each element False with probability drop_count / 65536,
    independently, from the default CPU generator."""
    numel = shape.numel()
    draws = torch.empty((numel + 3) // 4, dtype=torch.int64)
    # From the dtype's minimum with no upper bound: all 64 bits random, so each of the
    # four int16 lanes is uniform over [-32768, 32767].
    draws.random_(torch.iinfo(torch.int64).min, None)
    lanes = draws.view(torch.int16)[:numel].view(shape)
    return lanes >= drop_count - LANES // 2


def draws_lane_masks(x: Tensor) -> bool:
    """Whether dropout on x takes its mask from 16-bit lanes: on a CPU, outside torch.compile."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def maybe_dropout(x: Tensor, p: float, training: bool, lane_masks: bool = True) -> Tensor:
    """F.dropout(x, p, training), with a cheaper mask on a CPU unless `lane_masks` is
    False; skipped outright in eval mode (each skipped call saves time when decoding)."""
    if not training or p <= 0:
        return x
    if p >= 1 or not lane_masks or not draws_lane_masks(x):
        return F.dropout(x, p, True)  # p >= 1: F.dropout's zeros, or its error
    drop_count = min(round(p * LANES), LANES - 1)
    # The mask in x's dtype with the scale in it: one product forward and one backward
    # (a bool mask would be converted to x's dtype at each of them).
    scaled_mask = keep_mask(x.shape, drop_count).to(x.dtype).mul_(LANES / (LANES - drop_count))
    return x * scaled_mask


def set_lane_mask_dropout(model: nn.Module, enabled: bool) -> None:
    """Whether the dropout of every part of `model` that has some takes its masks from
    16-bit lanes on a CPU (their `lane_mask_dropout`), or is F.dropout."""
    for module in model.modules():
        if hasattr(module, "lane_mask_dropout"):
            module.lane_mask_dropout = enabled
