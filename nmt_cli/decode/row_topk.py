"""The k largest entries of each row of a wide tensor, as `topk`, faster on a CPU.

torch's CPU topk copies every row into (value, index) pairs before its partial sort,
which costs many passes over the rows of a beam-search step. `row_topk` makes one pass
instead, for the maxima of blocks of 64 columns, and sorts only the k blocks with the
largest maxima (and the columns past the last whole block); the wider the vocabulary,
the more that saves.

Those blocks (and the tail) hold the k largest values. Take the i-th largest value
v_i and the entries at least as large: if every block holding one of them is chosen,
so are they all; if one such block is not chosen, each of the k chosen blocks has a
maximum at least as large as that block's, so at least v_i. Either way the chosen blocks hold
at least i entries >= v_i, so the values returned are exactly topk's; between equal
values the columns may differ from topk's (whose choice torch leaves open too).
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 64
# Blocks pay only when they cut the row to a small part: from about 5 times the kept
# blocks' width, level with topk at 4 (benchmarks/HISTORY.md, "Candidate selection").
MIN_WIDTH_PER_BLOCK_KEPT = 5


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """x.topk(k, dim=1) for a 2-D tensor x (R, V): values (R, k) best first, and their columns."""
    R, V = x.shape
    if x.device.type != "cpu" or V < MIN_WIDTH_PER_BLOCK_KEPT * k * BLOCK:
        return x.topk(k, dim=1)
    blocks = V // BLOCK
    whole = x[:, : blocks * BLOCK].view(R, blocks, BLOCK)
    chosen = whole.amax(dim=2).topk(k, dim=1).indices  # (R, k) block numbers
    candidates = whole.gather(1, chosen.unsqueeze(2).expand(R, k, BLOCK)).view(R, k * BLOCK)
    tail = V - blocks * BLOCK
    if tail:
        candidates = torch.cat([candidates, x[:, blocks * BLOCK :]], dim=1)
    values, picked = candidates.topk(k, dim=1)
    # Candidate column c is column c % BLOCK of chosen block c // BLOCK; past k * BLOCK, the tail's.
    slot = torch.div(picked, BLOCK, rounding_mode="floor").clamp_(max=k - 1)
    columns = chosen.gather(1, slot) * BLOCK + picked % BLOCK
    if tail:
        columns = torch.where(picked < k * BLOCK, columns, picked + (blocks - k) * BLOCK)
    return values, columns
