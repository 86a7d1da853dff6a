"""Beam search, greedy decoding, sampling and ensembles against independent references.

The decoders here are scripted: their next-token log-probs are fixed tables (or a
deterministic pseudo-random function) of the sentence and the prefix, so expected
beams can be computed by hand or by a plain per-sentence Python reference.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter

import numpy as np
import pytest
import torch

from nmt_cli.config import DecodeConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID, UNK_ID
from nmt_cli.decode.ensemble import Ensemble, check_same_dictionaries
from nmt_cli.decode.row_topk import BLOCK, MIN_WIDTH_PER_BLOCK_KEPT
from nmt_cli.decode.search import beam_candidates, force_eos, generate
from nmt_cli.errors import NmtError

INF = math.inf
V = 8
A, B, C, D = 4, 5, 6, 7  # word ids


def dist(probs: dict[int, float]) -> list[float]:
    """A log-prob row over V from {token: probability}; unlisted tokens get -inf."""
    return [math.log(probs[v]) if probs.get(v, 0) > 0 else -INF for v in range(V)]


class ScriptedDecoder:
    """Log-probs looked up by (sentence id, prefix); the sentence id is the first source token.

    It recomputes from the full prefix each step (no real cache), records the batch
    size of every call, and checks the search's promises: K target rows per sentence,
    and reorders that keep every row with its sentence.
    """

    def __init__(self, table: dict[tuple[int, ...], list[float]], default: list[float] | None = None) -> None:
        self.table = table
        self.default = default or dist({EOS_ID: 0.9, D: 0.1})
        self.batch_sizes: list[int] = []

    def lprobs(self, sentence: int, prefix: tuple[int, ...]) -> list[float]:
        return self.table.get((sentence, *prefix), self.table.get(prefix, self.default))

    sentence_drop_fraction = 0.0

    def encode(self, src_tokens):
        return src_tokens[:, 0].clone()

    def new_cache(self):
        return {}

    def reorder_encoder_out(self, encoder_out, index):
        return encoder_out[index]

    def decode_step(self, prev_tokens, encoder_out, cache):
        self.batch_sizes.append(prev_tokens.size(0))
        beams, rest = divmod(prev_tokens.size(0), encoder_out.numel())
        assert rest == 0, "K target rows per sentence"
        cache["sentences"] = encoder_out.tolist()
        cache["row_sentences"] = encoder_out.repeat_interleave(beams).tolist()
        assert bool((prev_tokens[:, 0] == EOS_ID).all())
        rows = [self.lprobs(s, tuple(p[1:].tolist())) for s, p in zip(cache["row_sentences"], prev_tokens)]
        return torch.tensor(rows, dtype=torch.float32)

    def reorder_cache(self, cache, index, sentence_index=None):
        sentences = cache["sentences"]
        if sentence_index is not None:
            sentences = [sentences[i] for i in sentence_index.tolist()]
        beams, rest = divmod(index.numel(), len(sentences))
        assert rest == 0
        # New row i continues a row of the sentence that becomes sentence i // K.
        assert [cache["row_sentences"][i] for i in index.tolist()] == [s for s in sentences for _ in range(beams)]


class RandomDecoder(ScriptedDecoder):
    """Deterministic pseudo-random log-probs per (sentence, prefix) over `vocab` tokens."""

    def __init__(self, vocab: int = 12, eos_bias: float = 0.0) -> None:
        super().__init__({})
        self.vocab, self.eos_bias = vocab, eos_bias

    def lprobs(self, sentence: int, prefix: tuple[int, ...]) -> list[float]:
        seed = zlib.crc32(repr((sentence, prefix)).encode())
        logits = torch.randn(self.vocab, generator=torch.Generator().manual_seed(seed)) * 2
        logits[EOS_ID] += self.eos_bias * len(prefix)
        return torch.log_softmax(logits, dim=0).tolist()


def src(*sentence_ids: int, length: int = 3) -> torch.Tensor:
    """A source batch whose first token names the sentence for the scripted tables."""
    rows = [[s] + [A] * (length - 2) + [EOS_ID] for s in sentence_ids]
    return torch.tensor(rows)


def decode(model, src_tokens, **overrides):
    cfg = DecodeConfig(**{"beam": 2, "nbest": 2, "max_len_b": 10, **overrides})
    return generate(model, src_tokens, cfg, max_target_positions=1024)


# A table worked through by hand in the tests below (probabilities, K = 2).
HAND_TABLE = {
    (): dist({A: 0.5, B: 0.3, EOS_ID: 0.1, C: 0.06, D: 0.04}),
    (A,): dist({EOS_ID: 0.6, C: 0.3, D: 0.1}),
    (B,): dist({EOS_ID: 0.2, C: 0.7, D: 0.1}),
    (B, C): dist({EOS_ID: 0.5, D: 0.4, A: 0.1}),
    (A, C): dist({EOS_ID: 0.9, D: 0.1}),
}


def test_hand_worked_beams_and_finished_hypotheses_leaving_the_beam():
    # step 0 (EOS banned by min_len 1): beams a (.5), b (.3)
    # step 1: aE .30, bc .21, ac .15, bE .06 -> aE finishes; bE is outside the top K; beams bc, ac
    # step 2: acE .135, bcE .105 -> acE finishes, and the sentence has K = 2 hypotheses: done
    model = ScriptedDecoder(HAND_TABLE)
    (hyps,) = decode(model, src(0), lenpen=1.0)
    assert [h.tokens for h in hyps] == [[A, EOS_ID], [A, C, EOS_ID]]
    assert hyps[0].score == pytest.approx(math.log(0.30) / 2, abs=1e-6)
    assert hyps[1].score == pytest.approx(math.log(0.135) / 3, abs=1e-6)
    assert hyps[1].positional_scores == pytest.approx([math.log(0.5), math.log(0.3), math.log(0.9)], abs=1e-6)
    assert len(model.batch_sizes) == 3  # steps 0, 1, 2 and no more


@pytest.mark.parametrize(
    ("style", "lenpen", "divisors"),
    [
        ("fairseq", 1.0, (2.0, 3.0)),
        ("fairseq", 2.0, (4.0, 9.0)),  # longer hypothesis now wins
        ("fairseq", 0.0, (1.0, 1.0)),
        ("gnmt", 1.0, (7 / 6, 8 / 6)),
        ("gnmt", 4.0, ((7 / 6) ** 4, (8 / 6) ** 4)),  # longer hypothesis now wins
    ],
)
def test_length_penalty_styles_and_nbest_order(style, lenpen, divisors):
    (hyps,) = decode(ScriptedDecoder(HAND_TABLE), src(0), lenpen=lenpen, lenpen_style=style)
    expected = sorted(
        [([A, EOS_ID], math.log(0.30) / divisors[0]), ([A, C, EOS_ID], math.log(0.135) / divisors[1])],
        key=lambda h: -h[1],
    )
    assert [h.tokens for h in hyps] == [e[0] for e in expected]
    assert [h.score for h in hyps] == pytest.approx([e[1] for e in expected], abs=1e-6)


def test_max_length_forces_eos():
    # max_len 1: step 1 allows only EOS, with the model's own log-prob (not renormalized).
    (hyps,) = decode(ScriptedDecoder(HAND_TABLE), src(0), max_len_b=1)
    assert [h.tokens for h in hyps] == [[A, EOS_ID], [B, EOS_ID]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.30) / 2, math.log(0.06) / 2], abs=1e-6)
    # max_len_a scales with the source length (which counts the source's EOS): 0.5 * 2 = 1.
    (same,) = decode(ScriptedDecoder(HAND_TABLE), src(0, length=2), max_len_a=0.5, max_len_b=0)
    assert [h.tokens for h in same] == [[A, EOS_ID], [B, EOS_ID]]


def test_min_len_delays_eos():
    # min_len 2: step 1 bans EOS -> bc .21, ac .15; step 2: acE .135, bcE .105 both finish.
    (hyps,) = decode(ScriptedDecoder(HAND_TABLE), src(0), min_len=2, lenpen=0.0)
    assert [h.tokens for h in hyps] == [[A, C, EOS_ID], [B, C, EOS_ID]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.135), math.log(0.105)], abs=1e-6)


def test_no_repeat_ngram_blocks_repeated_bigram():
    table = {
        (): dist({A: 0.7, B: 0.3}),
        (A,): dist({A: 0.6, B: 0.1, EOS_ID: 0.3}),
        (A, A): dist({A: 0.7, B: 0.1, EOS_ID: 0.2}),
        (A, A, A): dist({EOS_ID: 1.0}),
    }
    (free,) = decode(ScriptedDecoder(table), src(0), beam=1, nbest=1, lenpen=0.0)
    assert free[0].tokens == [A, A, A, EOS_ID]
    # "a a" already occurred, so after "a a" the token a is banned; EOS (.2) beats b (.1).
    (blocked,) = decode(ScriptedDecoder(table), src(0), beam=1, nbest=1, lenpen=0.0, no_repeat_ngram_size=2)
    assert blocked[0].tokens == [A, A, EOS_ID]
    assert blocked[0].score == pytest.approx(math.log(0.7 * 0.6 * 0.2), abs=1e-6)


def test_unk_penalty():
    table = {(): dist({UNK_ID: 0.5, A: 0.4, EOS_ID: 0.1}), (UNK_ID,): dist({EOS_ID: 1.0}), (A,): dist({EOS_ID: 1.0})}
    (plain,) = decode(ScriptedDecoder(table), src(0), beam=1, nbest=1)
    assert plain[0].tokens == [UNK_ID, EOS_ID]
    (penalized,) = decode(ScriptedDecoder(table), src(0), beam=1, nbest=1, unk_penalty=1.0)
    assert penalized[0].tokens == [A, EOS_ID]


@pytest.mark.parametrize("K, vocab", [(1, 9), (4, 50), (5, 7), (3, 2)])
def test_beam_candidates_equal_a_top_k_over_all_beams(K, vocab):
    """Cutting each beam to its own best 2K first must give the best 2K of all K*V sums."""
    gen = torch.Generator().manual_seed(K * 100 + vocab)
    B = 6
    lprobs = torch.randn(B, K, vocab, generator=gen, dtype=torch.float64).log_softmax(dim=-1)
    lprobs[0, :, 1:] = -INF  # a sentence forced to one token
    cum = torch.randn(B, K, generator=gen, dtype=torch.float64)
    cum[1, 1:] = -INF  # dead beams
    C = min(2 * K, K * vocab)
    for first_step in (False, True):
        scores, tokens, beams = beam_candidates(lprobs, cum, first_step)
        summed = lprobs[:, :1] if first_step else lprobs + cum.unsqueeze(2)
        flat = summed.reshape(B, -1)
        expected = flat.topk(min(C, flat.size(1)), dim=1).values
        assert torch.equal(scores, expected)
        finite = scores.isfinite()
        got = summed[torch.arange(B).unsqueeze(1).expand_as(tokens), beams, tokens]
        assert torch.equal(got[finite], scores[finite])  # each candidate is the sum it claims


# --- an independent, plain per-sentence reference of fairseq's beam search ----------


def reference_beam(model: ScriptedDecoder, sentence: int, src_len: int, cfg: DecodeConfig) -> list[tuple[list[int], float]]:
    K = cfg.beam
    max_len = min(int(cfg.max_len_a * src_len + cfg.max_len_b), 1023)
    beams: list[tuple[list[int], np.float32]] = [([], np.float32(0))]
    finished: list[tuple[list[int], float]] = []
    for step in range(max_len + 1):
        candidates = []  # (score, order, beam index, token)
        for b, (tokens, cum) in enumerate(beams[:1] if step == 0 else beams):
            row = adjust_reference(model.lprobs(sentence, tuple(tokens)), tokens, step, max_len, cfg)
            for v, lp in enumerate(row):
                candidates.append((np.float32(cum) + np.float32(lp), b * len(row) + v, b, v))
        candidates.sort(key=lambda c: (-c[0], c[1]))
        candidates = candidates[: 2 * K]
        for score, _, b, v in candidates[:K]:
            if v == EOS_ID and score > -INF and len(finished) < K:
                divisor = (step + 1) ** cfg.lenpen if cfg.lenpen_style == "fairseq" else ((5 + step + 1) / 6) ** cfg.lenpen
                finished.append((beams[b][0] + [EOS_ID], float(score) / divisor))
        if len(finished) == K or step == max_len:
            break
        live = [(beams[b][0] + [v], score) for score, _, b, v in candidates if not (v == EOS_ID and score > -INF)]
        beams = live[:K]
    return sorted(finished, key=lambda h: -h[1])[: cfg.nbest]


def adjust_reference(row: list[float], tokens: list[int], step: int, max_len: int, cfg: DecodeConfig) -> list[float]:
    row = list(row)
    row[PAD_ID] = -INF
    row[UNK_ID] -= cfg.unk_penalty
    if step >= max_len:
        row = [lp if v == EOS_ID else -INF for v, lp in enumerate(row)]
    elif step < cfg.min_len:
        row[EOS_ID] = -INF
    n = cfg.no_repeat_ngram_size
    if n and len(tokens) >= n:
        for i in range(len(tokens) - n + 1):
            if tokens[i : i + n - 1] == tokens[len(tokens) - n + 1 :]:
                row[tokens[i + n - 1]] = -INF
    return row


@pytest.mark.parametrize("beam", [1, 2, 3, 5])
@pytest.mark.parametrize("overrides", [{}, {"lenpen": 0.6, "lenpen_style": "gnmt", "min_len": 2}, {"no_repeat_ngram_size": 2, "unk_penalty": 0.5}])
@pytest.mark.parametrize("lagged_sync", [False, True])
def test_batched_beam_search_matches_plain_reference(beam, overrides, lagged_sync):
    model = RandomDecoder(vocab=12, eos_bias=0.4)
    # Different source lengths give different maximum lengths within one batch.
    src_tokens = torch.full((6, 6), PAD_ID)
    lengths = [6, 2, 4, 3, 5, 2]
    for i, n in enumerate(lengths):
        src_tokens[i, : n - 1] = 10 + i
        src_tokens[i, n - 1] = EOS_ID
    cfg = DecodeConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=2, **overrides)
    got = generate(model, src_tokens, cfg, max_target_positions=1024, lagged_sync=lagged_sync)
    for i, n in enumerate(lengths):
        expected = reference_beam(model, 10 + i, n, cfg)
        assert [h.tokens for h in got[i]] == [e[0] for e in expected], f"sentence {i}"
        assert [h.score for h in got[i]] == pytest.approx([e[1] for e in expected], abs=1e-5)
        for h in got[i]:
            assert len(h.positional_scores) == len(h.tokens)
            divisor = len(h.tokens) ** cfg.lenpen if cfg.lenpen_style == "fairseq" else ((5 + len(h.tokens)) / 6) ** cfg.lenpen
            assert sum(h.positional_scores) / divisor == pytest.approx(h.score, abs=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"no_repeat_ngram_size": 2, "unk_penalty": 0.5, "min_len": 2}])
def test_beam_search_over_a_wide_vocabulary_matches_plain_reference(overrides):
    """A vocabulary wide enough for row_topk's block pass (64 blocks of 64 and 45 more)."""
    vocab, beam = 4141, 4
    assert vocab >= MIN_WIDTH_PER_BLOCK_KEPT * 2 * beam * BLOCK
    model = RandomDecoder(vocab=vocab, eos_bias=1.5)
    lengths = [5, 2, 4]
    src_tokens = torch.full((3, 5), PAD_ID)
    for i, n in enumerate(lengths):
        src_tokens[i, : n - 1] = 10 + i
        src_tokens[i, n - 1] = EOS_ID
    cfg = DecodeConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=1, **overrides)
    got = generate(model, src_tokens, cfg, max_target_positions=1024)
    for i, n in enumerate(lengths):
        expected = reference_beam(model, 10 + i, n, cfg)
        assert [h.tokens for h in got[i]] == [e[0] for e in expected], f"sentence {i}"
        assert [h.score for h in got[i]] == pytest.approx([e[1] for e in expected], abs=1e-5)


