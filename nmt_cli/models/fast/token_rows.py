"""The encoder's work on tokens only: a padded batch's pads skip its linear layers.

A batch of source sentences is padded to its longest. Everything in an encoder layer but
attention (the projections, the feed-forward, residuals, LayerNorms) acts on each
position alone, so it can run on the positions that hold tokens, packed into rows, and
leave the pads out; attention alone needs the padded (B, S) layout, with zeros at the
pads (their keys are masked). A batch that many clients fill at once mixes lengths, and
a quarter of its positions or more can be pads. The output is the reference encoder's at every
token, and zero at the pads, which cross-attention masks.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class TokenRows:
    """Where a padded (B, S) batch holds tokens, and the moves between its padded
    layout (B, S, C) and the packed one (N, C), N the number of tokens."""

    index: Tensor  # (N,) long: the positions b * S + s that hold tokens, in order
    batch: int  # B
    length: int  # S

    @staticmethod
    def if_pads_reach(padding_mask: Tensor, fewest_pads: float) -> TokenRows | None:
        """The token rows of `padding_mask` (B, S), True at pads; None when its pads are
        under `fewest_pads` of its positions (0: any batch)."""
        if int(padding_mask.sum()) < fewest_pads * padding_mask.numel():
            return None
        batch, length = padding_mask.shape
        return TokenRows(padding_mask.logical_not().view(-1).nonzero().squeeze(1), batch, length)

    def pack(self, x: Tensor) -> Tensor:
        """(B, S, C) -> (N, C): the token positions' rows, in order."""
        return x.reshape(self.batch * self.length, x.size(-1)).index_select(0, self.index)

    def unpack(self, rows: Tensor) -> Tensor:
        """(N, C) -> (B, S, C), zeros at the pads."""
        padded = rows.new_zeros(self.batch * self.length, rows.size(-1))
        return padded.index_copy_(0, self.index, rows).view(self.batch, self.length, rows.size(-1))
