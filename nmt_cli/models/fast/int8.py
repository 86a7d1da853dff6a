"""8-bit integer linear layers for decoding on a CPU (`nmt translate --precision int8`).

Every linear layer of a loaded model (attention projections, feed-forward layers, the
output projection) is replaced by `Int8Linear`, which multiplies 8-bit integers with
oneDNN's int8 matrix product (the kernel Inductor emits for quantized models on x86).
The scheme is CTranslate2's, with activations in 7 bits instead of 8:

* weights: symmetric, one scale per output feature, w[n, k] ~ w_scale[n] * w_q[n, k]
  with w_q in [-127, 127], quantized once at load time;
* activations: symmetric, one scale per row (token), computed afresh for every call,
  x[m, k] ~ x_scale[m] * (x_q[m, k] - 64) with x_q in [1, 127].

Activations are stored as unsigned bytes with a zero point of 64 because x86 int8
products take unsigned x signed bytes; and they keep 7 bits because, without VNNI
instructions (AVX2, AVX-512F), such products add pairs of terms into 16 bits, which
2 x 255 x 127 would overflow and 2 x 127 x 127 does not (fbgemm's `reduce_range` makes
the same choice). The kernel sums sum_k (x_q - 64) w_q exactly in 32-bit integers and
scales by w_scale; each row is then scaled by its x_scale and the bias added.

Every row has its own scale and the integer sums are exact, so a row's result does not
depend on the other rows of its batch, nor on the CPU that computes it.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from nmt_cli.errors import NmtError
from nmt_cli.models.fast.linear_swap import probe_failure, replace_linears

WEIGHT_MAX = 127
ACTIVATION_ZERO = 64  # activations x_q - 64 in [-63, 63]
ACTIVATION_RANGE = 63
# Added before the cast to bytes, which truncates: the zero point, and 0.5 to round to nearest.
ROUNDING_OFFSET = ACTIVATION_ZERO + 0.5


def int8_unavailable_reason() -> str | None:
    """Why this torch build or CPU cannot run Int8Linear, or None when it can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    for name in ("qlinear_prepack", "qlinear_pointwise"):
        if not hasattr(torch.ops.onednn, name):
            return f"this torch build has no torch.ops.onednn.{name}"
    return probe_failure(Int8Linear, "int8")


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(N, K) float weight -> int8 values (N, K) and float32 scales (N,), symmetric per row."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1) / WEIGHT_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
    values = torch.round(weight / scale[:, None]).clamp_(-WEIGHT_MAX, WEIGHT_MAX).to(torch.int8)
    return values, scale


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """(M, K) float32 -> uint8 values (M, K) in [1, 127] and scales (M, 1):
    x ~ scale * (values - ACTIVATION_ZERO), rounded to nearest."""
    largest = torch.maximum(x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True).neg_())
    scale = largest.div_(ACTIVATION_RANGE).clamp_(min=torch.finfo(torch.float32).tiny)  # (M, 1)
    # x / scale is within [-63, 63] up to rounding, so x / scale + 64.5 lies in [1.5, 127.5]
    # and the cast's truncation rounds to the nearest of [1, 127]: no clamp needed. Those
    # bytes are the same signed or unsigned, and torch's cast to int8 is vectorized where
    # its cast to uint8 is not.
    offset = _rounding_offset_row(x.size(1), x.dtype, x.device)
    values = torch.addcmul(offset, x, scale.reciprocal()).to(torch.int8).view(torch.uint8)
    return values, scale


@functools.lru_cache(maxsize=16)
def _rounding_offset_row(width: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """ROUNDING_OFFSET in each of `width` columns, made once per width (read, never written).

    As a whole row because addcmul vectorizes that, and broadcasts a 0-d tensor without
    vector instructions."""
    return torch.full((width,), ROUNDING_OFFSET, dtype=dtype, device=device)


class Int8Linear(nn.Module):
    """A frozen nn.Linear for inference, computed in 8-bit integers (see the module docstring)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        values, scale = quantize_weight(linear.weight)
        self.packed_weight = torch.ops.onednn.qlinear_prepack(values, None)
        self.weight_scale = scale
        self.weight_zero = torch.zeros(self.out_features, dtype=torch.long)
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()
        values, scale = quantize_rows(rows)
        # With x_scale 1 the kernel gives w_scale[n] * sum_k (x_q - 64) w_q, in float32.
        out = torch.ops.onednn.qlinear_pointwise(
            values, 1.0, ACTIVATION_ZERO, self.packed_weight, self.weight_scale, self.weight_zero, None,
            1.0, 0, torch.float32, "none", [], "",
        )  # (M, N)
        if self.bias is None:
            out.mul_(scale)
        else:  # one pass over the output, not two
            torch.addcmul(self.bias, out, scale, out=out)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_linears(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model`, in place, by an Int8Linear; returns `model`.

    For decoding on a CPU: `model` must be on the CPU and is no longer trainable. A
    weight shared with the embeddings (tied output projection) stays float32 there.
    """
    reason = int8_unavailable_reason()
    if reason is not None:
        raise NmtError(f"--precision int8: {reason} (use --precision fp32)")
    replace_linears(model, Int8Linear)
    return model