@pytest.mark.parametrize("lagged_sync", [False, True])
def test_batched_equals_one_sentence_at_a_time_and_finished_sentences_leave_the_batch(lagged_sync):
    model = RandomDecoder(vocab=16, eos_bias=0.5)
    src_tokens = src(*range(20, 28), length=4)
    cfg = DecodeConfig(beam=4, nbest=4, max_len_b=12)
    batched = generate(model, src_tokens, cfg, max_target_positions=1024, lagged_sync=lagged_sync)
    assert model.batch_sizes[0] == 8 * 4 and model.batch_sizes[-1] < 8 * 4
    # Each step runs only the sentences not yet done; lagged, they leave one step later.
    immediate = RandomDecoder(vocab=16, eos_bias=0.5)
    generate(immediate, src_tokens, cfg, 1024, lagged_sync=False)
    expected = [32] + immediate.batch_sizes if lagged_sync else immediate.batch_sizes
    assert model.batch_sizes == expected
    for i in range(8):
        (alone,) = generate(model, src_tokens[i : i + 1], cfg, max_target_positions=1024)
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-6)


@pytest.mark.parametrize("lagged_sync", [False, True])
def test_finished_sentences_wait_for_the_decoders_drop_fraction(lagged_sync):
    src_tokens = src(*range(20, 28), length=4)
    cfg = DecodeConfig(beam=4, nbest=4, max_len_b=12)
    at_once = RandomDecoder(vocab=16, eos_bias=0.5)
    want = generate(at_once, src_tokens, cfg, 1024, lagged_sync=lagged_sync)
    patient = RandomDecoder(vocab=16, eos_bias=0.5)
    patient.sentence_drop_fraction = 0.5
    got = generate(patient, src_tokens, cfg, 1024, lagged_sync=lagged_sync)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    assert [h.score for s in got for h in s] == pytest.approx([h.score for s in want for h in s], abs=1e-6)
    shrinks = [(before, after) for before, after in zip(patient.batch_sizes, patient.batch_sizes[1:]) if after < before]
    assert shrinks and all(before - after >= before / 2 for before, after in shrinks)
    assert len(shrinks) < len(set(at_once.batch_sizes)) - 1  # fewer, larger departures


