"""Fixed-shape decoding steps (what `--cuda-graphs` captures) against the ordinary cached steps.

On the CPU the fixed-shape step runs eagerly: everything but the capture itself is
checked here; tests/test_accelerator.py replays the graphs on a GPU.
"""

from __future__ import annotations

import pytest
import torch
from model_utils import EOS, SRC_V, TGT_V, padded_batch, tiny_model

from nmt_cli.config import DecodeConfig
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.graphs import GraphedTransformer, with_fixed_steps
from nmt_cli.decode.search import generate
from nmt_cli.models import transformer as transformer_module

VARIANTS = [
    pytest.param({}, id="post-norm"),
    pytest.param({"normalize_before": True, "learned_pos": True}, id="pre-norm-learned-pos"),
    pytest.param({"share_all_embeddings": True, "scale_embedding": False}, id="share-all"),
]


def source_batch(lengths: list[int], vocab: int) -> torch.Tensor:
    tokens = padded_batch(21, lengths, vocab)
    for row, length in enumerate(lengths):
        tokens[row, length - 1] = EOS
    return tokens


@pytest.mark.parametrize("overrides", VARIANTS)
def test_fixed_steps_equal_cached_steps_through_reorders_drops_and_growth(overrides, monkeypatch) -> None:
    # A first capacity of 4 makes the cache double twice within 12 steps.
    monkeypatch.setattr(transformer_module, "INITIAL_CACHE_CAPACITY", 4)
    vocab = TGT_V if overrides.get("share_all_embeddings") else SRC_V
    model = tiny_model(5, vocab, TGT_V, **overrides)
    fixed = GraphedTransformer(model, use_graphs=False)
    src = source_batch([6, 3, 5], vocab)
    prev = padded_batch(8, [12] * 6, TGT_V, bos=EOS)  # two rows (beams) per sentence
    plain_out, plain = model.encode(src), {}
    fixed_out, cache = fixed.encode(src), {}
    for t in range(prev.size(1)):
        if t == 3:  # beams swap within their sentences
            index, sentences = torch.tensor([1, 0, 2, 2, 5, 4]), None
        elif t == 7:  # the middle sentence leaves the batch
            index, sentences = torch.tensor([1, 1, 4, 5]), torch.tensor([0, 2])
        elif t == 10:  # after the last growth
            index, sentences = torch.tensor([1, 0, 2, 2]), None
        else:
            index = sentences = None
        if index is not None:
            for decoder, c in ((model, plain), (fixed, cache)):
                decoder.reorder_cache(c, index, sentence_index=sentences)
            if sentences is not None:
                plain_out = model.reorder_encoder_out(plain_out, sentences)
                fixed_out = fixed.reorder_encoder_out(fixed_out, sentences)
            prev = prev[index]
        want = model.decode_step(prev[:, : t + 1], plain_out, plain)
        got = fixed.decode_step(prev[:, : t + 1], fixed_out, cache)
        assert got.shape == (prev.size(0), TGT_V) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        assert cache["length"] == t + 1
    assert cache["self_kv"].size(1) == 16  # grew 4 -> 8 -> 16
    # Only the steps for the current shape are kept: one per buffer, the two that alternate.
    assert len(cache["fixed_steps"]) == 2


def test_a_forced_prefix_runs_as_an_ordinary_step() -> None:
    model = tiny_model(6)
    fixed = GraphedTransformer(model, use_graphs=False)
    src, prev = source_batch([4, 6], SRC_V), padded_batch(9, [6, 6], TGT_V, bos=EOS)
    plain_out, plain = model.encode(src), {}
    fixed_out, cache = fixed.encode(src), {}
    for end in (3, 4, 5, 6):  # a 3-token prefix, then one token at a time
        want = model.decode_step(prev[:, :end], plain_out, plain)
        got = fixed.decode_step(prev[:, :end], fixed_out, cache)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert len(cache["fixed_steps"]) == 1  # the one-token steps ran fixed (one buffer: no reorders)


