"""An ensemble of models behind the same decoding protocol as one model.

Log-probabilities are averaged in probability space, as fairseq does:
log(mean_i p_i) = logsumexp_i(log p_i) - log(n).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from nmt_cli.data.dictionary import check_same_symbols
from nmt_cli.decode.search import IncrementalDecoder


def check_same_dictionaries(names: Sequence[str], dicts: Sequence[tuple[list[str], list[str]]]) -> None:
    """Raise unless every model has the (source, target) symbol lists of the first."""
    for name, (src, tgt) in zip(names[1:], dicts[1:]):
        for side, mine, first in (("source", src, dicts[0][0]), ("target", tgt, dicts[0][1])):
            check_same_symbols(f"the {side} dictionary of {name}", mine, names[0], first,
                               "; the models of an ensemble must share their dictionaries")


class Ensemble:
    """Several models decoded together; each keeps its own cache and encoder output."""

    def __init__(self, models: Sequence[IncrementalDecoder]) -> None:
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = list(models)

    @property
    def sentence_drop_fraction(self) -> float:
        """The largest of the models' (see IncrementalDecoder)."""
        return max(m.sentence_drop_fraction for m in self.models)

    def encode(self, src_tokens: Tensor) -> list[Any]:
        return [m.encode(src_tokens) for m in self.models]

    def new_cache(self) -> list[Any]:
        """One cache per model."""
        return [m.new_cache() for m in self.models]

    def decode_step(self, prev_tokens: Tensor, encoder_out: list[Any], cache: list[Any]) -> Tensor:
        lprobs = torch.stack([
            m.decode_step(prev_tokens, enc, c).float() for m, enc, c in zip(self.models, encoder_out, cache)
        ])  # (n, B, V)
        if len(self.models) == 1:
            return lprobs[0]
        return torch.logsumexp(lprobs, dim=0) - math.log(len(self.models))

    def reorder_cache(self, cache: list[Any], index: Tensor, sentence_index: Tensor | None = None) -> None:
        for m, c in zip(self.models, cache):
            m.reorder_cache(c, index, sentence_index=sentence_index)

    def reorder_encoder_out(self, encoder_out: list[Any], index: Tensor) -> list[Any]:
        return [m.reorder_encoder_out(enc, index) for m, enc in zip(self.models, encoder_out)]