def test_beam_one_equals_naive_greedy():
    model = RandomDecoder(vocab=16, eos_bias=0.3)
    cfg = DecodeConfig(beam=1, nbest=1, max_len_b=15)
    got = generate(model, src(*range(30, 36)), cfg, max_target_positions=1024)
    for i, hyps in enumerate(got):
        tokens, total = [], 0.0
        for step in range(16):
            row = adjust_reference(model.lprobs(30 + i, tuple(tokens)), tokens, step, 15, cfg)
            best = max(range(len(row)), key=lambda v: row[v])
            tokens.append(best)
            total += row[best]
            if best == EOS_ID:
                break
        assert hyps[0].tokens == tokens
        assert hyps[0].score == pytest.approx(total / len(tokens), abs=1e-5)


def test_max_target_positions_caps_the_output_length():
    model = ScriptedDecoder({}, default=dist({A: 0.89, B: 0.1, EOS_ID: 0.01}))  # EOS never in the top K
    seen_lengths = []
    step = model.decode_step
    model.decode_step = lambda prev, enc, cache: seen_lengths.append(prev.size(1)) or step(prev, enc, cache)
    hyps = generate(model, src(0), DecodeConfig(beam=2, nbest=2, max_len_b=200), max_target_positions=6)[0]
    # 5 tokens + </s>; the decoder never sees more than 6 positions (leading </s> included).
    assert hyps[0].tokens == [A] * 5 + [EOS_ID]
    assert [len(h.tokens) for h in hyps] == [6, 6]
    assert max(seen_lengths) == 6


