"""A bf16 working copy of the model, trained through float32 master weights
(`nmt train --precision pure-bf16`, what fairseq's --bf16 and Marian's
`--precision float16 float32` do).

Under autocast (`--precision bf16`) the weights, the residual stream and LayerNorm stay
float32: every matrix product casts its float32 input to bf16, its bf16 output becomes
float32 again where it joins the residual stream, and the backward pass does the same
with the gradients. On a GPU those casts are a visible part of an update, and
LayerNorm and the residual adds read and write float32 activations. Here the model
that runs forward and backward holds bf16 weights, so its activations and gradients are
bf16 end to end (LayerNorm and softmax still accumulate in float32 inside their kernels).

What must not lose precision stays float32: the master weights, which the optimizer
updates and checkpoints hold (a bf16 weight would swallow updates smaller than 1/256
of it), Adam's moments, and the sum of the gradients of an update. Each backward pass
writes the working model's gradients into one flat bf16 buffer, which is added into
one flat float32 buffer, the master weights' gradients. Across processes that buffer
is all-reduced once per update, in float32, by `train_update` rather than DDP: DDP would
sum bf16 gradients. The price is that communication no longer overlaps the backward
pass; it is one call for the whole gradient after it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class MasterWeights:
    """The float32 `master` model and its bf16 working copy, parameter by parameter.

    Both models' gradients are views into one flat buffer each, so that moving a
    backward pass's gradients into the master's is one kernel, not one per parameter.
    Shared parameters (tied embeddings) stay shared in the copy and count once.
    """

    def __init__(self, master: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        self.working = copy.deepcopy(master).to(dtype)
        self.master_params = list(master.parameters())
        self.working_params = list(self.working.parameters())
        device = self.master_params[0].device
        total = sum(p.numel() for p in self.master_params)
        self.master_grads = torch.zeros(total, dtype=torch.float32, device=device)
        self.working_grads = torch.zeros(total, dtype=dtype, device=device)
        offset = 0
        for master_param, working_param in zip(self.master_params, self.working_params, strict=True):
            end = offset + master_param.numel()
            master_param.grad = self.master_grads[offset:end].view_as(master_param)
            # Backward passes add into an existing .grad in place: into this buffer.
            working_param.grad = self.working_grads[offset:end].view_as(working_param)
            offset = end

    def collect_gradients(self, first: bool) -> None:
        """Move the gradients of the backward passes since the last call into the master's:
        they replace what the master held when `first` (the update's first pass)."""
        if first:
            self.master_grads.copy_(self.working_grads)
        else:
            self.master_grads.add_(self.working_grads)
        self.working_grads.zero_()

    def copy_to_working(self) -> None:
        """Round the master weights into the working model (after each optimizer step,
        and after weights are loaded into the master)."""
        with torch.no_grad():
            torch._foreach_copy_(self.working_params, self.master_params)
