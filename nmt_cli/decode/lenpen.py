"""Length penalties: how a finished hypothesis's summed log-probability is normalized.

`length` counts every output token including the final `</s>`, as fairseq does.
"""

from __future__ import annotations

from torch import Tensor


def length_penalty(length: int | Tensor, lenpen: float, style: str) -> float | Tensor:
    """The divisor of a hypothesis's score (a tensor of them for a tensor of lengths).

    fairseq (SequenceGenerator, the default): length ** lenpen.
    gnmt (Wu et al. 2016, used by the Transformer paper with lenpen 0.6):
    ((5 + length) / 6) ** lenpen.
    """
    if style == "fairseq":
        return (length if isinstance(length, Tensor) else float(length)) ** lenpen
    if style == "gnmt":
        return ((5.0 + length) / 6.0) ** lenpen
    raise ValueError(f"unknown length penalty style {style!r}")
