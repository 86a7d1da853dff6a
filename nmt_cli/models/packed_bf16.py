"""bf16 linear layers for decoding on a CPU (`nmt translate --precision bf16 --device cpu`).

Under autocast, every call of a float32 nn.Linear casts its whole weight to bf16 again:
autocast keeps no cast weights under `torch.inference_mode`, and a transformer_base
decoding step reads ~38M weights. `PackedBf16Linear` casts its weight once, at load
time, and stores it in oneDNN's blocked layout, which a product on a plain bf16 weight
makes afresh at every call. On one core of a CPU with AMX, a (128, 512) x (512, 2048)
product takes 0.70 ms under autocast, 0.43 ms on a bf16 weight and 0.29 ms on the
packed one; a 32,000-word output projection 19.5, 7.8 and 3.5 ms.

The arithmetic is autocast's: inputs rounded to bf16, bf16 weights and bias, float32
sums, a bf16 result. A weight shared with the embeddings (tied output projection) is
copied, so the embeddings keep their float32 values.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt_cli.models.linear_swap import probe_failure, replace_linears

# oneDNN picks its blocked layout for this many rows; every row count works with it. A
# beam-search step has beams x sentences rows (128 for beam 4 and 32 sentences).
TYPICAL_ROWS = 128


def packed_bf16_unavailable_reason() -> str | None:
    """Why this torch build or CPU cannot run PackedBf16Linear, or None when it can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    for name in ("_is_mkldnn_bf16_supported", "_reorder_linear_weight", "_linear_pointwise"):
        if not hasattr(torch.ops.mkldnn, name):
            return f"this torch build has no torch.ops.mkldnn.{name}"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no bf16 instructions for oneDNN"
    return probe_failure(PackedBf16Linear, "bf16")


class PackedBf16Linear(nn.Module):
    """A frozen nn.Linear for inference in bf16, its weight in oneDNN's layout (see the module docstring)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach().to(torch.bfloat16)
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, TYPICAL_ROWS)
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linears_bf16(model: nn.Module) -> bool:
    """Replace every nn.Linear of `model` (on the CPU), in place, by a PackedBf16Linear.

    Returns False, changing nothing, where this torch build or CPU cannot run them; the
    model then decodes under autocast as before, with the same results.
    """
    if packed_bf16_unavailable_reason() is not None:
        return False
    replace_linears(model, PackedBf16Linear)
    return True