def test_beam_larger_than_vocabulary_is_an_error():
    with pytest.raises(NmtError, match="--beam 9"):
        generate(ScriptedDecoder(HAND_TABLE), src(0), DecodeConfig(beam=9), max_target_positions=1024)


# --- sampling -------------------------------------------------------------------------


def test_sampling_is_seeded_and_follows_the_distribution():
    table = {(): dist({A: 0.7, B: 0.3}), (A,): dist({EOS_ID: 1.0}), (B,): dist({EOS_ID: 1.0})}
    cfg = DecodeConfig(beam=1, sampling=True)
    src_tokens = src(*([0] * 2000))

    def run(seed):
        return [h[0].tokens[0] for h in generate(ScriptedDecoder(table), src_tokens, cfg, 1024, torch.Generator().manual_seed(seed))]

    first = run(7)
    assert first == run(7)
    assert first != run(8)
    share_a = Counter(first)[A] / len(first)
    assert abs(share_a - 0.7) < 0.04  # 4 standard deviations of a binomial(2000, 0.7) share


def test_sampling_topk_one_and_tiny_topp_equal_greedy():
    model = RandomDecoder(vocab=16, eos_bias=0.3)
    src_tokens = src(*range(40, 46))
    greedy = generate(model, src_tokens, DecodeConfig(beam=1, max_len_b=12), 1024)
    for extra in ({"sampling_topk": 1}, {"sampling_topp": 1e-6}):
        cfg = DecodeConfig(beam=3, nbest=3, max_len_b=12, sampling=True, **extra)
        sampled = generate(model, src_tokens, cfg, 1024, torch.Generator().manual_seed(1))
        for g, s in zip(greedy, sampled):
            assert all(h.tokens == g[0].tokens for h in s)


