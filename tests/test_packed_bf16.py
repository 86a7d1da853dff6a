"""bf16 linear layers on oneDNN-packed weights (translate --precision bf16 on a CPU)
against autocast, which casts float32 weights at every call and must give the same
arithmetic. The kernels need a CPU with bf16 instructions; elsewhere only the
fallback (nothing changes) is checked.
"""

from __future__ import annotations

import copy

import pytest
import torch
from model_utils import EOS, TGT_V, padded_batch, tiny_model
from torch import nn

from nmt_cli.config import DecodeConfig
from nmt_cli.decode.search import generate
from nmt_cli.models.packed_bf16 import PackedBf16Linear, pack_linears_bf16, packed_bf16_unavailable_reason

needs_kernels = pytest.mark.skipif(packed_bf16_unavailable_reason() is not None,
                                   reason=f"{packed_bf16_unavailable_reason()}")

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def autocast_bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@needs_kernels
@pytest.mark.parametrize("in_features, out_features, bias", [(256, 1024, True), (1024, 256, True), (64, 5000, False)])
def test_packed_linear_equals_autocast(in_features, out_features, bias):
    torch.manual_seed(in_features + out_features)
    linear = nn.Linear(in_features, out_features, bias=bias)
    if bias:
        nn.init.normal_(linear.bias)
    packed = PackedBf16Linear(linear)
    for shape in [(1, in_features), (37, in_features), (128, in_features), (3, 5, in_features)]:
        x = torch.randn(shape)
        with torch.inference_mode(), autocast_bf16():
            expected = linear(x)
        got = packed(x)
        assert got.dtype == expected.dtype == torch.bfloat16 and got.shape == expected.shape
        # The same rounded inputs and float32 sums; oneDNN's blocked layout may add in
        # another order, which moves a rare result by one bf16 step (2^-8 relative).
        differ = got.ne(expected)
        assert differ.float().mean() < 0.01
        step = expected.float().abs() * 2**-7
        assert bool(((got.float() - expected.float()).abs() <= step)[differ].all())


@needs_kernels
def test_packed_model_decodes_as_autocast_and_keeps_tied_embeddings_float32():
    model = tiny_model(3, dtype=torch.float32, share_all_embeddings=True, src_v=TGT_V)
    with torch.no_grad():  # biases start at zero; the packed ones must be used too
        for m in model.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.normal_(std=0.5)
    embeddings = model.decoder.embed_tokens.weight.detach().clone()
    packed = copy.deepcopy(model)
    assert pack_linears_bf16(packed)
    assert not any(isinstance(m, nn.Linear) for m in packed.modules())
    assert packed.decoder.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(packed.decoder.embed_tokens.weight, embeddings)
    src = padded_batch(7, [9, 4, 12, 6, 2, 8], TGT_V)
    src[torch.arange(6), torch.tensor([8, 3, 11, 5, 1, 7])] = EOS
    cfg = DecodeConfig(beam=3, nbest=3, max_len_a=1.0, max_len_b=3)
    with torch.inference_mode(), autocast_bf16():
        expected = generate(model, src, cfg, max_target_positions=1024)
        got = generate(packed, src, cfg, max_target_positions=1024)
    pairs = [(h, e) for hyps, want in zip(got, expected) for h, e in zip(hyps, want)]
    same = [(h, e) for h, e in pairs if h.tokens == e.tokens]
    assert len(same) >= 0.9 * len(pairs)
    assert all(h.score == pytest.approx(e.score, abs=0.02) for h, e in same)


def test_without_kernels_nothing_changes(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert packed_bf16_unavailable_reason() == "this torch build has no oneDNN"
    model = tiny_model(3, dtype=torch.float32)
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert not pack_linears_bf16(model)
    assert [name for name, m in model.named_modules() if isinstance(m, nn.Linear)] == linears
