"""Fixed-shape decoding steps (what `--cuda-graphs` captures) against the ordinary cached
steps, and the search whose whole step is fixed against the ordinary search.

On the CPU the fixed-shape step runs eagerly: everything but the capture itself is
checked here; tests/test_accelerator.py replays the graphs on a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_utils import EOS, SRC_V, TGT_V, eos_prone, padded_batch, source_batch, tiny_model

from nmt_cli.config import DecodeConfig
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.fixed_search import FixedSearch, Workspace, _whole_step, batch_bucket, supports
from nmt_cli.decode.graphs import GraphedCall, GraphedTransformer, with_fixed_steps
from nmt_cli.decode.search import BeamState, generate
from nmt_cli.errors import NmtError
from nmt_cli.models.fast.options import DecodingOptions
from nmt_cli.models.fast.packed import pack_linears, packed_unavailable_reason

VARIANTS = [
    pytest.param({}, id="post-norm"),
    pytest.param({"normalize_before": True, "learned_pos": True}, id="pre-norm-learned-pos"),
    pytest.param({"share_all_embeddings": True, "scale_embedding": False}, id="share-all"),
]


def generate_fixed(decoder: GraphedTransformer, src_tokens: torch.Tensor, cfg: DecodeConfig,
                   max_target_positions: int) -> list:
    """One batch through a FixedSearch of its own (nothing kept for later batches)."""
    return FixedSearch(decoder, cfg).generate(src_tokens, max_target_positions)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_fixed_steps_equal_cached_steps_through_reorders_drops_and_growth(overrides) -> None:
    vocab = TGT_V if overrides.get("share_all_embeddings") else SRC_V
    # A first capacity of 4 makes the cache double twice within 12 steps.
    model = tiny_model(5, vocab, TGT_V, decoding=DecodingOptions(initial_capacity=4), **overrides)
    fixed = GraphedTransformer(model, use_graphs=False)
    src = source_batch([6, 3, 5], vocab)
    prev = padded_batch(8, [12] * 6, TGT_V, bos=EOS)  # two rows (beams) per sentence
    plain_out, plain = model.encode(src), model.new_cache()
    fixed_out, cache = fixed.encode(src), fixed.new_cache()
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
        assert cache.model.length == t + 1
    assert cache.model.self_attn.capacity == 16  # grew 4 -> 8 -> 16
    # Only the steps for the current shape are kept: one per buffer, the two that alternate.
    assert len(cache.steps) == 2


def test_a_forced_prefix_runs_as_an_ordinary_step() -> None:
    model = tiny_model(6)
    fixed = GraphedTransformer(model, use_graphs=False)
    src, prev = source_batch([4, 6], SRC_V), padded_batch(9, [6, 6], TGT_V, bos=EOS)
    plain_out, plain = model.encode(src), model.new_cache()
    fixed_out, cache = fixed.encode(src), fixed.new_cache()
    for end in (3, 4, 5, 6):  # a 3-token prefix, then one token at a time
        want = model.decode_step(prev[:, :end], plain_out, plain)
        got = fixed.decode_step(prev[:, :end], fixed_out, cache)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert len(cache.steps) == 1  # the one-token steps ran fixed (one buffer: no reorders)


@pytest.mark.parametrize("lagged_sync", [False, True])
@pytest.mark.parametrize("cfg", [
    DecodeConfig(beam=3, nbest=3, max_len_a=1.0, max_len_b=4, min_len=2),
    DecodeConfig(beam=2, nbest=1, max_len_b=40, min_len=35, lenpen=0.6, lenpen_style="gnmt"),
    DecodeConfig(beam=1, max_len_b=9, no_repeat_ngram_size=2),
], ids=["beam3", "beam2-long", "greedy"])
def test_search_through_fixed_steps_equals_plain_search(cfg, lagged_sync) -> None:
    model = eos_prone(tiny_model(7, normalize_before=True))
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
    cache = model.new_cache()
    with torch.no_grad():
        model.start_cache(model.encode(source_batch([5, 3], vocab)), 6, cache, zeroed=True)
    model.prepare_static_step(cache)
    buffers = [t.to("meta") for t in (cache.self_attn.kv, cache.cross.kv, cache.cross.mask)]
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


# ---- the whole step fixed: model and search (nmt_cli/decode/fixed_search.py) ----


@pytest.mark.parametrize("cfg", [
    DecodeConfig(beam=4, nbest=4, max_len_a=1.0, max_len_b=4, min_len=2),
    DecodeConfig(beam=3, nbest=2, max_len_b=40, min_len=35, lenpen=0.6, lenpen_style="gnmt"),
    DecodeConfig(beam=2, nbest=2, max_len_b=12, lenpen=1.3, unk_penalty=0.7, temperature=0.8),
    DecodeConfig(beam=1, max_len_a=0.5, max_len_b=3),
    DecodeConfig(beam=5, nbest=5, max_len_b=0, min_len=0),
], ids=["beam4", "beam3-long-gnmt", "beam2-unk-temperature", "greedy", "max-len-0"])
@pytest.mark.parametrize("overrides", VARIANTS)
def test_fixed_search_equals_plain_search(cfg, overrides) -> None:
    vocab = TGT_V if overrides.get("share_all_embeddings") else SRC_V
    model = eos_prone(tiny_model(12, vocab, TGT_V, **overrides))
    src = source_batch([7, 3, 5, 9, 2, 6], vocab)
    want = generate(model, src, cfg, 1024)
    got = generate_fixed(GraphedTransformer(model, use_graphs=False), src, cfg, 1024)
    for sentence_want, sentence_got in zip(want, got, strict=True):
        assert [h.tokens for h in sentence_got] == [h.tokens for h in sentence_want]
        assert [h.score for h in sentence_got] == pytest.approx([h.score for h in sentence_want], abs=1e-9)
        for h_got, h_want in zip(sentence_got, sentence_want):
            assert h_got.positional_scores == pytest.approx(h_want.positional_scores, abs=1e-9)


@pytest.mark.skipif(packed_unavailable_reason(torch.float32) is not None, reason="no packed float32 kernels here")
def test_fixed_search_runs_a_model_with_packed_linear_layers() -> None:
    """A CPU model as `nmt translate` loads it (linear layers packed for oneDNN, which
    have no .weight): the fixed-shape search equals the plain one (decode benchmarks
    run it with --cuda-graphs on a CPU)."""
    model = eos_prone(tiny_model(12, dtype=torch.float32))
    assert pack_linears(model, torch.float32)
    src = source_batch([7, 3, 5], SRC_V)
    cfg = DecodeConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=4)
    want = generate(model, src, cfg, 1024)
    got = generate_fixed(GraphedTransformer(model, use_graphs=False), src, cfg, 1024)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    assert [h.score for s in got for h in s] == pytest.approx([h.score for s in want for h in s], abs=1e-5)


def test_fixed_search_steps_until_every_sentence_is_done(monkeypatch) -> None:
    """One call per step; the search stops one step after the last sentence is done
    (the host reads the flags a step late), not at the longest allowed output."""
    model = tiny_model(13)
    src = source_batch([4, 6], SRC_V)
    cfg = DecodeConfig(beam=2, nbest=2, max_len_b=60, min_len=5)
    calls = []
    call = GraphedCall.__call__
    monkeypatch.setattr(GraphedCall, "__call__", lambda self: calls.append(self) or call(self))
    hyps = generate_fixed(GraphedTransformer(model, use_graphs=False), src, cfg, 1024)
    longest = max(len(h.tokens) for s in hyps for h in s)
    assert longest < 60 and len(calls) <= longest + 2
    assert hyps == generate(model, src, cfg, 1024)


def test_fixed_search_rejects_what_it_does_not_support() -> None:
    model = GraphedTransformer(tiny_model(14), use_graphs=False)
    src = source_batch([4], SRC_V)
    assert not supports(DecodeConfig(sampling=True)) and not supports(DecodeConfig(no_repeat_ngram_size=2))
    with pytest.raises(ValueError):
        generate_fixed(model, src, DecodeConfig(sampling=True), 1024)
    with pytest.raises(NmtError, match="--beam 30"):
        generate_fixed(model, src, DecodeConfig(beam=30, nbest=1), 1024)


def test_whole_fixed_step_needs_no_tensor_values_on_the_host() -> None:
    """As test_fixed_step_needs_no_tensor_values_on_the_host, for model and search together."""
    model = tiny_model(15, dtype=torch.float32)
    K, max_len = 3, torch.tensor([4, 7])
    with torch.no_grad():
        cross = model.cross_attention_state(model.encode(source_batch([5, 3], SRC_V)))
    cross_kv, cross_mask = cross.kv, cross.mask
    state = BeamState.start(max_len, K, 10)
    state = BeamState(*(t.to("meta") for t in dataclasses.astuple(state)))
    position = torch.zeros((), dtype=torch.long, device="meta")
    ws = Workspace(state, position, cross_kv.to("meta"), cross_mask.to("meta"))
    self_kv, spare = ws.buffers(32)
    cfg = DecodeConfig(beam=K, nbest=2, min_len=2, unk_penalty=0.5, lenpen=0.6, lenpen_style="gnmt")
    _whole_step(model.to("meta"), ws, self_kv, spare, cfg)()
    assert state.tokens.is_meta and state.fin_scores.shape == (2, K + 1) and self_kv.is_meta


def test_fixed_search_reuses_buffers_and_steps_for_batches_of_one_shape(monkeypatch) -> None:
    """Batches whose padded shapes match share a workspace: its steps are made (captured)
    once, and every batch still gets exactly what a fresh search gives."""
    made = []
    init = GraphedCall.__init__
    monkeypatch.setattr(GraphedCall, "__init__", lambda self, *a: made.append(1) or init(self, *a))
    model = eos_prone(tiny_model(16, normalize_before=True))
    cfg = DecodeConfig(beam=3, nbest=2, max_len_b=40, min_len=34)  # past the first capacity (32)
    search = FixedSearch(GraphedTransformer(model, use_graphs=False), cfg)
    made_per_batch = []
    for seed, lengths in enumerate([[7, 3, 5, 9], [6, 6, 2, 4], [12, 2, 4, 3]]):  # all pad to 16 tokens
        src = padded_batch(30 + seed, lengths, SRC_V)
        src[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = EOS
        want = generate(model, src, cfg, 1024)
        got = search.generate(src, 1024)
        assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want], seed
        assert [h.score for s in got for h in s] == pytest.approx([h.score for s in want for h in s], abs=1e-9)
        made_per_batch.append(len(made))
    assert len(search.workspaces) == 1
    assert made_per_batch == [4, 4, 4]  # one step per buffer, for capacities 32 and 64, made once
    search.generate(source_batch([4, 5], SRC_V), 1024)  # another batch size: another workspace
    assert len(search.workspaces) == 2


def test_fixed_search_pads_the_batch_with_sentences_that_end_at_once(monkeypatch) -> None:
    assert [batch_bucket(b) for b in (1, 8, 9, 100, 128, 129)] == [1, 8, 10, 112, 128, 160]
    model = eos_prone(tiny_model(17))
    lengths = [7, 3, 5, 9, 2, 6, 4, 8, 5]  # 9 sentences: one padding sentence makes 10
    src = source_batch(lengths, SRC_V)
    cfg = DecodeConfig(beam=2, nbest=2, max_len_a=1.0, max_len_b=3)
    calls = []
    call = GraphedCall.__call__
    monkeypatch.setattr(GraphedCall, "__call__", lambda self: calls.append(self) or call(self))
    got = generate_fixed(GraphedTransformer(model, use_graphs=False), src, cfg, 1024)
    want = generate(model, src, cfg, 1024)
    assert len(got) == 9
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    assert len(calls) <= max(len(h.tokens) for s in got for h in s) + 1  # the padding did not run longer