def test_sampling_topp_keeps_the_crossing_token():
    from nmt_cli.decode.sampling import restrict_topp

    probs = torch.tensor([[0.1, 0.5, 0.25, 0.15]])
    kept, ids = restrict_topp(probs, 0.6)  # 0.5 < 0.6, 0.5 + 0.25 crosses: keep both
    assert ids[0].tolist() == [1, 2, 3, 0]
    assert kept[0].tolist() == pytest.approx([0.5, 0.25, 0.0, 0.0])


@pytest.mark.parametrize("topp, kept", [(0.25, 1), (0.5, 1), (0.5000001, 2), (0.75, 2), (0.76, 3), (1.0, 3)])
def test_sampling_topp_boundary_is_fairseqs(topp, kept):
    """fairseq's _sample_topp (fairseq/search.py): keep the tokens whose cumulative sorted
    probability is strictly below p (`cumsum.lt(p)`), plus the one after them. On [0.5,
    0.25, 0.25] (sums 0.5, 0.75, 1.0, exact in binary) a cumulative mass equal to p is not
    below it: p = 0.5 keeps one token, p = 0.75 two."""
    from nmt_cli.decode.sampling import restrict_topp

    probs = torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64)
    masked, ids = restrict_topp(probs, topp)
    assert ids[0, 0].item() == 1
    assert masked[0].gt(0).sum().item() == kept
    assert masked[0, :kept].tolist() == [0.5, 0.25, 0.25][:kept]


