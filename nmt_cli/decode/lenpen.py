"""Length penalties: how a finished hypothesis's summed log-probability is normalized.

`length` counts every output token including the final `</s>`, as fairseq does.
"""

from __future__ import annotations


def length_penalty(length: int, lenpen: float, style: str) -> float:
    """The divisor of a hypothesis's score.

    fairseq (SequenceGenerator, the default): length ** lenpen.
    gnmt (Wu et al. 2016, used by the Transformer paper with lenpen 0.6):
    ((5 + length) / 6) ** lenpen.
    """
    if style == "fairseq":
        return float(length) ** lenpen
    if style == "gnmt":
        return ((5.0 + length) / 6.0) ** lenpen
    raise ValueError(f"unknown length penalty style {style!r}")