@pytest.mark.parametrize("lagged_sync", [False, True])
@pytest.mark.parametrize("cfg", [
    DecodeConfig(beam=3, nbest=3, max_len_a=1.0, max_len_b=4, min_len=2),
    DecodeConfig(beam=2, nbest=1, max_len_b=40, min_len=35, lenpen=0.6, lenpen_style="gnmt"),
    DecodeConfig(beam=1, max_len_b=9, no_repeat_ngram_size=2),
], ids=["beam3", "beam2-long", "greedy"])
def test_search_through_fixed_steps_equals_plain_search(cfg, lagged_sync) -> None:
    model = tiny_model(7, normalize_before=True)
    src = source_batch([7, 3, 5, 9, 2, 6], SRC_V)
    want = generate(model, src, cfg, 1024, lagged_sync=lagged_sync)
    got = generate(with_fixed_steps(model, use_graphs=False), src, cfg, 1024, lagged_sync=lagged_sync)
    for sentence_want, sentence_got in zip(want, got):
        assert [h.tokens for h in sentence_got] == [h.tokens for h in sentence_want]
        assert [h.score for h in sentence_got] == pytest.approx([h.score for h in sentence_want], abs=1e-9)
        for h_got, h_want in zip(sentence_got, sentence_want):
            assert h_got.positional_scores == pytest.approx(h_want.positional_scores, abs=1e-9)


def test_ensemble_through_fixed_steps_equals_plain_ensemble() -> None:
    models = [tiny_model(8), tiny_model(9)]
    src = source_batch([5, 8, 3], SRC_V)
    cfg = DecodeConfig(beam=2, nbest=2, max_len_b=12, min_len=4)
    want = generate(Ensemble(models), src, cfg, 1024)
    fixed = with_fixed_steps(Ensemble(models), use_graphs=False)
    assert fixed.sentence_drop_fraction == GraphedTransformer.sentence_drop_fraction
    got = generate(fixed, src, cfg, 1024)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    assert [h.score for s in got for h in s] == pytest.approx([h.score for s in want for h in s], abs=1e-9)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_fixed_step_needs_no_tensor_values_on_the_host(overrides) -> None:
    """A captured step may not read device values on the host (.item(), nonzero, `if tensor`):
    on the meta device, which has shapes but no values, any such read raises. Off the CPU
    the step also takes the device branches (attention and output projection) a GPU takes."""
    vocab = TGT_V if overrides.get("share_all_embeddings") else SRC_V
    model = tiny_model(10, vocab, TGT_V, dtype=torch.float32, **overrides)
    cache: dict = {}
    with torch.no_grad():
        model.start_cache(model.encode(source_batch([5, 3], vocab)), 6, cache, zeroed=True)
    model.prepare_static_step(cache)
    buffers = [cache[name].to("meta") for name in ("self_kv", "cross_kv", "cross_mask")]
    new_tokens = torch.zeros(6, 1, dtype=torch.long, device="meta")
    index = torch.zeros((), dtype=torch.long, device="meta")
    with torch.no_grad():
        lprobs = model.to("meta").decode_step_static(new_tokens, index, *buffers)
    assert lprobs.shape == (6, TGT_V) and lprobs.dtype == torch.float32 and lprobs.is_meta
    with pytest.raises((RuntimeError, NotImplementedError)):
        index.item()  # what the check relies on


def test_a_failed_capture_warns_once_and_decoding_goes_on() -> None:
    """Asked for graphs of a model on the CPU, the capture fails: one warning, then the
    same fixed-shape steps run eagerly, with the same output."""
    model = tiny_model(11, normalize_before=True)
    src = source_batch([6, 4, 8], SRC_V)
    cfg = DecodeConfig(beam=3, nbest=2, max_len_b=10, min_len=3)
    warnings: list[str] = []
    graphed = with_fixed_steps(model, use_graphs=True, warn=warnings.append)
    got = generate(graphed, src, cfg, 1024)
    want = generate(model, src, cfg, 1024)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    assert [h.score for s in got for h in s] == pytest.approx([h.score for s in want for h in s], abs=1e-9)
    assert len(warnings) == 1 and warnings[0].startswith("warning: CUDA graph capture failed (")
    assert not graphed.use_graphs
