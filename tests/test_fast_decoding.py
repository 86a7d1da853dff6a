"""The reference Transformer, without any of nmt_cli/models/fast/ (REFERENCE_DECODING,
plain linear layers, torch's dropout), against the model as `nmt translate` runs it on
a CPU (the default DecodingOptions, and packed or int8 linear layers): the same
hypotheses, greedy and beam, on several batch shapes; the same encoder output at every
token when its layers run on token rows."""

from __future__ import annotations

import pytest
import torch
from model_utils import EOS, PAD, SRC_V, TGT_V, eos_prone, source_batch, tiny_model

from nmt_cli.config import DecodeConfig
from nmt_cli.decode.search import generate
from nmt_cli.models.decoding_state import RowMajorKV
from nmt_cli.models.fast.beam_slots import BeamSlotKV
from nmt_cli.models.fast.dropout import set_lane_mask_dropout
from nmt_cli.models.fast.options import REFERENCE_DECODING, DecodingOptions
from nmt_cli.models.fast.packed import pack_linears, packed_unavailable_reason
from nmt_cli.models.fast.token_rows import TokenRows

BATCHES = [
    pytest.param([7], id="one-sentence"),
    pytest.param([5, 9, 3], id="three"),
    pytest.param([2, 11, 4, 8, 6, 3, 12, 5, 9, 7, 10], id="eleven"),
]


