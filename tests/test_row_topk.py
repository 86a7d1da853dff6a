"""row_topk (the block pass beam search uses on a CPU) against torch's own topk."""

from __future__ import annotations

import math

import pytest
import torch

from nmt_cli.decode.row_topk import BLOCK, MIN_WIDTH_PER_BLOCK_KEPT, row_topk


def check_against_topk(x: torch.Tensor, k: int) -> None:
    """Values exactly topk's; every column distinct and holding the value claimed;
    where a row's values are all distinct, topk's columns too."""
    values, columns = row_topk(x, k)
    expected_values, expected_columns = x.topk(k, dim=1)
    assert torch.equal(values, expected_values)
    assert torch.equal(x.gather(1, columns), values)
    assert all(len(set(row)) == k for row in columns.tolist())
    for r in range(x.size(0)):
        if x[r].unique().numel() == x.size(1):
            assert torch.equal(columns[r], expected_columns[r])


@pytest.mark.parametrize("width, k", [(4096, 8), (4141, 8), (8000, 8), (32000, 8), (2048, 4), (9000, 2)])
def test_values_and_columns_equal_topk(width, k):
    """Whole blocks only (4096) and with a tail of columns (4141 = 64 blocks and 45)."""
    assert width >= MIN_WIDTH_PER_BLOCK_KEPT * k * BLOCK  # the block pass runs
    gen = torch.Generator().manual_seed(width + k)
    x = torch.randn(37, width, generator=gen).log_softmax(dim=1)
    check_against_topk(x, k)


def test_ties_minus_infinity_and_strided_rows():
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-20, 3, (30, 4141), generator=gen).float()  # every value repeated many times
    x[0] = -math.inf
    x[0, 7] = 0.0  # a row forced to one token
    x[1, :-45] = -math.inf  # only the tail is finite
    x[2, 640:704] = 5.0 + torch.arange(64.0)  # the whole top k in one block
    check_against_topk(x, 8)
    beams = torch.randn(6, 4, 4141, generator=gen)
    check_against_topk(beams[:, 0, :], 8)  # beam 0 of each sentence: rows 4 * 4141 apart


def test_narrow_rows_are_topk_itself():
    x = torch.randn(5, MIN_WIDTH_PER_BLOCK_KEPT * 8 * BLOCK - 1)
    values, columns = row_topk(x, 8)
    expected = x.topk(8, dim=1)
    assert torch.equal(values, expected.values) and torch.equal(columns, expected.indices)
