"""Dropout with 16-bit random lanes (nmt_cli/models/fast/dropout.py) against the definition of
dropout: each element independently zeroed with probability p, the rest scaled so the
expectation is unchanged; the gradient through the same mask; F.dropout where it is used."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nmt_cli.models.fast.dropout import LANES, maybe_dropout

N = 1 << 20  # elements per statistical check


def dropped_fraction_bound(p: float, n: int) -> float:
    """Six standard deviations of a binomial fraction."""
    return 6 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drops_each_element_with_probability_p_and_scales_the_rest(p: float) -> None:
    torch.manual_seed(0)
    x = torch.rand(N) + 0.5  # no zeros of its own
    out = maybe_dropout(x, p, True)
    dropped = out == 0
    rounded_p = round(p * LANES) / LANES
    assert abs(dropped.float().mean().item() - rounded_p) < dropped_fraction_bound(p, N)
    kept = ~dropped
    torch.testing.assert_close(out[kept], x[kept] / (1 - rounded_p), rtol=1e-6, atol=0)
    # Each of the four 16-bit lanes of a 64-bit draw drops as often as the others.
    for lane in range(4):
        fraction = dropped[lane::4].float().mean().item()
        assert abs(fraction - rounded_p) < dropped_fraction_bound(p, N // 4)


def test_neighbouring_elements_are_dropped_independently() -> None:
    torch.manual_seed(1)
    p = 0.3
    dropped = maybe_dropout(torch.ones(N), p, True) == 0
    for shift in (1, 2, 3, 4):  # within one 64-bit draw, and across two
        both = (dropped[:-shift] & dropped[shift:]).float().mean().item()
        assert abs(both - p * p) < dropped_fraction_bound(p * p, N)


def test_expectation_is_the_input() -> None:
    torch.manual_seed(2)
    x = torch.ones(N)
    assert maybe_dropout(x, 0.1, True).mean().item() == pytest.approx(1.0, abs=2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient_goes_through_the_same_mask(dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    x = (torch.rand(4, 7, 33) + 0.5).to(dtype).requires_grad_(True)
    out = maybe_dropout(x, 0.25, True)
    assert out.dtype == dtype
    upstream = torch.randn_like(out)
    out.backward(upstream)
    scale = torch.where(out != 0, out / x.detach(), torch.zeros((), dtype=dtype))  # 0 or 1 / (1 - p)
    torch.testing.assert_close(x.grad, upstream * scale)
    assert x.grad.dtype == dtype


def test_same_seed_same_mask() -> None:
    x = torch.ones(5000)
    torch.manual_seed(4)
    first = maybe_dropout(x, 0.1, True)
    torch.manual_seed(4)
    assert torch.equal(first, maybe_dropout(x, 0.1, True))
    assert not torch.equal(first, maybe_dropout(x, 0.1, True))


def test_eval_mode_and_p_zero_return_the_input_itself() -> None:
    x = torch.randn(3, 4)
    assert maybe_dropout(x, 0.1, False) is x
    assert maybe_dropout(x, 0.0, True) is x


def test_p_of_one_and_above_behave_as_f_dropout() -> None:
    x = torch.randn(3, 4)
    assert torch.equal(maybe_dropout(x, 1.0, True), torch.zeros(3, 4))
    with pytest.raises(ValueError):
        maybe_dropout(x, 1.5, True)


def test_tiny_p_rounds_to_keeping_everything_unscaled() -> None:
    x = torch.randn(1000)
    assert torch.equal(maybe_dropout(x, 1e-6, True), x)


def test_under_torch_compile_it_is_f_dropout(monkeypatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = torch.randn(64, 32)
    torch.manual_seed(5)
    ours = maybe_dropout(x, 0.2, True)
    torch.manual_seed(5)
    assert torch.equal(ours, F.dropout(x, 0.2, True))