def model_pair(seed: int, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(reference, fast): the same weights, decoding without and with the speed work."""
    reference = eos_prone(tiny_model(seed, dtype=dtype, decoding=REFERENCE_DECODING))
    fast = eos_prone(tiny_model(seed, dtype=dtype, decoding=DecodingOptions()))
    return reference, fast


def assert_same_hypotheses(got: list, want: list, abs_tol: float) -> None:
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    assert [h.score for s in got for h in s] == pytest.approx([h.score for s in want for h in s], abs=abs_tol)
    for sentence_got, sentence_want in zip(got, want):
        for h_got, h_want in zip(sentence_got, sentence_want):
            assert h_got.positional_scores == pytest.approx(h_want.positional_scores, abs=abs_tol)


@pytest.mark.parametrize("lengths", BATCHES)
@pytest.mark.parametrize("beam", [1, 4])
def test_the_reference_model_decodes_as_the_fast_one(beam: int, lengths: list[int]) -> None:
    reference, fast = model_pair(41, torch.float64)
    src = source_batch(lengths, SRC_V, seed=42)
    cfg = DecodeConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=6)
    want = generate(reference, src, cfg, 1024)
    got = generate(fast, src, cfg, 1024)
    assert_same_hypotheses(got, want, abs_tol=1e-9)
    assert reference.sentence_drop_fraction == 0.0 < fast.sentence_drop_fraction


@pytest.mark.skipif(packed_unavailable_reason(torch.float32) is not None, reason="no oneDNN float32 kernels here")
@pytest.mark.parametrize("lengths", BATCHES)
@pytest.mark.parametrize("beam", [1, 4])
def test_the_reference_model_decodes_as_the_fast_one_on_packed_linears(beam: int, lengths: list[int]) -> None:
    reference, fast = model_pair(43, torch.float32)
    assert pack_linears(fast, torch.float32)
    src = source_batch(lengths, SRC_V, seed=44)
    cfg = DecodeConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=6)
    want = generate(reference, src, cfg, 1024)
    got = generate(fast, src, cfg, 1024)
    # The same arithmetic, its sums in another order: equal up to float32 rounding.
    assert_same_hypotheses(got, want, abs_tol=1e-4)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "swish"])
def test_the_fast_model_decodes_as_the_reference_with_each_activation(activation: str, packed: bool) -> None:
    """Packing fuses a ReLU into fc1 (oneDNN's post-op); that must happen for relu models only."""
    if packed and packed_unavailable_reason(torch.float32) is not None:
        pytest.skip("no oneDNN float32 kernels here")
    reference, fast = (eos_prone(tiny_model(47, dtype=torch.float32, decoding=decoding, activation_fn=activation))
                       for decoding in (REFERENCE_DECODING, DecodingOptions()))
    if packed:
        assert pack_linears(fast, torch.float32)
    src = source_batch([5, 9, 3], SRC_V, seed=48)
    cfg = DecodeConfig(beam=4, nbest=4, max_len_a=1.0, max_len_b=6)
    assert_same_hypotheses(generate(fast, src, cfg, 1024), generate(reference, src, cfg, 1024), abs_tol=1e-4)


def test_each_model_takes_the_layouts_its_options_select() -> None:
    """What the comparisons above compare: the reference model runs the row-major cache
    with no transposed keys nor pooled buffers; the fast one the beam slots."""
    reference, fast = model_pair(45, torch.float32)
    src, prev = source_batch([4, 6], SRC_V), torch.full((8, 1), EOS)
    caches = {}
    for name, model in (("reference", reference), ("fast", fast)):
        caches[name] = model.new_cache()
        model.decode_step(prev, model.encode(src), caches[name])
    assert isinstance(caches["reference"].self_attn, RowMajorKV)
    assert caches["reference"].cross.keys_t is None and caches["reference"].buffers.pool is None
    assert isinstance(caches["fast"].self_attn, BeamSlotKV) and caches["fast"].cross.keys_t is not None
    assert caches["fast"].buffers.pool is fast.cache_buffers


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-norm", "pre-norm"])
def test_the_encoder_on_token_rows_is_the_padded_one_at_every_token(normalize_before: bool) -> None:
    reference = tiny_model(48, decoding=REFERENCE_DECODING, normalize_before=normalize_before)
    fast = tiny_model(48, decoding=DecodingOptions(), normalize_before=normalize_before)
    src = source_batch([3, 9, 1, 6], SRC_V, seed=49)
    layer_inputs = []
    hook = fast.encoder.layers[0].register_forward_pre_hook(lambda m, args: layer_inputs.append(args[0].shape))
    got, want = fast.encode(src), reference.encode(src)
    hook.remove()
    tokens = src.ne(PAD)
    assert layer_inputs == [torch.Size([int(tokens.sum()), fast.cfg.encoder_embed_dim])]  # pads skipped the layers
    torch.testing.assert_close(got.out[tokens], want.out[tokens], atol=1e-12, rtol=0)
    assert not got.out[~tokens].any()
    assert torch.equal(got.padding_mask, want.padding_mask)
    got_cross, want_cross = fast.cross_attention_state(got), reference.cross_attention_state(want)
    # (L, 2, B, H, S, Dh): the tokens' keys and values as the reference's, zeros at the (masked) pads.
    torch.testing.assert_close(got_cross.kv.movedim(4, 3)[:, :, tokens], want_cross.kv.movedim(4, 3)[:, :, tokens],
                               atol=1e-12, rtol=0)
    assert not got_cross.kv.movedim(4, 3)[:, :, ~tokens].any()
    assert torch.equal(got_cross.mask, want_cross.mask)


def test_token_rows_pack_and_unpack_a_batch_with_enough_pads() -> None:
    padding_mask = torch.tensor([[False, False, True], [False, True, True]])
    rows = TokenRows.if_pads_reach(padding_mask, 0.05)
    assert rows is not None and rows.index.tolist() == [0, 1, 3]
    x = torch.arange(12.0).view(2, 3, 2)
    assert rows.pack(x).tolist() == [[0.0, 1.0], [2.0, 3.0], [6.0, 7.0]]
    assert rows.unpack(rows.pack(x)).tolist() == [[[0.0, 1.0], [2.0, 3.0], [0.0, 0.0]],
                                                  [[6.0, 7.0], [0.0, 0.0], [0.0, 0.0]]]
    # Pads under the share asked for: every position runs; a share of 0 packs any batch.
    one_pad_in_forty = torch.zeros(4, 10, dtype=torch.bool)
    one_pad_in_forty[3, 9] = True
    assert TokenRows.if_pads_reach(one_pad_in_forty, 0.05) is None
    assert TokenRows.if_pads_reach(one_pad_in_forty, 0.025) is not None
    assert TokenRows.if_pads_reach(torch.zeros(4, 5, dtype=torch.bool), 0.05) is None
    assert TokenRows.if_pads_reach(torch.zeros(4, 5, dtype=torch.bool), 0.0).index.tolist() == list(range(20))


def test_without_lane_masks_training_dropout_is_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    """lane_mask_dropout=False (Transformer, build_model or set_lane_mask_dropout): every
    dropout of the model in training is F.dropout; with lane masks none is, on a CPU."""
    calls: list[float] = []
    torch_dropout = torch.nn.functional.dropout
    monkeypatch.setattr(torch.nn.functional, "dropout",
                        lambda x, p, training, *rest: calls.append(p) or torch_dropout(x, p, training, *rest))
    src, prev = source_batch([5, 7], SRC_V), source_batch([6, 4], TGT_V, seed=47)
    counts = {}
    for lane_masks in (True, False):
        model = tiny_model(46, dtype=torch.float32, dropout=0.3).train()
        set_lane_mask_dropout(model, lane_masks)
        calls.clear()
        model(src, prev)
        counts[lane_masks] = len(calls)
    # Embeddings (2), then two residual sublayers per encoder layer and three per decoder layer.
    cfg = model.cfg
    assert counts == {True: 0, False: 2 + 2 * cfg.encoder_layers + 3 * cfg.decoder_layers}
    assert set(calls) == {0.3}
