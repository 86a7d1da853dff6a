"""What the CPU inference layers (int8.py, packed.py) share: swapping every linear
layer of a loaded model, and a probe that a layer's kernels run on this CPU."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

LayerMaker = Callable[[nn.Linear], nn.Module]


def replace_linears(model: nn.Module, make: LayerMaker) -> None:
    """Replace every nn.Linear of `model`, in place, by make(linear)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, make(child))


def probe_failure(make: LayerMaker, kernels: str) -> str | None:
    """Why make(linear) fails on a tiny input here, or None when it runs: the ops can
    exist where their kernels cannot run (a CPU that lacks the instructions)."""
    # A forked RNG leaves the global one untouched. (nn.utils.skip_init would too, but
    # it goes through the meta device, whose first use imports sympy, slowing startup.)
    with torch.random.fork_rng(devices=[]):
        probe = nn.Linear(4, 2)
    with torch.no_grad():
        probe.weight.fill_(1.0)
        probe.bias.zero_()
    try:
        make(probe)(torch.ones(1, 4))
    except RuntimeError as error:
        return f"oneDNN's {kernels} kernels do not run here ({str(error).splitlines()[0][:200]})"
    return None