def test_sampling_weights_renormalise_only_rows_that_underflow():
    from nmt_cli.decode.sampling import sampling_weights

    inf = math.inf
    lprobs = torch.tensor([
        [math.log(0.2), math.log(0.5), -inf, math.log(0.1)],  # </s>-like ban: fairseq's own weights stay
        [-inf, -200.0, -201.0, -inf],  # every allowed weight underflows to 0: renormalised
        [-inf, -inf, -inf, -inf],  # nothing allowed: equal weights (what is drawn scores -inf)
    ])
    weights = sampling_weights(lprobs)
    assert weights[0].tolist() == pytest.approx([0.2, 0.5, 0.0, 0.1])
    assert weights[1].tolist() == pytest.approx([0.0, 1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1)), 0.0])
    assert weights[2].tolist() == [1.0, 1.0, 1.0, 1.0]
    torch.multinomial(weights, 1)  # every row can be drawn from


# --- ensembles ------------------------------------------------------------------------


def test_ensemble_of_a_model_with_itself_equals_the_model():
    model = RandomDecoder(vocab=16, eos_bias=0.3)
    src_tokens = src(*range(50, 54))
    cfg = DecodeConfig(beam=3, nbest=3, max_len_b=10)
    alone = generate(model, src_tokens, cfg, 1024)
    both = generate(Ensemble([model, model]), src_tokens, cfg, 1024)
    for x, y in zip(alone, both):
        assert [h.tokens for h in x] == [h.tokens for h in y]
        assert [h.score for h in x] == pytest.approx([h.score for h in y], abs=1e-5)


