"""Linear layers on weights packed once for oneDNN, for decoding on a CPU: `nmt
translate --device cpu` in float32 (the default) and with --precision bf16.

oneDNN's products read their weight in a blocked layout. On a plain weight they make
that layout afresh at every call; `PackedLinear` makes it once, at load time
(`torch.ops.mkldnn._reorder_linear_weight`, the layout Inductor's CPU freezing uses),
so a decoding step, which reads every weight, spends nothing on reordering them. In bf16
it also replaces autocast, which keeps no cast weights under `torch.inference_mode` and
so casts every float32 weight to bf16 again at every call. The arithmetic stays
autocast's: inputs rounded to bf16, bf16 weights and bias, float32 sums, a bf16 result.
(Timings: benchmarks/HISTORY.md, "bf16 on a CPU" and "Rerun on a later day".)

The packed weight is a copy: a weight shared with the embeddings (a tied output
projection) stays as it was for the embeddings, which costs a second copy of it (in
float32, 64 MB for a 32,000 x 512 vocabulary).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt_cli.models.fast.linear_swap import probe_failure, replace_linears
from nmt_cli.models.layers import DecoderLayer, EncoderLayer

# oneDNN picks its blocked layout for this many rows; every row count works with it. A
# beam-search step has beams x sentences rows (128 for beam 4 and 32 sentences).
TYPICAL_ROWS = 128

PACKED_DTYPES = (torch.float32, torch.bfloat16)


def packed_unavailable_reason(dtype: torch.dtype) -> str | None:
    """Why this torch build or CPU cannot run PackedLinear in `dtype`, or None when it can."""
    if dtype not in PACKED_DTYPES:
        return f"no packed linear layers in {dtype}"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    needed = ("_reorder_linear_weight", "_linear_pointwise")
    if dtype == torch.bfloat16:
        needed += ("_is_mkldnn_bf16_supported",)
    for name in needed:
        if not hasattr(torch.ops.mkldnn, name):
            return f"this torch build has no torch.ops.mkldnn.{name}"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no bf16 instructions for oneDNN"
    return probe_failure(lambda linear: PackedLinear(linear, dtype), str(dtype).removeprefix("torch."))


class PackedLinear(nn.Module):
    """A frozen nn.Linear for inference in `dtype` (float32 or bf16), its weight in
    oneDNN's layout (see the module docstring); with `relu`, relu(linear(x)).

    With `relu` the product applies the ReLU as it writes its result: one pass fewer over
    a feed-forward layer's widest activations. Rounding to bf16 keeps signs, so bf16
    gives the same. One difference from torch.relu: oneDNN's ReLU turns NaN into 0. In a
    feed-forward layer a NaN input still reaches the output through the residual
    connection; only NaN made by this layer's own weights would vanish, and loading
    refuses weights that are not finite (checkpoint.check_finite_weights).
    """

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, relu: bool = False) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.dtype = dtype
        self.relu = relu
        weight = linear.weight.detach().to(dtype)
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, TYPICAL_ROWS)
        self.bias = None if linear.bias is None else linear.bias.detach().to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        post_op = "relu" if self.relu else "none"
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed_weight, self.bias, post_op, [], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={self.dtype}, relu={self.relu}")


def pack_linears(model: nn.Module, dtype: torch.dtype) -> bool:
    """Replace every nn.Linear of `model` (on the CPU), in place, by a PackedLinear in `dtype`.

    Returns False, changing nothing, where this torch build or CPU cannot run them; the
    model then decodes as before (bf16: under autocast), with the same results.
    """
    if packed_unavailable_reason(dtype) is not None:
        return False
    for layer in model.modules():
        if isinstance(layer, (EncoderLayer, DecoderLayer)) and layer.wiring.activation == "relu":
            # The feed-forward's ReLU moves into fc1 (oneDNN's post-op); other activations stay.
            layer.fc1 = PackedLinear(layer.fc1, dtype, relu=True)
            layer.wiring.fc1_applies_relu = True
    replace_linears(model, lambda linear: PackedLinear(linear, dtype))
    return True
