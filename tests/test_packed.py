"""Linear layers on oneDNN-packed weights (translate on a CPU, float32 and bf16) against
what they replace: F.linear in float32, autocast in bf16 (which casts float32 weights at
every call and must give the same arithmetic). bf16 needs a CPU with bf16
instructions; where a kernel is missing only the fallback (nothing changes) is checked.
"""

from __future__ import annotations

import copy

import pytest
import torch
from model_utils import EOS, TGT_V, padded_batch, tiny_model
from torch import nn

from nmt_cli.config import DecodeConfig
from nmt_cli.decode.search import generate
from nmt_cli.models.fast.packed import PackedLinear, pack_linears, packed_unavailable_reason

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def needs_kernels(dtype: torch.dtype):
    reason = packed_unavailable_reason(dtype)
    return pytest.param(dtype, marks=pytest.mark.skipif(reason is not None, reason=str(reason)))


BOTH_DTYPES = [needs_kernels(torch.float32), needs_kernels(torch.bfloat16)]


def reference_mode(dtype: torch.dtype):
    """What a packed layer replaces: plain float32, or autocast to bf16."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)


@pytest.mark.parametrize("dtype", BOTH_DTYPES)
@pytest.mark.parametrize("in_features, out_features, bias", [(256, 1024, True), (1024, 256, True), (64, 5000, False)])
def test_packed_linear_equals_what_it_replaces(dtype, in_features, out_features, bias):
    torch.manual_seed(in_features + out_features)
    linear = nn.Linear(in_features, out_features, bias=bias)
    if bias:
        nn.init.normal_(linear.bias)
    packed = PackedLinear(linear, dtype)
    sliced = torch.randn(6, 3, in_features)[:, -1]  # not contiguous, as a decoder's last position
    for x in [torch.randn(1, in_features), torch.randn(37, in_features), torch.randn(128, in_features),
              torch.randn(3, 5, in_features), sliced]:
        with torch.inference_mode(), reference_mode(dtype):
            expected = linear(x)
        got = packed(x)
        assert got.dtype == expected.dtype == dtype and got.shape == expected.shape
        if dtype == torch.float32:  # the same products, summed in another order
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            continue
        # The same rounded inputs and float32 sums; oneDNN's blocked layout may add in
        # another order, which moves a rare result by one bf16 step (2^-8 relative).
        differ = got.ne(expected)
        assert differ.float().mean() < 0.01
        step = expected.float().abs() * 2**-7
        assert bool(((got.float() - expected.float()).abs() <= step)[differ].all())


@pytest.mark.parametrize("dtype", BOTH_DTYPES)
def test_relu_as_the_products_post_op_equals_relu_after_it(dtype):
    torch.manual_seed(7)
    linear = nn.Linear(64, 300)
    nn.init.normal_(linear.bias)
    packed = PackedLinear(linear, dtype)
    x = torch.randn(2, 9, 64)
    got = PackedLinear(linear, dtype, relu=True)(x)
    assert got.dtype == dtype and got.shape == (2, 9, 300)
    assert torch.equal(got, torch.relu(packed(x)))
    assert bool(got.eq(0).any()) and bool(got.gt(0).any())


@pytest.mark.parametrize("dtype", BOTH_DTYPES)
def test_packed_model_decodes_as_the_plain_one_and_keeps_tied_embeddings(dtype):
    model = tiny_model(3, dtype=torch.float32, share_all_embeddings=True, src_v=TGT_V)
    with torch.no_grad():  # biases start at zero; the packed ones must be used too
        for m in model.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.normal_(std=0.5)
    embeddings = model.decoder.embed_tokens.weight.detach().clone()
    packed = copy.deepcopy(model)
    assert pack_linears(packed, dtype)
    assert not any(isinstance(m, nn.Linear) for m in packed.modules())
    assert packed.decoder.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(packed.decoder.embed_tokens.weight, embeddings)
    src = padded_batch(7, [9, 4, 12, 6, 2, 8], TGT_V)
    src[torch.arange(6), torch.tensor([8, 3, 11, 5, 1, 7])] = EOS
    cfg = DecodeConfig(beam=3, nbest=3, max_len_a=1.0, max_len_b=3)
    with torch.inference_mode(), reference_mode(dtype):
        expected = generate(model, src, cfg, max_target_positions=1024)
        got = generate(packed, src, cfg, max_target_positions=1024)
    pairs = [(h, e) for hyps, want in zip(got, expected) for h, e in zip(hyps, want)]
    same = [(h, e) for h, e in pairs if h.tokens == e.tokens]
    if dtype == torch.float32:
        assert len(same) == len(pairs)
        assert all(h.score == pytest.approx(e.score, abs=1e-4) for h, e in same)
    else:
        assert len(same) >= 0.9 * len(pairs)
        assert all(h.score == pytest.approx(e.score, abs=0.02) for h, e in same)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_kernels_nothing_changes(monkeypatch, dtype):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert packed_unavailable_reason(dtype) == "this torch build has no oneDNN"
    model = tiny_model(3, dtype=torch.float32)
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert not pack_linears(model, dtype)
    assert [name for name, m in model.named_modules() if isinstance(m, nn.Linear)] == linears


def test_probing_the_kernels_leaves_the_global_rng_as_it_was():
    """Loading a model for translation must not shift the random numbers a caller draws next."""
    from nmt_cli.models.fast.int8 import int8_unavailable_reason

    torch.manual_seed(5)
    state = torch.get_rng_state()
    packed_unavailable_reason(torch.float32)
    packed_unavailable_reason(torch.bfloat16)
    int8_unavailable_reason()
    assert torch.equal(torch.get_rng_state(), state)