def test_ensemble_averages_probabilities():
    first = ScriptedDecoder({(): dist({A: 0.8, B: 0.2}), (A,): dist({EOS_ID: 1.0}), (B,): dist({EOS_ID: 1.0})})
    second = ScriptedDecoder({(): dist({A: 0.2, B: 0.8}), (A,): dist({EOS_ID: 1.0}), (B,): dist({EOS_ID: 1.0})})
    third = ScriptedDecoder({(): dist({A: 0.6, B: 0.4}), (A,): dist({EOS_ID: 1.0}), (B,): dist({EOS_ID: 1.0})})
    (hyps,) = generate(Ensemble([first, second, third]), src(0), DecodeConfig(beam=2, nbest=2, lenpen=0.0), 1024)
    # mean probabilities: a (0.8 + 0.2 + 0.6) / 3, b (0.2 + 0.8 + 0.4) / 3; then EOS with probability 1.
    assert [h.tokens for h in hyps] == [[A, EOS_ID], [B, EOS_ID]]
    assert [h.score for h in hyps] == pytest.approx([math.log(1.6 / 3), math.log(1.4 / 3)], abs=1e-6)


def test_ensemble_with_different_dictionaries_is_an_error():
    same = (["<s>", "<pad>", "</s>", "<unk>", "a"], ["<s>", "<pad>", "</s>", "<unk>", "x"])
    check_same_dictionaries(["a.pt", "b.pt"], [same, same])
    other = (same[0], ["<s>", "<pad>", "</s>", "<unk>", "y"])
    with pytest.raises(NmtError, match=r"^the target dictionary of b\.pt does not match checkpoint a\.pt \(5 vs 5 symbols; id 4 is 'y' vs 'x'\)"):
        check_same_dictionaries(["a.pt", "b.pt"], [same, other])


def test_force_eos_leaves_only_eos_in_the_marked_rows() -> None:
    lprobs = torch.randn(5, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    at_max = torch.tensor([True, False, False, True, False])
    expected = lprobs.clone()
    for row in (0, 3):
        expected[row] = -math.inf
        expected[row, EOS_ID] = lprobs[row, EOS_ID]
    assert force_eos(lprobs.clone(), at_max).equal(expected)
