"""The output projection of a CPU decoding step through oneDNN's kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _find_onednn_linear():
    """torch's oneDNN linear (the op Inductor's CPU backend emits), or None where the build lacks it."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_ONEDNN_LINEAR = _find_onednn_linear()


def vocabulary_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """hidden (N, D) x output projection weight (V, D) (+ bias (V,)) -> logits (N, V), as F.linear.

    On a CPU in float32 this runs oneDNN's kernel, which is faster than MKL's sgemm
    (F.linear's) for a decoding step's shapes on the CPUs measured (CTranslate2 picks
    oneDNN there too; benchmarks/HISTORY.md). Elsewhere, and under autocast, F.linear.
    """
    on_cpu_fp32 = hidden.device.type == "cpu" and hidden.dtype == weight.dtype == torch.float32
    if _ONEDNN_LINEAR is not None and on_cpu_fp32 and not torch.is_autocast_enabled("cpu"):
        return _ONEDNN_LINEAR(hidden.contiguous(), weight, bias, "none", [], "")
    return F.linear(hidden, weight, bias)
