"""The Transformer against independent truth: torch's own modules, naive formulas, invariants.

Small random models in float64, dropout off (`eval()`), on the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from model_utils import EOS, PAD, SRC_V, TGT_V, count_parameters, padded_batch, source_batch, tiny_model
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from nmt_cli.cli import main
from nmt_cli.commands.model_options import model_options, overrides_from
from nmt_cli.config import DecodeConfig, ModelConfig
from nmt_cli.decode.search import generate
from nmt_cli.errors import NmtError
from nmt_cli.models import layers as layers_module
from nmt_cli.models import registry as registry_module
from nmt_cli.models import size as size_module
from nmt_cli.models.decoding_state import DecoderCache, RowMajorKV
from nmt_cli.models.fast.beam_slots import BeamSlotKV
from nmt_cli.models.fast.logits import vocabulary_logits
from nmt_cli.models.fast.options import DecodingOptions
from nmt_cli.models.layers import CrossAttention, DecoderLayer, EncoderLayer, SelfAttention, make_positions
from nmt_cli.models.layers import few_query_attention, sinusoidal_table
from nmt_cli.models.registry import ARCHITECTURES, build_model, resolve_config
from nmt_cli.models.size import parameter_counts, training_matmul_flops

SRC = padded_batch(1, [7, 4, 5, 1], SRC_V)
PREV = padded_batch(2, [6, 6, 3, 5], TGT_V, bos=EOS)
VARIANTS = [
    pytest.param({}, id="post-norm"),
    pytest.param({"normalize_before": True}, id="pre-norm"),
    pytest.param({"share_decoder_input_output_embed": True}, id="share-dec-io"),
    pytest.param({"share_all_embeddings": True, "normalize_before": True}, id="share-all-pre-norm"),
    pytest.param({"learned_pos": True, "scale_embedding": False}, id="learned-pos"),
    pytest.param({"encoder_embed_dim": 16, "encoder_ffn_embed_dim": 24}, id="narrower-encoder"),
]


def vocab_sizes(overrides: dict) -> tuple[int, int]:
    return (TGT_V, TGT_V) if overrides.get("share_all_embeddings") else (SRC_V, TGT_V)


def non_pad_close(a: torch.Tensor, b: torch.Tensor, tokens: torch.Tensor, atol: float) -> None:
    mask = tokens.ne(PAD)
    torch.testing.assert_close(a[mask], b[mask], atol=atol, rtol=0)


# ---- incremental decoding == teacher forcing ----


@pytest.mark.parametrize("overrides", VARIANTS)
def test_decode_step_matches_teacher_forcing(overrides: dict) -> None:
    model = tiny_model(3, *vocab_sizes(overrides), **overrides)
    expected = torch.log_softmax(model(SRC, PREV), dim=-1)  # (B, T, V)
    encoder_out, cache = model.encode(SRC), model.new_cache()
    steps = [model.decode_step(PREV[:, : t + 1], encoder_out, cache) for t in range(PREV.size(1))]
    got = torch.stack(steps, dim=1)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    non_pad_close(got.double(), expected, PREV, atol=1e-5)


def test_decode_step_with_forced_prefix_and_multi_token_steps() -> None:
    # A tiny first capacity makes the cache grow (by doubling) several times.
    model = tiny_model(4, decoding=DecodingOptions(initial_capacity=2))
    prev = padded_batch(5, [9, 9, 9, 9], TGT_V, bos=EOS)
    expected = torch.log_softmax(model(SRC, prev), dim=-1)
    encoder_out, cache = model.encode(SRC), model.new_cache()
    got = {}
    for end in (3, 4, 7, 9):  # a 3-token prefix, then 1, 3 and 2 tokens at once
        got[end - 1] = model.decode_step(prev[:, :end], encoder_out, cache)
    for t, log_probs in got.items():
        torch.testing.assert_close(log_probs.double(), expected[:, t], atol=1e-5, rtol=0)


def test_reorder_cache_matches_decoding_reordered_batch() -> None:
    model = tiny_model(6, normalize_before=True)
    src, prev = SRC, padded_batch(7, [6, 6, 6, 6], TGT_V, bos=EOS)
    encoder_out, cache = model.encode(src), model.new_cache()
    for t in range(3):
        model.decode_step(prev[:, : t + 1], encoder_out, cache)
    index = torch.tensor([2, 0, 0, 3, 1])  # reorder, duplicate (as beams do) and grow
    encoder_out = model.reorder_encoder_out(encoder_out, index)
    model.reorder_cache(cache, index, sentence_index=index)  # one row per sentence
    prev = prev[index]
    got = [model.decode_step(prev[:, : t + 1], encoder_out, cache) for t in range(3, 6)]

    fresh_out, fresh_cache = model.encode(src[index]), model.new_cache()
    want = [model.decode_step(prev[:, : t + 1], fresh_out, fresh_cache) for t in range(6)][3:]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    torch.testing.assert_close(encoder_out.out, fresh_out.out)
    assert torch.equal(encoder_out.padding_mask, fresh_out.padding_mask)


def test_beams_sharing_their_sentence_equal_one_row_per_sentence() -> None:
    """K target rows per sentence attend to that sentence's encoder states, stored once;
    that equals giving every row its own copy of the sentence, through reorders within
    sentences and a sentence leaving the batch."""
    model = tiny_model(9)
    beams = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])  # two beams per source sentence
    prev = padded_batch(12, [5, 5, 5, 5, 5, 5, 5, 5], TGT_V, bos=EOS)
    shared_out, shared = model.encode(SRC), model.new_cache()
    copied_out, copied = model.encode(SRC[beams]), model.new_cache()
    steps = {2: ([1, 1, 2, 3, 5, 4, 7, 7], None), 3: ([0, 1, 4, 4, 7, 6], [0, 2, 3])}
    for t in range(prev.size(1)):
        if t in steps:
            index, sentences = (None if x is None else torch.tensor(x) for x in steps[t])
            model.reorder_cache(shared, index, sentence_index=sentences)
            model.reorder_cache(copied, index, sentence_index=index)
            copied_out = model.reorder_encoder_out(copied_out, index)
            if sentences is not None:
                shared_out = model.reorder_encoder_out(shared_out, sentences)
            prev = prev[index]
        got = model.decode_step(prev[:, : t + 1], shared_out, shared)
        want = model.decode_step(prev[:, : t + 1], copied_out, copied)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert shared.cross.kv.size(2) == 3 and copied.cross.kv.size(2) == 6  # stored per sentence


def test_beam_cache_equals_the_row_cache() -> None:
    """A CPU's float32 cache, which reordering leaves in place (BeamSlotKV), gives the
    row-major cache's log-probs: a forced prefix, beams reordered and duplicated within
    their sentences, a sentence leaving, the capacity doubling."""
    model = tiny_model(13)
    K = 3
    prev = padded_batch(14, [9] * (4 * K), TGT_V, bos=EOS)
    steps = {4: ([2, 2, 0, 3, 5, 4, 8, 6, 7, 11, 11, 9], None), 6: ([1, 0, 0, 9, 11, 10, 5, 3, 4], [0, 3, 1]),
             8: ([2, 1, 0, 3, 3, 3, 6, 8, 7], None)}
    caches, outs = {}, {}
    for beam_layout in (True, False):
        model.decoding = DecodingOptions(initial_capacity=2, beam_slot_cache=beam_layout)
        caches[beam_layout] = model.new_cache()
        outs[beam_layout] = decode_with_reorders(model, prev, 3, steps, caches[beam_layout])  # a 3-token prefix
    assert isinstance(caches[True].self_attn, BeamSlotKV) and isinstance(caches[False].self_attn, RowMajorKV)
    for (_, a), (_, b) in zip(outs[True].values(), outs[False].values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def decode_with_reorders(model: nn.Module, prev: torch.Tensor, prefix: int, steps: dict, cache: DecoderCache) -> dict:
    """Decode prev (rows of SRC's sentences, K each) from a `prefix`-token first step on,
    reordering before step t as steps[t] = (row index, kept sentences or None) says.
    -> {t: (rows of prev that the step's rows continue, log-probs)}."""
    encoder_out, rows = model.encode(SRC), torch.arange(prev.size(0))
    got = {prefix - 1: (rows, model.decode_step(prev[:, :prefix], encoder_out, cache))}
    for t in range(prefix, prev.size(1)):
        if t in steps:
            index, kept = (None if x is None else torch.tensor(x) for x in steps[t])
            model.reorder_cache(cache, index, sentence_index=kept)
            if kept is not None:
                encoder_out = model.reorder_encoder_out(encoder_out, kept)
            rows = rows[index]
        got[t] = rows, model.decode_step(prev[rows, : t + 1], encoder_out, cache)
    return got


def count_decoded_rows(monkeypatch: pytest.MonkeyPatch, model: nn.Module) -> list[int]:
    """The number of rows of each call of the model's decoder on cached steps, as they come."""
    rows: list[int] = []
    forward_cached = model.decoder.forward_cached
    monkeypatch.setattr(model.decoder, "forward_cached",
                        lambda x, *rest: rows.append(x.size(0)) or forward_cached(x, *rest))
    return rows


@pytest.mark.parametrize("beam_layout", [True, False], ids=["beam-cache", "row-cache"])
@pytest.mark.parametrize("prefix", [1, 3])
def test_a_first_step_whose_beams_agree_runs_once_per_sentence(monkeypatch: pytest.MonkeyPatch, beam_layout: bool,
                                                                prefix: int) -> None:
    """When the K rows of every sentence start alike (as beams do), the first step runs
    one row per sentence and copies it: the log-probs are still teacher forcing's,
    through beams that then part, are reordered and leave."""
    model = tiny_model(15, decoding=DecodingOptions(initial_capacity=2, beam_slot_cache=beam_layout))
    K = 3
    first = padded_batch(16, [prefix] * 4, TGT_V, bos=EOS).repeat_interleave(K, dim=0)  # (4K, prefix)
    prev = torch.cat([first, padded_batch(17, [5] * (4 * K), TGT_V)], dim=1)  # rows part after the prefix
    sentences = torch.arange(4).repeat_interleave(K)
    decoded_rows = count_decoded_rows(monkeypatch, model)
    steps = {prefix + 1: ([2, 2, 0, 3, 5, 4, 8, 6, 7, 11, 11, 9], None), prefix + 3: ([1, 0, 0, 9, 11, 10], [0, 3])}
    cache = model.new_cache()
    got = decode_with_reorders(model, prev, prefix, steps, cache)
    assert decoded_rows[0] == 4 and decoded_rows[1] == 4 * K  # one row per sentence, then every row
    assert isinstance(cache.self_attn, BeamSlotKV) == beam_layout

    for t, (rows, log_probs) in got.items():  # each row of a step continues the history of prev[rows]
        want = torch.log_softmax(model(SRC[sentences[rows]], prev[rows, : t + 1]), dim=-1)[:, t]
        torch.testing.assert_close(log_probs.double(), want, atol=1e-5, rtol=0)


def test_rows_that_differ_within_a_sentence_are_all_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(18)
    prev = torch.full((8, 1), EOS)
    prev[5, 0] = 7  # one row of the third sentence differs
    decoded_rows = count_decoded_rows(monkeypatch, model)
    got = model.decode_step(prev, model.encode(SRC), model.new_cache())
    assert decoded_rows == [8]
    want = torch.log_softmax(model(SRC.repeat_interleave(2, dim=0), prev), dim=-1)[:, 0]
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


def test_done_sentences_on_a_cpu_leave_in_groups_with_the_hypotheses_of_leaving_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU model has the search keep done sentences, masked, until a quarter of the
    batch is done (each departure copies the whole cache): fewer, larger departures,
    the same hypotheses."""
    model = tiny_model(15)
    assert model.sentence_drop_fraction == DecodingOptions().sentence_drop_fraction == 0.25
    lengths = list(range(2, 14))  # each sentence may run to its own length
    src = source_batch(lengths, SRC_V, seed=16)
    cfg = DecodeConfig(beam=3, nbest=3, max_len_a=1.0, max_len_b=0)
    rows_per_step: list[int] = []
    real_step = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda prev, *rest: rows_per_step.append(prev.size(0)) or real_step(prev, *rest))
    got, rows = {}, {}
    for fraction in (0.25, 0.0):
        model.decoding = DecodingOptions(sentence_drop_fraction=fraction)
        rows_per_step.clear()
        got[fraction] = generate(model, src, cfg, max_target_positions=1024)
        rows[fraction] = list(rows_per_step)
    assert [[h.tokens for h in s] for s in got[0.25]] == [[h.tokens for h in s] for s in got[0.0]]
    assert [h.score for s in got[0.25] for h in s] == pytest.approx([h.score for s in got[0.0] for h in s], abs=1e-9)
    departures = {f: [(a, b) for a, b in zip(r, r[1:]) if b < a] for f, r in rows.items()}
    assert 0 < len(departures[0.25]) < len(departures[0.0])
    assert all(before - after >= before / 4 for before, after in departures[0.25])


def test_decode_step_needs_the_same_number_of_rows_per_sentence() -> None:
    model = tiny_model(9)
    with pytest.raises(ValueError, match="5 target rows for 4 sentences"):
        model.decode_step(PREV[[0, 1, 2, 3, 3], :1], model.encode(SRC), model.new_cache())
    with pytest.raises(ValueError, match="9 target rows for 4 sentences"):  # rows alike, but not K each
        model.decode_step(torch.full((9, 1), EOS), model.encode(SRC), model.new_cache())


@pytest.mark.parametrize("keys_transposed", [False, True])
@pytest.mark.parametrize("queries", [1, 4])
def test_few_query_attention_matches_torch(queries: int, keys_transposed: bool) -> None:
    torch.manual_seed(15)
    B, H, S, Dh = 3, 2, 7, 8
    q = torch.randn(B, H, queries, Dh, dtype=torch.float64)
    k, v = torch.randn(2, B, H, S, Dh, dtype=torch.float64)
    if keys_transposed:  # as the decoding cache's cross-attention keys on a CPU
        k = k.transpose(-1, -2).contiguous().transpose(-1, -2)
        assert k.stride(-2) == 1
    mask = torch.zeros(B, 1, 1, S, dtype=torch.float64)
    mask[0, ..., 4:] = float("-inf")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(few_query_attention(q, k, v, mask), want)
    torch.testing.assert_close(few_query_attention(q, k, v, None), F.scaled_dot_product_attention(q, k, v))


def test_sequence_attention_takes_the_math_kernel_only_for_low_precision_gradients_on_a_cpu() -> None:
    torch.manual_seed(16)
    q, k, v, grad = torch.randn(4, 3, 2, 9, 16)
    mask = torch.rand(3, 1, 1, 9) > 0.3

    def run(dtype: torch.dtype, kernel=None, requires_grad: bool = True):
        inputs = [t.to(dtype).requires_grad_(requires_grad) for t in (q, k, v)]
        with sdpa_kernel(kernel) if kernel is not None else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(*inputs, attn_mask=mask) if kernel is not None else \
                layers_module.sequence_attention(*inputs, mask, 0.0, False)
        if not requires_grad:
            return [out]
        out.backward(grad.to(dtype))
        return [out] + [t.grad for t in inputs]

    def same(a: list, b: list) -> bool:
        return all(torch.equal(x, y) for x, y in zip(a, b))

    math, flash = SDPBackend.MATH, SDPBackend.FLASH_ATTENTION
    assert not same(run(torch.bfloat16, math), run(torch.bfloat16, flash))  # the kernels can be told apart
    assert same(run(torch.bfloat16), run(torch.bfloat16, math))
    assert same(run(torch.bfloat16, requires_grad=False), run(torch.bfloat16, flash, requires_grad=False))
    assert same(run(torch.float32), run(torch.float32, flash))


def test_reorder_cache_can_drop_rows() -> None:
    model = tiny_model(8)
    encoder_out, cache = model.encode(SRC), model.new_cache()
    model.decode_step(PREV[:, :1], encoder_out, cache)
    keep = torch.tensor([3, 1])
    model.reorder_cache(cache, keep, sentence_index=keep)
    got = model.decode_step(PREV[keep, :2], model.reorder_encoder_out(encoder_out, keep), cache)
    want = torch.log_softmax(model(SRC[keep], PREV[keep, :2]), dim=-1)[:, 1]
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


def test_repeated_reorders_follow_the_composed_reordering() -> None:
    """Reorders at many steps (the cache swaps buffers each time), with rows dropped and
    duplicated and the cache growing in between, equal teacher forcing on the rows kept."""
    model = tiny_model(10, decoding=DecodingOptions(initial_capacity=2))
    prev = padded_batch(11, [8, 8, 8, 8], TGT_V, bos=EOS)
    reorders = {1: [1, 0, 3, 2], 2: [0, 0, 2, 3], 3: [3, 1], 5: [1, 0], 6: [0, 0, 1]}
    rows = torch.arange(SRC.size(0))
    encoder_out, cache = model.encode(SRC), model.new_cache()
    for t in range(prev.size(1)):
        if t in reorders:
            index = torch.tensor(reorders[t])
            model.reorder_cache(cache, index, sentence_index=index)
            encoder_out = model.reorder_encoder_out(encoder_out, index)
            rows = rows[index]
        got = model.decode_step(prev[rows, : t + 1], encoder_out, cache)
        want = torch.log_softmax(model(SRC[rows], prev[rows, : t + 1]), dim=-1)[:, t]
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


# ---- invariances ----


def test_encoder_and_decoder_ignore_padding() -> None:
    model = tiny_model(9)
    alone_src, alone_prev = SRC[1:2, :4], PREV[1:2]  # sentence 1 has 4 source tokens
    batch_enc = model.encode(SRC)
    alone_enc = model.encode(alone_src)
    torch.testing.assert_close(batch_enc.out[1:2, :4], alone_enc.out, atol=1e-10, rtol=0)
    extra_pads = torch.cat([SRC, torch.full((4, 5), PAD)], dim=1)
    torch.testing.assert_close(model(extra_pads, PREV), model(SRC, PREV), atol=1e-10, rtol=0)
    torch.testing.assert_close(model(SRC, PREV)[1:2], model(alone_src, alone_prev), atol=1e-10, rtol=0)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_unpadded_source_runs_without_masks_and_gives_the_same_result(overrides: dict,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(13, *vocab_sizes(overrides), **overrides)
    src = padded_batch(14, [6, 6, 6, 6], vocab_sizes(overrides)[0])
    expected = model(src, PREV)
    expected.sum().backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    masks = []
    attention = F.scaled_dot_product_attention

    def recording_attention(*args, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return attention(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(layers_module.F, "scaled_dot_product_attention", recording_attention)
    unmasked = model(src, PREV, src_padded=False)
    assert len(masks) == model.cfg.encoder_layers + 2 * model.cfg.decoder_layers and all(m is None for m in masks)
    torch.testing.assert_close(unmasked, expected, atol=1e-12, rtol=0)
    unmasked.sum().backward()
    for param, grad in zip(model.parameters(), expected_grads):
        torch.testing.assert_close(param.grad, grad, atol=1e-12, rtol=0)


def test_decoder_is_causal() -> None:
    model = tiny_model(10)
    prev = padded_batch(11, [8, 8], TGT_V, bos=EOS)
    src = SRC[:2]
    base = model(src, prev)
    for t in range(1, 7):
        changed = prev.clone()
        changed[:, t + 1] = (changed[:, t + 1] - 3) % (TGT_V - 4) + 4
        out = model(src, changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-12, rtol=0)
        assert not torch.allclose(out[:, t + 1], base[:, t + 1])


def test_train_mode_uses_dropout_and_all_parameters_get_gradients() -> None:
    torch.manual_seed(0)
    model = build_model(ARCHITECTURES["transformer_tiny"], SRC_V, TGT_V)
    model.train()
    logits = model(SRC, PREV)
    assert not torch.equal(logits, model(SRC, PREV))  # dropout is active
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    assert torch.equal(model(SRC, PREV), model(SRC, PREV))


def test_features_and_output_projection_give_the_logits() -> None:
    model = tiny_model(12)
    hidden = model(SRC, PREV, features_only=True)
    assert hidden.shape == (4, PREV.size(1), 32)
    torch.testing.assert_close(model.output_projection(hidden), model(SRC, PREV))
    assert model.pad_idx == PAD


# ---- against torch's own modules ----


def test_self_and_cross_attention_match_torch_multihead_attention() -> None:
    torch.manual_seed(13)
    D, H = 16, 4
    x = torch.randn(3, 5, D, dtype=torch.float64)
    memory = torch.randn(3, 6, D, dtype=torch.float64)
    key_pad = torch.zeros(3, 6, dtype=torch.bool)
    key_pad[1, 4:] = True
    key_pad[2, 1:] = True
    mha = nn.MultiheadAttention(D, H, batch_first=True).double().eval()

    ours = SelfAttention(D, H, 0.0).double().eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(ours.in_proj.weight)
        mha.in_proj_bias.copy_(ours.in_proj.bias)
        mha.out_proj.weight.copy_(ours.out_proj.weight)
        mha.out_proj.bias.copy_(ours.out_proj.bias)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True = masked, torch's convention
    want, _ = mha(x, x, x, attn_mask=causal, need_weights=False)
    torch.testing.assert_close(ours(x, None, True), want)
    want, _ = mha(memory, memory, memory, key_padding_mask=key_pad, need_weights=False)
    torch.testing.assert_close(ours(memory, ~key_pad[:, None, None, :], False), want)

    cross = CrossAttention(D, H, 0.0, D).double().eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([cross.q_proj.weight, cross.kv_proj.weight]))
        mha.in_proj_bias.copy_(torch.cat([cross.q_proj.bias, cross.kv_proj.bias]))
        mha.out_proj.weight.copy_(cross.out_proj.weight)
        mha.out_proj.bias.copy_(cross.out_proj.bias)
    want, _ = mha(x, memory, memory, key_padding_mask=key_pad, need_weights=False)
    got = cross(x, cross.project_kv(memory), ~key_pad[:, None, None, :])
    torch.testing.assert_close(got, want)


def copy_into_torch_layer(ours: nn.Module, theirs: nn.Module, decoder: bool) -> None:
    pairs = [
        (theirs.self_attn.in_proj_weight, ours.self_attn.in_proj.weight),
        (theirs.self_attn.in_proj_bias, ours.self_attn.in_proj.bias),
        (theirs.self_attn.out_proj.weight, ours.self_attn.out_proj.weight),
        (theirs.self_attn.out_proj.bias, ours.self_attn.out_proj.bias),
        (theirs.linear1.weight, ours.fc1.weight), (theirs.linear1.bias, ours.fc1.bias),
        (theirs.linear2.weight, ours.fc2.weight), (theirs.linear2.bias, ours.fc2.bias),
        (theirs.norm1.weight, ours.self_attn_layer_norm.weight), (theirs.norm1.bias, ours.self_attn_layer_norm.bias),
    ]
    if decoder:
        cross = ours.encoder_attn
        pairs += [
            (theirs.multihead_attn.in_proj_weight, torch.cat([cross.q_proj.weight, cross.kv_proj.weight])),
            (theirs.multihead_attn.in_proj_bias, torch.cat([cross.q_proj.bias, cross.kv_proj.bias])),
            (theirs.multihead_attn.out_proj.weight, cross.out_proj.weight),
            (theirs.multihead_attn.out_proj.bias, cross.out_proj.bias),
            (theirs.norm2.weight, ours.encoder_attn_layer_norm.weight),
            (theirs.norm2.bias, ours.encoder_attn_layer_norm.bias),
            (theirs.norm3.weight, ours.final_layer_norm.weight), (theirs.norm3.bias, ours.final_layer_norm.bias),
        ]
    else:
        pairs += [(theirs.norm2.weight, ours.final_layer_norm.weight), (theirs.norm2.bias, ours.final_layer_norm.bias)]
    with torch.no_grad():
        for target, source in pairs:
            target.copy_(source)
        for norm in [m for m in ours.modules() if isinstance(m, nn.LayerNorm)]:
            norm.weight.uniform_(0.5, 1.5)  # non-trivial LayerNorm parameters, copied again below
            norm.bias.uniform_(-0.5, 0.5)
        middle = [ours.encoder_attn_layer_norm] if decoder else []
        norms = [ours.self_attn_layer_norm, *middle, ours.final_layer_norm]
        for i, norm in enumerate(norms, start=1):
            getattr(theirs, f"norm{i}").weight.copy_(norm.weight)
            getattr(theirs, f"norm{i}").bias.copy_(norm.bias)


@pytest.mark.parametrize("norm_first", [False, True])
def test_layers_match_torch_transformer_layers(norm_first: bool) -> None:
    torch.manual_seed(14)
    D, F, H = 16, 24, 4
    x = torch.randn(3, 6, D, dtype=torch.float64)
    y = torch.randn(3, 5, D, dtype=torch.float64)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[0, 3:] = True
    allowed = ~pad[:, None, None, :]

    ours_enc = EncoderLayer(D, F, H, 0.0, 0.0, 0.0, norm_first, "relu").double().eval()
    theirs_enc = nn.TransformerEncoderLayer(D, H, F, dropout=0.0, batch_first=True, norm_first=norm_first)
    theirs_enc = theirs_enc.double().eval()
    copy_into_torch_layer(ours_enc, theirs_enc, decoder=False)
    with torch.no_grad():
        want = theirs_enc(x, src_key_padding_mask=pad)
        non_pad_close(ours_enc(x, allowed), want, torch.where(pad, PAD, 5), atol=1e-10)

    ours_dec = DecoderLayer(D, F, H, 0.0, 0.0, 0.0, norm_first, D, "relu").double().eval()
    theirs_dec = nn.TransformerDecoderLayer(D, H, F, dropout=0.0, batch_first=True, norm_first=norm_first)
    theirs_dec = theirs_dec.double().eval()
    copy_into_torch_layer(ours_dec, theirs_dec, decoder=True)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    with torch.no_grad():
        want = theirs_dec(y, x, tgt_mask=causal, memory_key_padding_mask=pad)
        got = ours_dec(y, ours_dec.encoder_attn.project_kv(x), allowed)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


# ---- positions and embeddings ----


def naive_fairseq_sinusoids(num_positions: int, dim: int, padding_idx: int) -> list[list[float]]:
    half = dim // 2
    rows = []
    for pos in range(num_positions):
        freqs = [math.exp(-math.log(10000) * i / (half - 1)) for i in range(half)]
        row = [math.sin(pos * f) for f in freqs] + [math.cos(pos * f) for f in freqs] + [0.0] * (dim % 2)
        rows.append([0.0] * dim if pos == padding_idx else row)
    return rows


@pytest.mark.parametrize("dim", [8, 9, 32])
def test_sinusoids_match_naive_fairseq_formula(dim: int) -> None:
    want = torch.tensor(naive_fairseq_sinusoids(300, dim, PAD), dtype=torch.float32)
    # float32 angles up to ~300 rad carry ~1e-5 absolute error, as in fairseq.
    torch.testing.assert_close(sinusoidal_table(300, dim, PAD), want, atol=1e-4, rtol=0)


def test_positions_count_non_pad_tokens_from_two() -> None:
    tokens = torch.tensor([[5, 6, 7, 2], [5, 2, PAD, PAD]])
    assert make_positions(tokens, PAD).tolist() == [[2, 3, 4, 5], [2, 3, PAD, PAD]]


def test_encoder_input_is_scaled_embedding_plus_sinusoid() -> None:
    model = tiny_model(15)
    with torch.no_grad():
        model.encoder.embed_tokens.weight[PAD] = 1.0  # even so, pads enter the layers as zeros (fairseq)
    captured = {}
    hook = model.encoder.layers[0].register_forward_pre_hook(lambda m, args: captured.update(x=args[0]))
    model.encoder(SRC)  # padded layout (decoding's `encode` may hand the layers token rows)
    hook.remove()
    table = torch.tensor(naive_fairseq_sinusoids(20, 32, PAD), dtype=torch.float64)
    emb = model.encoder.embed_tokens.weight
    for b in range(SRC.size(0)):
        for s in range(SRC.size(1)):
            token = int(SRC[b, s])
            want = torch.zeros(32, dtype=torch.float64) if token == PAD else math.sqrt(32) * emb[token] + table[s + 2]
            torch.testing.assert_close(captured["x"][b, s], want, atol=1e-5, rtol=0)


def test_embedding_init_and_sharing() -> None:
    model = build_model(resolve_config("transformer_small", {"share_all_embeddings": True}), 4000, 4000)
    weight = model.encoder.embed_tokens.weight
    assert weight is model.decoder.embed_tokens.weight is model.decoder.output_projection.weight
    assert torch.count_nonzero(weight[PAD]) == 0
    assert abs(weight.std().item() - 256**-0.5) < 0.02 * 256**-0.5  # fairseq: normal(0, d^-0.5)
    unshared = build_model(ARCHITECTURES["transformer_tiny"], 30, 40)
    assert unshared.encoder.embed_tokens.weight is not unshared.decoder.embed_tokens.weight
    assert unshared.decoder.output_projection.weight is not unshared.decoder.embed_tokens.weight
    tied = build_model(resolve_config("transformer_tiny", {"share_decoder_input_output_embed": True}), 30, 40)
    assert tied.decoder.output_projection.weight is tied.decoder.embed_tokens.weight


def test_share_all_embeddings_needs_equal_vocabularies() -> None:
    with pytest.raises(NmtError, match="joined dictionary"):
        build_model(resolve_config("transformer_tiny", {"share_all_embeddings": True}), 30, 40)


def test_learned_positions_refuse_too_long_input() -> None:
    model = tiny_model(16, learned_pos=True, max_source_positions=4)
    model.encode(SRC[:, :4])
    with pytest.raises(NmtError, match="exceeds"):
        model.encode(SRC)


def test_sinusoids_extend_beyond_max_positions() -> None:
    model = tiny_model(17, max_source_positions=4, max_target_positions=4)
    long_src = padded_batch(18, [12, 9], SRC_V)
    long_prev = padded_batch(19, [11, 11], TGT_V, bos=EOS)
    expected = torch.log_softmax(model(long_src, long_prev), dim=-1)
    encoder_out, cache = model.encode(long_src), model.new_cache()
    for t in range(11):
        got = model.decode_step(long_prev[:, : t + 1], encoder_out, cache)
        torch.testing.assert_close(got.double(), expected[:, t], atol=1e-5, rtol=0)


# ---- registry and parameter counts ----


def paper_parameter_count(d: int, d_ff: int, layers: int, vocab: int) -> int:
    """Closed form for the paper's architecture with one shared embedding matrix."""
    attention = 4 * (d * d + d)  # q, k, v, output projections with biases
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return vocab * d + layers * (encoder_layer + decoder_layer)


@pytest.mark.parametrize(
    "arch, d, d_ff, vocab, paper_millions",
    [
        ("transformer_base", 512, 2048, 32000, 65), ("transformer_base", 512, 2048, 37000, 65),
        ("transformer_big", 1024, 4096, 32000, 213), ("transformer_big", 1024, 4096, 37000, 213),
    ],
)
def test_parameter_counts_match_closed_form(arch: str, d: int, d_ff: int, vocab: int, paper_millions: int) -> None:
    cfg = resolve_config(arch, {"share_all_embeddings": True})
    with torch.device("meta"):
        model = build_model(cfg, vocab, vocab)
    count = count_parameters(model)
    assert count == paper_parameter_count(d, d_ff, 6, vocab)
    assert abs(count / 1e6 - paper_millions) / paper_millions < 0.08


def built_parameter_counts(model: nn.Module) -> dict[str, int]:
    """Distinct parameters by part, from a built model's names (as `nmt info` reported them
    when it built models): embeddings (tokens, output, learned positions), encoder, decoder."""
    parts = {"embeddings": 0, "encoder": 0, "decoder": 0}
    seen: set[int] = set()
    for name, param in model.named_parameters():  # a shared parameter is listed once
        if id(param) not in seen:
            seen.add(id(param))
            if "embed_tokens" in name or "embed_positions" in name or "output_projection" in name:
                parts["embeddings"] += param.numel()
            else:
                parts["encoder" if name.startswith("encoder.") else "decoder"] += param.numel()
    parts["total"] = count_parameters(model)
    return parts


COUNT_VARIANTS = [
    pytest.param({}, id="preset"),
    pytest.param({"share_all_embeddings": True}, id="share-all"),
    pytest.param({"share_decoder_input_output_embed": True}, id="share-dec-io"),
    pytest.param({"normalize_before": True}, id="pre-norm"),
    pytest.param({"learned_pos": True, "max_source_positions": 7, "max_target_positions": 9}, id="learned-pos"),
    pytest.param({"encoder_embed_dim": 64, "encoder_attention_heads": 4, "encoder_ffn_embed_dim": 96,
                  "encoder_layers": 1, "decoder_layers": 3}, id="other-encoder-sizes"),
    pytest.param({"encoder_embed_dim": 64, "encoder_attention_heads": 4, "learned_pos": True,
                  "share_decoder_input_output_embed": True, "normalize_before": True}, id="mixed"),
]


@pytest.mark.parametrize("overrides", COUNT_VARIANTS)
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_parameter_counts_from_the_config_match_the_built_model(arch: str, overrides: dict) -> None:
    cfg = resolve_config(arch, overrides)
    src_vocab, tgt_vocab = (40, 40) if cfg.share_all_embeddings else (30, 40)
    with torch.device("meta"):
        model = build_model(cfg, src_vocab, tgt_vocab)
    assert parameter_counts(cfg, src_vocab, tgt_vocab) == built_parameter_counts(model)


def test_parameter_counts_check_vocabulary_sizes_as_the_model_does() -> None:
    with pytest.raises(NmtError, match="joined dictionary"):
        parameter_counts(resolve_config("transformer_tiny", {"share_all_embeddings": True}), 30, 40)
    with pytest.raises(NmtError, match="target vocabulary of 1 symbols is too small"):
        parameter_counts(ARCHITECTURES["transformer_tiny"], 30, 1)


def test_a_model_too_big_for_memory_is_refused_before_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args):
        raise AssertionError("a refused model was built")

    monkeypatch.setattr(size_module, "physical_memory_bytes", lambda: 100 * 10**6)
    monkeypatch.setattr(registry_module, "Transformer", never)
    cfg = ARCHITECTURES["transformer_big"]
    parameters = parameter_counts(cfg, 37000, 37000)["total"]
    with pytest.raises(NmtError) as refused:
        build_model(cfg, 37000, 37000)
    assert str(refused.value) == (f"this model has {parameters:,} parameters: its float32 weights alone need "
                                  f"{4 * parameters / 1e9:,.1f} GB, more than this machine's 0.1 GB of memory")
    # Small weights, but sinusoids for 10^8 positions.
    with pytest.raises(NmtError, match=r"needs at least 12\.8 GB, more than .* for its sinusoidal position tables "
                                       r"\(--max-source-positions 100000000, "):
        build_model(resolve_config("transformer_tiny", {"max_source_positions": 10**8}), 30, 40)
    # Small weights (0.4 GB), but 10^6 layers, whose Python and torch objects take at least 10 GB.
    monkeypatch.setattr(size_module, "physical_memory_bytes", lambda: 5 * 10**9)
    narrow = {"encoder_layers": 10**6, "encoder_embed_dim": 4, "encoder_attention_heads": 1, "encoder_ffn_embed_dim": 1}
    with pytest.raises(NmtError, match=r"GB for the torch modules of its 1,000,002 layers$"):
        build_model(resolve_config("transformer_tiny", narrow), 30, 40)


def test_without_the_memory_size_only_sizes_torch_cannot_compute_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(size_module, "physical_memory_bytes", lambda: None)
    with pytest.raises(NmtError, match="more than the 2\\^63 bytes that torch can address"):
        build_model(resolve_config("transformer_tiny", {"encoder_embed_dim": 99999999999998}), 30, 40)
    assert count_parameters(build_model(ARCHITECTURES["transformer_tiny"], 30, 40)) > 0


def test_presets_and_resolve_config() -> None:
    assert set(ARCHITECTURES) >= {"transformer_base", "transformer_big", "transformer_iwslt_de_en",
                                  "transformer_small", "transformer_tiny"}
    big = ARCHITECTURES["transformer_big"]
    assert (big.encoder_embed_dim, big.encoder_ffn_embed_dim, big.encoder_attention_heads, big.dropout) == (
        1024, 4096, 16, 0.3)
    cfg = resolve_config("transformer_base", {"encoder_layers": 3, "dropout": 0.2})
    assert cfg == dataclasses.replace(ARCHITECTURES["transformer_base"], encoder_layers=3, dropout=0.2)
    with pytest.raises(NmtError, match="transformer_base.*transformer_tiny"):
        resolve_config("transformer_huge", {})
    with pytest.raises(NmtError, match="not divisible"):
        resolve_config("transformer_tiny", {"encoder_attention_heads": 3})
    with pytest.raises(NmtError, match="unknown model config fields: depth"):
        resolve_config("transformer_tiny", {"depth": 3})
    # Sharing all embeddings ties the decoder's output to its input: asking to untie them is refused.
    with pytest.raises(NmtError, match="drop --no-share-decoder-input-output-embed"):
        resolve_config("transformer_tiny", {"share_all_embeddings": True, "share_decoder_input_output_embed": False})
    tied = resolve_config("transformer_tiny", {"share_all_embeddings": True, "share_decoder_input_output_embed": True})
    assert tied.share_all_embeddings and tied.share_decoder_input_output_embed


@pytest.mark.parametrize("arch", ["transformer", "transformer_wmt_en_de"])
def test_fairseqs_base_presets_give_the_decoder_the_encoders_widths(arch) -> None:
    # fairseq's base_architecture: decoder_embed_dim = getattr(args, "decoder_embed_dim", args.encoder_embed_dim),
    # and the same for the feed-forward width; layers and heads stay the preset's.
    cfg = resolve_config(arch, {"encoder_embed_dim": 256, "encoder_ffn_embed_dim": 1024})
    assert (cfg.decoder_embed_dim, cfg.decoder_ffn_embed_dim, cfg.decoder_attention_heads) == (256, 1024, 8)
    own = resolve_config(arch, {"encoder_embed_dim": 256, "decoder_embed_dim": 512})
    assert (own.decoder_embed_dim, own.decoder_ffn_embed_dim) == (512, 2048)
    # Presets that name their decoder's widths keep them, in fairseq as here.
    big = resolve_config("transformer_vaswani_wmt_en_de_big", {"encoder_embed_dim": 512})
    assert big.decoder_embed_dim == 1024


def test_model_options_give_only_the_flags_used() -> None:
    import click

    seen = {}

    @click.command()
    @model_options
    def command(**params) -> None:
        seen.update(overrides_from(params))

    result = CliRunner().invoke(command, ["--encoder-layers", "3", "--dropout", "0.25", "--share-all-embeddings",
                                          "--no-scale-embedding"])
    assert result.exit_code == 0, result.output
    assert seen == {"encoder_layers": 3, "dropout": 0.25, "share_all_embeddings": True, "scale_embedding": False}


# ---- nmt info ----


def test_info_prints_architecture_and_parameter_count() -> None:
    result = CliRunner().invoke(main, ["info", "--arch", "transformer_base", "--vocab-size", "37000",
                                       "--share-all-embeddings", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["parameters"]["total"] == paper_parameter_count(512, 2048, 6, 37000)
    assert info["config"]["share_all_embeddings"] is True
    assert info["config"]["encoder_layers"] == 6

    text = CliRunner().invoke(main, ["info", "--arch", "transformer_tiny", "--src-vocab-size", "30",
                                     "--tgt-vocab-size", "40", "--decoder-layers", "1"])
    assert text.exit_code == 0, text.output
    assert "decoder_layers" in text.output and "with decoder_layers=1" in text.output
    model = build_model(resolve_config("transformer_tiny", {"decoder_layers": 1}), 30, 40)
    assert f"{count_parameters(model):,}" in text.output


def test_info_counts_sizes_that_cannot_be_built_at_once() -> None:
    """Counted from the config: 10^8 layers, or a dimension whose size overflows torch, take no time."""
    start = time.monotonic()
    result = CliRunner().invoke(main, ["info", "--arch", "transformer_big", "--encoder-layers", "100000000", "--json"])
    assert result.exit_code == 0, result.output
    assert time.monotonic() - start < 2
    with torch.device("meta"):
        one, two = (count_parameters(build_model(resolve_config("transformer_big", {"encoder_layers": n}), 8, 8))
                    for n in (1, 2))
        six = count_parameters(build_model(ARCHITECTURES["transformer_big"], 8, 8))
    embeddings = 3 * 8 * 1024  # vocabularies of 8 (info's placeholder): two embeddings, the output projection
    expected = six - embeddings + (10**8 - 6) * (two - one)
    assert json.loads(result.output)["parameters"] == {"without_embeddings": expected}

    result = CliRunner().invoke(main, ["info", "--arch", "transformer_tiny", "--encoder-embed-dim", "99999999999998",
                                       "--vocab-size", "30"])
    assert result.exit_code == 0, result.output
    cfg = resolve_config("transformer_tiny", {"encoder_embed_dim": 99999999999998})
    assert f"{parameter_counts(cfg, 30, 30)['total']:,}" in result.output


def test_info_rejects_bad_flag_combinations() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["info", "--arch", "transformer_tiny", "--vocab-size", "30",
                                  "--src-vocab-size", "30"])
    assert result.exit_code == 1 and result.output.startswith("error: ") and "not both" in result.output
    result = runner.invoke(main, ["info"])
    assert result.exit_code == 1 and "exactly one of --arch and --path" in result.output
    result = runner.invoke(main, ["info", "--path", "run/checkpoint_best.pt", "--encoder-layers", "2"])
    assert result.exit_code == 1 and "--path takes no model options" in result.output
    result = runner.invoke(main, ["info", "--arch", "transformer_tiny", "--vocab-size", "1"])
    assert result.exit_code == 1 and "--vocab-size must be >= 2" in result.output
    result = runner.invoke(main, ["info", "--arch", "transformer_tiny", "--src-vocab-size", "30",
                                  "--tgt-vocab-size", "40", "--share-all-embeddings"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [result.output.strip()]
    assert result.output.startswith("error: ") and "joined dictionary" in result.output


def test_vocabulary_logits_equal_torch_linear() -> None:
    torch.manual_seed(16)
    weight = torch.randn(50, 12)
    hidden = torch.randn(7, 3, 12)[:, -1]  # a strided (N, D) view, as decode_step passes it
    torch.testing.assert_close(vocabulary_logits(hidden, weight), F.linear(hidden, weight), atol=1e-5, rtol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert vocabulary_logits(hidden, weight).dtype == torch.bfloat16  # autocast is obeyed


@pytest.mark.parametrize("overrides", [
    pytest.param({}, id="tiny"),
    pytest.param({"share_all_embeddings": True, "normalize_before": True}, id="share-all-pre-norm"),
    pytest.param({"encoder_embed_dim": 64, "encoder_attention_heads": 4, "encoder_ffn_embed_dim": 96,
                  "encoder_layers": 1, "decoder_layers": 3}, id="other-encoder-sizes"),
])
def test_training_matmul_flops_match_torchs_flop_counter(overrides: dict) -> None:
    cfg = resolve_config("transformer_tiny", {"dropout": 0.0, **overrides})
    src_vocab, tgt_vocab = vocab_sizes(overrides)
    model = build_model(cfg, src_vocab, tgt_vocab)
    sentences, src_len, tgt_len = 3, 7, 5
    src = torch.randint(4, src_vocab, (sentences, src_len))
    prev = torch.randint(4, tgt_vocab, (sentences, tgt_len))
    # The math kernel runs attention as matrix products, which the counter sees.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(src, prev).sum().backward()
    assert counter.get_total_flops() == training_matmul_flops(cfg, sentences, src_len, tgt_len, tgt_vocab)


@pytest.mark.parametrize("field, value", [("activation_fn", "tanh"), ("sinusoids", "learned")])
def test_a_stored_model_config_outside_its_choices_is_one_error(field, value):
    # A checkpoint's config skips click's own check of the choices.
    with pytest.raises(NmtError, match=f"must be one of .* \\(got '{value}'\\)"):
        ModelConfig.from_dict({field: value})


def test_a_stored_model_configs_field_types() -> None:
    # JSON writes 0.0 as 0 in some tools: an int fits a float field; a bool is no count, a string no number.
    assert ModelConfig.from_dict({"dropout": 0}).dropout == 0
    for field, value in [("encoder_layers", True), ("dropout", "0.1"), ("share_all_embeddings", 1)]:
        with pytest.raises(NmtError, match=f"model config field {field} is .*, not of type"):
            ModelConfig.from_dict({field: value})
