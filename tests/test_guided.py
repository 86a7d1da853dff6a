"""Guided decoding: forced prefixes, lexical constraints, alignments, scoring given translations.

Search is checked on scripted decoders (hand-worked tables, deterministic pseudo-random
log-probs) and on tiny random Transformers against plain references: a naive greedy
loop over teacher forcing, one sentence at a time; alignments on a model whose
cross-attention is set by hand; the CLI on the tiny run directory of test_translate.
"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from torch import nn

from nmt_cli.config import DecodeConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID
from nmt_cli.decode.constraints import ConstraintSet
from nmt_cli.decode.forced import hard_alignment, token_log_probs
from nmt_cli.decode.guided import WORD_START, word_alignment, word_indices
from nmt_cli.decode.search import generate
from nmt_cli.models.transformer import EncoderOut
from nmt_cli.text.bpe import BpeModel
from tests.model_utils import eos_prone, source_batch, tiny_model
from tests.test_benchmarks import run_benchmark
from tests.test_search import A, B, C, D, RandomDecoder, ScriptedDecoder, dist, src
from tests.test_translate import FAST, generated_sentences, load, nmt, one_thread, run_dir  # noqa: F401 (fixtures)

CPU = torch.device("cpu")


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i : i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


def first_index(tokens: list[int], phrase: list[int], start: int) -> int | None:
    return next((i for i in range(start, len(tokens) - len(phrase) + 1) if tokens[i : i + len(phrase)] == phrase), None)


# --- constraints ------------------------------------------------------------------------

# Worked by hand (K = 2): free search ends "A </s>" (0.6 * 0.9 = 0.54). With the phrase
# [C]: step 0 keeps A and B (bank 0; C has probability 0 there); step 1 may not end
# (C unmet) and deals out the best of bank 1, B C (0.3 * 0.4 = 0.12), before the best of
# bank 0; step 2 ends B C </s> (0.108) ahead of A C </s> (0.6 * 0.05 * 0.9 = 0.027).
CONSTRAINT_TABLE = {
    (): dist({A: 0.6, B: 0.3, EOS_ID: 0.1}),
    (A,): dist({EOS_ID: 0.9, C: 0.05, D: 0.05}),
    (B,): dist({EOS_ID: 0.5, C: 0.4, D: 0.1}),
    (B, C): dist({EOS_ID: 0.9, D: 0.1}),
    (A, C): dist({EOS_ID: 0.9, D: 0.1}),
}


def test_constraint_forces_a_phrase_the_free_search_misses():
    model = ScriptedDecoder(CONSTRAINT_TABLE)
    cfg = DecodeConfig(beam=2, max_len_b=6)
    free = generate(model, src(1), cfg, 1024)[0][0]
    assert free.tokens == [A, EOS_ID]
    phrases = ConstraintSet.from_lists([[[C]]], ordered=False, device=CPU)
    best = generate(model, src(1), cfg, 1024, constraints=phrases)[0][0]
    assert best.tokens == [B, C, EOS_ID]
    assert best.score == pytest.approx(math.log(0.3 * 0.4 * 0.9) / 3, abs=1e-6)


def random_phrases(rng: random.Random, count: int) -> list[list[list[int]]]:
    return [[[rng.randrange(4, 12) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(0, 2))]
            for _ in range(count)]


@pytest.mark.parametrize("ordered", [False, True])
def test_every_output_of_a_random_batch_contains_its_phrases(ordered):
    rng = random.Random(5)
    model = RandomDecoder(vocab=12, eos_bias=0.6)
    sentences = list(range(1, 9))
    phrases = random_phrases(rng, len(sentences))
    cfg = DecodeConfig(beam=4, nbest=2, max_len_b=12)
    out = generate(model, src(*sentences, length=5), cfg, 1024,
                   constraints=ConstraintSet.from_lists(phrases, ordered, CPU))
    for hyps, wanted in zip(out, phrases):
        tokens = hyps[0].tokens
        assert tokens[-1] == EOS_ID
        start = 0
        for phrase in wanted:
            assert contains(tokens, phrase), (tokens, wanted)
            if ordered:
                at = first_index(tokens, phrase, start)
                assert at is not None, (tokens, wanted)
                start = at + len(phrase)


def test_constraints_and_prefixes_batched_equal_one_by_one():
    rng = random.Random(9)
    model = RandomDecoder(vocab=12, eos_bias=0.4)
    sentences = list(range(1, 7))
    phrases = random_phrases(rng, len(sentences))
    prefixes = [[rng.randrange(4, 12) for _ in range(rng.randint(0, 3))] for _ in sentences]
    cfg = DecodeConfig(beam=3, nbest=3, max_len_b=10)

    def prefix_tensor(rows):
        width = max(1, max(len(r) for r in rows))
        return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])

    for ordered in (False, True):
        batched = generate(model, src(*sentences), cfg, 1024, prefix_tokens=prefix_tensor(prefixes),
                           constraints=ConstraintSet.from_lists(phrases, ordered, CPU))
        for i, s in enumerate(sentences):
            alone = generate(model, src(s), cfg, 1024, prefix_tokens=prefix_tensor([prefixes[i]]),
                             constraints=ConstraintSet.from_lists([phrases[i]], ordered, CPU))[0]
            assert [(h.tokens, h.score) for h in batched[i]] == [(h.tokens, h.score) for h in alone]
            assert batched[i][0].tokens[: len(prefixes[i])] == prefixes[i]


def test_constraints_on_a_real_model_batched_equal_one_by_one():
    model = eos_prone(tiny_model(seed=3), alpha=3.0)
    source = source_batch([6, 4, 7, 5], vocab=23, seed=4)
    phrases = [[[7, 8]], [[9], [10]], [], [[11, 12, 13]]]
    cfg = DecodeConfig(beam=3, max_len_a=1.0, max_len_b=4)
    batched = generate(model, source, cfg, 64, constraints=ConstraintSet.from_lists(phrases, False, CPU))
    for i, wanted in enumerate(phrases):
        row = source[i : i + 1, : int(source[i].ne(PAD_ID).sum())]
        alone = generate(model, row, cfg, 64, constraints=ConstraintSet.from_lists([wanted], False, CPU))[0]
        assert [h.tokens for h in batched[i]] == [h.tokens for h in alone]
        assert all(contains(batched[i][0].tokens, p) for p in wanted)


# (tokens, phrases, contained in order, contained in any order). Ordered: one phrase after
# another without overlap, so a phrase given twice must occur twice; unordered: each phrase
# anywhere, overlaps allowed, a repeated phrase met by one occurrence (as `track` counts them).
CONTAINS_CASES = [
    ([A, B, C], [[A], [C]], True, True),
    ([C, B, A], [[A], [C]], False, True),  # both there, in the other order
    ([A, B, C], [[A, B], [C]], True, True),
    ([A, B, C], [[C], [A, B]], False, True),
    ([A, B, C], [[A, B], [B, C]], False, True),  # overlapping at B
    ([A, B, C, B, C], [[A, B], [B, C]], True, True),
    ([A, B], [[A], [A]], False, True),  # a repeated phrase
    ([A, B, A], [[A], [A]], True, True),
    ([A, B, A], [[B], [A], [B]], False, True),
    ([A, B, C], [[A, C]], False, False),  # not contiguous
    ([A, B, C], [[A, B, C, D]], False, False),
    ([A, B, C], [], True, True),
    ([C, A, D, B], [[A], [B], [C]], False, True),
    ([A, C, D, B, C], [[A], [B], [C]], True, True),  # the second C comes after B
]


@pytest.mark.parametrize("tokens, phrases, ordered, unordered", CONTAINS_CASES)
def test_contains_phrases_truth_table(tokens, phrases, ordered, unordered):
    from nmt_cli.decode.constraints import contains_phrases, track

    for kind, expected in ((True, ordered), (False, unordered)):
        assert contains_phrases(tokens + [EOS_ID], phrases, ordered=kind) is expected
        # The search's own tracker, fed the output a token at a time, agrees.
        constraint = ConstraintSet.from_lists([phrases], kind, CPU)
        met, start = constraint.lengths.eq(0), torch.zeros(1, dtype=torch.long)
        for t in range(1, len(tokens) + 1):
            standing = track(constraint.tokens, constraint.lengths, kind, torch.tensor([tokens[:t]]), met, start)
            met, start = standing.met, standing.start
        assert bool(met.all()) is expected


def test_ranking_puts_outputs_with_phrases_in_order_first_only_when_ordered():
    from nmt_cli.decode.constraints import rank_complete_first
    from nmt_cli.decode.search import Hypothesis

    def hyp(*tokens: int) -> Hypothesis:
        return Hypothesis([*tokens, EOS_ID], -1.0, [-0.5] * (len(tokens) + 1))

    hyps = [hyp(C, B, A), hyp(D, D), hyp(A, D, C)]  # phrases out of order, missing, in order
    for ordered, expected in ((True, [2, 0, 1]), (False, [0, 2, 1])):
        phrases = ConstraintSet.from_lists([[[A], [C]]], ordered, CPU)
        ranked = rank_complete_first([list(hyps)], phrases)[0]
        assert [hyps.index(h) for h in ranked] == expected


# --- prefixes ---------------------------------------------------------------------------


@torch.no_grad()
def naive_greedy_after_prefix(model, source: torch.Tensor, prefix: list[int], max_len: int) -> tuple[list[int], list[float]]:
    """Teacher forcing of the prefix, then greedy steps each by a whole forward pass."""
    tokens: list[int] = []
    scores: list[float] = []
    while True:
        prev = torch.tensor([[EOS_ID] + tokens])
        lprobs = torch.log_softmax(model(source, prev)[0, -1].double(), dim=-1)
        lprobs[PAD_ID] = -math.inf
        if len(tokens) < len(prefix):
            token = prefix[len(tokens)]
        elif len(tokens) >= max_len:
            token = EOS_ID
        else:
            token = int(lprobs.argmax())
        tokens.append(token)
        scores.append(float(lprobs[token]))
        if token == EOS_ID:
            return tokens, scores


def test_prefix_decoding_equals_teacher_forced_prefix_then_greedy_search():
    model = eos_prone(tiny_model(seed=1), alpha=3.0)
    source = source_batch([6, 5, 8], vocab=23, seed=2)
    prefixes = [[5, 6, 7], [9], [4, 4, 10, 11, 12]]
    cfg = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3)
    prefix_tokens = torch.full((3, 5), PAD_ID)
    for i, p in enumerate(prefixes):
        prefix_tokens[i, : len(p)] = torch.tensor(p)
    out = generate(model, source, cfg, 64, prefix_tokens=prefix_tokens)
    for i, p in enumerate(prefixes):
        row = source[i : i + 1, : int(source[i].ne(PAD_ID).sum())]
        max_len = max(int(row.size(1) * cfg.max_len_a + cfg.max_len_b), len(p))
        tokens, scores = naive_greedy_after_prefix(model, row, p, max_len)
        assert out[i][0].tokens == tokens
        assert out[i][0].positional_scores == pytest.approx(scores, abs=1e-6)


def test_prefix_with_beams_starts_every_hypothesis():
    model = tiny_model(seed=2)
    source = source_batch([5, 7], vocab=23, seed=3)
    prefix = torch.tensor([[6, 7], [8, PAD_ID]])
    out = generate(model, source, DecodeConfig(beam=4, nbest=4, max_len_b=6), 64, prefix_tokens=prefix)
    assert all(h.tokens[:2] == [6, 7] for h in out[0]) and all(h.tokens[:1] == [8] for h in out[1])
    assert len(out[0]) == 4 and len({tuple(h.tokens) for h in out[0]}) == 4


# --- scoring given translations ---------------------------------------------------------


def test_token_log_probs_equal_summed_teacher_forcing_one_sentence_at_a_time():
    model = tiny_model(seed=4)
    source = source_batch([6, 3, 8], vocab=23, seed=5)
    targets = [[5, 6, 7, EOS_ID], [9, EOS_ID], [4, 10, 11, 12, 13, EOS_ID]]
    padded = torch.full((3, 6), PAD_ID)
    for i, t in enumerate(targets):
        padded[i, : len(t)] = torch.tensor(t)
    batched = token_log_probs([model], source, padded)
    assert torch.allclose(batched, token_log_probs([model, model], source, padded))  # one model twice: itself
    for i, t in enumerate(targets):
        row = source[i : i + 1, : int(source[i].ne(PAD_ID).sum())]
        # Incremental decoding, the search's own path, one token at a time.
        encoder_out, cache = model.encode(row), model.new_cache()
        expected = []
        for j, token in enumerate(t):
            lprobs = model.decode_step(torch.tensor([[EOS_ID] + t[:j]]), encoder_out, cache)
            expected.append(float(lprobs[0, token]))
        assert batched[i, : len(t)].tolist() == pytest.approx(expected, abs=1e-6)
        assert batched[i, len(t) :].eq(0).all()


# --- alignments -------------------------------------------------------------------------


class OneHotEncoder(nn.Module):
    """An encoder whose output at a position is the one-hot vector of its token."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, src_tokens: torch.Tensor) -> EncoderOut:
        return EncoderOut(nn.functional.one_hot(src_tokens, self.dim).double(), src_tokens.eq(PAD_ID))


def hand_set_attention_model() -> nn.Module:
    """A model whose decoder layer 0 attends from the position after target token v to the
    source position holding token v (after `</s>`, the BOS: to token 5): the decoder's
    embedding of v is a spike on dimension v, its query projection the identity and the
    keys (of one-hot encoder outputs) the identity scaled up; self-attention adds nothing."""
    model = tiny_model(seed=0, normalize_before=True)
    dim = model.decoder.embed_tokens.embedding_dim
    model.encoder = OneHotEncoder(dim)
    with torch.no_grad():
        embed = model.decoder.embed_tokens.weight
        embed.zero_()
        for v in range(4, embed.size(0)):
            embed[v, v % dim] = 10.0
        embed[EOS_ID, 5] = 10.0
        layer = model.decoder.layers[0]
        layer.self_attn.out_proj.weight.zero_()
        layer.self_attn.out_proj.bias.zero_()
        attn = layer.encoder_attn
        attn.q_proj.weight.copy_(torch.eye(dim))
        attn.q_proj.bias.zero_()
        attn.kv_proj.weight[:dim].copy_(torch.eye(dim) * 10.0)
        attn.kv_proj.bias.zero_()
    return model


def test_alignment_of_a_hand_set_attention_pattern_gives_the_known_pairs():
    model = hand_set_attention_model()
    source = torch.tensor([[5, 9, 7, 12, EOS_ID], [12, 5, EOS_ID, PAD_ID, PAD_ID]])
    targets = [[9, 12, 7, 5, EOS_ID], [12, 12, 5, EOS_ID]]
    positions = hard_alignment([model], source, targets, layer=0)
    # Target t attends to where its previous token (BOS: 5) sits in the source.
    assert positions == [[0, 1, 3, 2], [1, 0, 0]]
    alone = [hard_alignment([model], source[i : i + 1, : int(source[i].ne(PAD_ID).sum())], [t], 0)[0]
             for i, t in enumerate(targets)]
    assert alone == positions
    # Pieces to words: source "▁a ▁bc d ▁e" (words 0 1 1 2), target "▁x y ▁z ▁w" (0 0 1 2).
    bpe = BpeModel.__new__(BpeModel)
    source_words = word_indices([WORD_START + "a", WORD_START + "b", "c", WORD_START + "e"], bpe)
    target_words = word_indices([WORD_START + "x", "y", WORD_START + "z", WORD_START + "w"], bpe)
    assert source_words == [0, 1, 1, 2] and target_words == [0, 0, 1, 2]
    assert word_alignment(positions[0], source_words, target_words) == [(0, 0), (1, 0), (2, 1), (1, 2)]


# --- the command line -------------------------------------------------------------------


def pieces_of(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines()]


def test_cli_prefix_constraints_and_alignment(run_dir, tmp_path):
    path = str(run_dir / "checkpoint_best.pt")
    sources = ["the dog runs", "", "a red ball over green grass", "schön мир"]
    (tmp_path / "prefix.txt").write_text("the\n\n\nмир\n", encoding="utf-8")
    result = nmt("--path", path, *FAST, "--output-format", "bpe", "--prefix-file", str(tmp_path / "prefix.txt"),
                 input="\n".join(sources) + "\n")
    lines = pieces_of(result.output)
    assert result.exit_code == 0 and len(result.output.splitlines()) == 4 and lines[1] == []
    assert lines[0][0] == WORD_START + "the" and "".join(lines[3]).startswith(WORD_START + "мир")
    constrained = "the dog runs\tgrass\nsix\n\na red ball\tdog\tschön\n"
    result = nmt("--path", path, *FAST, "--output-format", "bpe", "--constraints", "unordered", input=constrained)
    lines = pieces_of(result.output)
    assert len(lines) == 4 and lines[2] == []
    assert WORD_START + "grass" in "".join(lines[0])
    assert WORD_START + "dog" in "".join(lines[3]) and "schön" in "".join(lines[3])
    jsonl = [json.dumps({"text": "the dog runs", "constraints": ["ball"], "prefix": "the"}), "",
             json.dumps({"text": "green grass"})]
    result = nmt("--path", path, *FAST, "--json-input", "--output-format", "jsonl", "--print-alignment",
                 input="\n".join(jsonl) + "\n")
    records = [json.loads(line) for line in result.output.splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3]
    assert records[0]["tokens"][0] == WORD_START + "the" and "ball" in records[0]["hyp"]
    assert records[1]["alignment"] == [] and records[1]["hyp"] == ""
    for record in (records[0], records[2]):
        assert record["alignment"] and all(isinstance(s, int) and isinstance(t, int) for s, t in record["alignment"])
    text = nmt("--path", path, *FAST, "--print-alignment", input="the dog runs\n").output
    hyp, pairs = text.rstrip("\n").split("\t")
    assert all(len(p.split("-")) == 2 for p in pairs.split())


def test_cli_score_reference_equals_summed_teacher_forced_log_probs(run_dir, tmp_path):
    from nmt_cli.data.dictionary import Dictionary
    from nmt_cli.text.pipeline import TextPipeline

    path = str(run_dir / "checkpoint_best.pt")
    # A blank line stays blank; a reference of an empty source is scored against </s> alone.
    pairs = [("the dog runs", "the dog runs"), ("", ""), ("a red ball", "green grass over мир"), ("schön", ""),
             ("", "the dog")]
    result = nmt("--path", path, *FAST, "--score-reference", input="".join(f"{s}\t{t}\n" for s, t in pairs))
    lines = result.output.splitlines()
    assert result.exit_code == 0 and len(lines) == 5 and lines[1] == ""
    model = load(run_dir)
    dictionary = Dictionary.load(run_dir / "dict.en.txt")
    en, de = TextPipeline.from_data_bin(run_dir, "en"), TextPipeline.from_data_bin(run_dir, "de")
    for (source, target), line in zip(pairs, lines):
        if not source and not target:
            continue
        src_ids = torch.tensor([dictionary.encode(en.encode(source))])
        assert src_ids[0, -1] == EOS_ID
        tgt_ids = dictionary.encode(de.encode(target))
        with torch.no_grad():
            logits = model(src_ids, torch.tensor([[EOS_ID] + tgt_ids[:-1]]))[0]
        expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tgt_ids).unsqueeze(1)).squeeze(1)
        total, per_token = line.split("\t")
        assert float(total) == pytest.approx(float(expected.sum()), abs=1e-4)
        assert [float(x) for x in per_token.split()] == pytest.approx(expected.tolist(), abs=1e-4)
    (tmp_path / "ref.txt").write_text("the dog runs\n", encoding="utf-8")
    alone = nmt("--path", path, *FAST, "--score-reference", "--reference-file", str(tmp_path / "ref.txt"),
                input="the dog runs\n")
    assert alone.output.splitlines() == lines[:1]


@pytest.mark.parametrize("args, text, message", [
    (("--score-reference",), "a\tb\tc\n", "expected source<TAB>reference (2 fields), got 3 at <stdin>:1"),
    (("--json-input",), "the dog\n", "--json-input: not JSON"),
    (("--json-input",), '{"text": "a", "constraints": "b"}\n', "\"constraints\" must be a list of strings at <stdin>:1"),
    (("--json-input",), '["a"]\n', "expected an object with a \"text\" string at <stdin>:1"),
    (("--score-reference", "--constraints", "ordered"), "a\tb\n", "--score-reference scores given translations"),
    # Its scores are those of search without these (README: the same as the search's of that output).
    (("--score-reference", "--temperature", "0.5"), "a\tb\n",
     "error: --score-reference scores with the model's own probabilities: drop --temperature\n"),
    (("--score-reference", "--unk-penalty", "2"), "a\tb\n",
     "error: --score-reference scores with the model's own probabilities: drop --unk-penalty\n"),
    (("--score-reference", "--sampling"), "a\tb\n",
     "error: --score-reference scores with the model's own probabilities: drop --sampling\n"),
])
def test_bad_guided_input_is_one_error_line(run_dir, args, text, message):
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, *args, input=text)
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output


def test_prefix_file_with_fewer_lines_is_an_error(run_dir, tmp_path):
    (tmp_path / "p.txt").write_text("the\n", encoding="utf-8")
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--prefix-file", str(tmp_path / "p.txt"),
                 input="the dog\na ball\n")
    assert result.exit_code != 0 and "has 1 lines but the input has more (line 2)" in result.output


def test_guided_search_on_the_reference_model_equals_the_fast_one():
    from tests.test_fast_decoding import assert_same_hypotheses, model_pair

    reference, fast = model_pair(41, torch.float64)
    source = source_batch([2, 11, 4, 8, 6, 3, 9], vocab=23, seed=42)
    rng = random.Random(3)
    phrases = [[[rng.randrange(4, 29) for _ in range(rng.randint(1, 2))]] for _ in range(7)]
    prefix = torch.tensor([[rng.randrange(4, 29), PAD_ID] if i % 2 else [rng.randrange(4, 29)] * 2 for i in range(7)])
    cfg = DecodeConfig(beam=4, nbest=4, max_len_a=1.0, max_len_b=6)
    for ordered in (False, True):
        runs = [generate(m, source, cfg, 1024, prefix_tokens=prefix,
                         constraints=ConstraintSet.from_lists(phrases, ordered, CPU)) for m in (reference, fast)]
        assert_same_hypotheses(runs[1], runs[0], abs_tol=1e-9)


def test_phrase_progress_follows_self_overlapping_phrases():
    from nmt_cli.decode.constraints import track

    phrase = torch.tensor([[[5, 5, 6]]])  # (N=1, M=1, W=3)
    lengths = torch.tensor([[3]])
    met, start = torch.zeros(1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.long)
    history: list[int] = []
    standings = []
    for token in [5, 5, 5, 6]:  # "5 5 5" keeps two tokens of "5 5 6" matched; then 6 completes it
        history.append(token)
        standing = track(phrase, lengths, False, torch.tensor([history]), met, start)
        met, start = standing.met, standing.start
        standings.append((int(standing.progress[0, 0]), bool(met[0, 0])))
    assert standings == [(1, False), (2, False), (2, False), (0, True)]


def test_replace_unk_copies_the_whole_aligned_source_word():
    from nmt_cli.decode.guided import replace_unknowns
    from nmt_cli.text.pipeline import TextPipeline
    from nmt_cli.text.subword_nmt import SubwordNmtBpe
    from nmt_cli.text.tokenizer import TokenizerSettings

    # A sentencepiece segmenter as word_indices sees it; its pieces join by their word marks.
    bpe = BpeModel.__new__(BpeModel)
    bpe.decode = lambda pieces: "".join(pieces).replace(WORD_START, " ").strip()
    source = [WORD_START + "Zeit", WORD_START + "Gold", "schmied", "es", WORD_START, "🐕"]
    target = [WORD_START + "the", "<unk>", WORD_START + "is", "<unk>", "chen", "<unk>"]
    copies = replace_unknowns(target, source, [1, 3, 0, 0, 0, 5], bpe, "<unk>")
    assert copies == {1: "Goldschmiedes", 3: "Zeit", 5: "🐕"}
    # Each copy is a word of its own, in the text and in the alignment's target words.
    pipeline = TextPipeline(TokenizerSettings(name="none"), bpe=bpe)
    assert pipeline.decode([copies.get(i, p) for i, p in enumerate(target)], copies) == "the Goldschmiedes is Zeit chen 🐕"
    assert word_indices(target, bpe, copies) == [0, 1, 2, 3, 4, 5]
    # subword-nmt: the word's pieces lose their separators; a piece before a copy ends its word.
    subword = SubwordNmtBpe({})
    source = ["Gold@@", "schmied@@", "es", "Zeit"]
    target = ["the", "Hund@@", "<unk>", "is"]
    copies = replace_unknowns(target, source, [3, 0, 1, 3], subword, "<unk>")
    assert copies == {2: "Goldschmiedes"}
    pipeline = TextPipeline(TokenizerSettings(name="none"), bpe=subword)
    assert pipeline.decode([copies.get(i, p) for i, p in enumerate(target)], copies) == "the Hund Goldschmiedes is"
    assert word_indices(target, subword, copies) == [0, 1, 2, 3]


@pytest.mark.parametrize("word", ["Zyxwvut", "🐕"])  # a word of several pieces; one that sentencepiece lacks
def test_cli_replace_unk_prints_the_source_word_as_a_word(run_dir, word):
    path = str(run_dir / "checkpoint_best.pt")
    # Rewarding <unk> makes every output token one; a one-word source aligns each to that word.
    args = ("--path", path, *FAST, "--beam", "1", "--unk-penalty", "-15", "--replace-unk")
    text = nmt(*args, input=f"{word}\n{word} {word}\n")
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert len(lines) == 2 and lines[0].split() and set(" ".join(lines).split(" ")) == {word}
    bpe = nmt(*args, "--output-format", "bpe", input=f"{word}\n")
    assert bpe.output.split() == [WORD_START + word] * len(lines[0].split())
    jsonl = nmt(*args, "--output-format", "jsonl", "--print-alignment", input=f"{word}\n")
    record = json.loads(jsonl.output)
    assert record["hyp"] == lines[0] and set(record["tokens"]) == {"<unk>", "</s>"}
    assert record["alignment"] == [[0, t] for t in range(len(lines[0].split()))]


def test_the_guided_decoding_benchmark_times_every_feature_against_plain_search(run_dir, tmp_path):
    """benchmarks/guided_decoding.py on the tiny run, its copy task's sources as their own references."""
    text = tmp_path / "test.txt"
    text.write_text("".join(s + "\n" for s in generated_sentences(6, seed=16)), encoding="utf-8")
    lines = run_benchmark("guided_decoding.py", str(run_dir / "checkpoint_best.pt"), str(text), str(text),
                          "--sentences", "6", "--repeats", "1", "--max-len-a", "1", "--max-len-b", "5")
    rows = {line.split("\t")[0]: line.split("\t") for line in lines if "\t" in line}
    assert list(rows) == ["plain beam search", "prefix (2 words)", "1 constraint", "2 constraints",
                          "--print-alignment", "--score-reference"]
    assert rows["plain beam search"][3] == "1.00x plain time"
    for name in ("1 constraint", "2 constraints"):  # constrained search puts every phrase in its output
        assert rows[name][4] == "phrases in output: 6/6"


def test_cli_ids_source_of_only_eos_is_a_blank_line(run_dir):
    args = ("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--input-format", "ids")
    for guide in (("--print-alignment",), ("--replace-unk", "--unk-penalty", "-15"), ()):
        result = nmt(*args, *guide, input="2\n\n")
        assert result.exit_code == 0 and result.output == nmt(*args, *guide, input="\n\n").output == "\n\n"
    # A final </s> is the one the source gets anyway.
    with_eos = nmt(*args, "--output-format", "bpe", input="5 6 2\n")
    assert with_eos.output == nmt(*args, "--output-format", "bpe", input="5 6\n").output


@pytest.mark.parametrize("source, symbol", [("5 2 6", "</s> but as its last token"), ("5 1 6", "<pad>"),
                                            ("0 5", "<s>")])
def test_cli_ids_source_with_special_ids_is_one_error_line(run_dir, source, symbol):
    """(In bpe input these are text, read as <unk> as in training data: test_translate.py.)"""
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--input-format", "ids", "--print-alignment",
                 input=f"5\n{source}\n")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.splitlines()[-1] == f"error: the source may not hold {symbol} at <stdin>:2"


@pytest.mark.parametrize("guide, symbol", [("5 2 6", "</s>"), ("5 2", "</s>"), ("1 5", "<pad>"), ("0", "<s>")])
@pytest.mark.parametrize("kind", ["prefix", "constraint"])
def test_cli_ids_prefix_or_constraint_with_special_ids_is_one_error_line(run_dir, tmp_path, guide, symbol, kind):
    source = "5 6"
    args = ["--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--input-format", "ids"]
    if kind == "prefix":
        (tmp_path / "prefix.txt").write_text(f"\n{guide}\n", encoding="utf-8")
        args += ["--prefix-file", str(tmp_path / "prefix.txt")]
        text = f"{source}\n{source}\n"
    else:
        args += ["--constraints", "ordered"]
        text = f"{source}\n{source}\t{guide}\n"
    result = nmt(*args, input=text)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.splitlines()[-1] == f"error: a {kind} may not hold {symbol} at <stdin>:2"


@pytest.mark.parametrize("kind", ["prefix", "constraint"])
def test_cli_bpe_prefix_or_constraint_spelling_a_special_takes_it_as_unk(run_dir, tmp_path, kind):
    """Text, as in training data: `</s>` in a prefix ended the output there, `<pad>` was dropped."""
    args = ["--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--input-format", "bpe", "--output-format", "bpe"]
    guide = "▁the </s> <pad> ▁dog"
    if kind == "prefix":
        (tmp_path / "prefix.txt").write_text(f"{guide}\n", encoding="utf-8")
        args += ["--prefix-file", str(tmp_path / "prefix.txt")]
        text = "▁the ▁dog\n"
    else:
        args += ["--constraints", "ordered"]
        text = f"▁the ▁dog\t{guide}\n"
    result = nmt(*args, input=text)
    assert result.exit_code == 0, result.output
    assert "▁the <unk> <unk> ▁dog" in result.output and (kind != "prefix" or result.output.startswith("▁the <unk>"))


def test_cli_constraints_longer_than_the_target_positions_are_one_error_line(run_dir):
    args = ("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--input-format", "bpe", "--constraints", "ordered")
    # The tiny model has 64 target positions: 63 phrase tokens and </s> fit, 64 do not.
    fits = nmt(*args, "--beam", "1", input="▁the ▁dog\t" + " ".join(["▁dog"] * 40) + "\t" + " ".join(["▁the"] * 23) + "\n")
    assert fits.exit_code == 0 and fits.output.count("dog") >= 40
    result = nmt(*args, input="▁the ▁dog\t" + " ".join(["▁dog"] * 40) + "\t" + " ".join(["▁the"] * 24) + "\n")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.splitlines()[-1] == ("error: constraints of 64 tokens do not fit the model's 64 target "
                                              "positions at <stdin>:1")


@pytest.mark.parametrize("record, key", [
    ('{"text": "the \\ud800 dog"}', "text"), ('{"text": "the dog", "prefix": "\\udc15"}', "prefix"),
    ('{"text": "the dog", "constraints": ["dog", "a\\ud800"]}', "constraints"),
    ('{"text": "the dog", "reference": "\\ud800"}', "reference"),
])
def test_cli_json_input_with_a_lone_surrogate_is_one_error_line(run_dir, record, key):
    args = ("--score-reference",) if key == "reference" else ()
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--json-input", *args,
                 input='{"text": "the \\ud83d\\udc15 dog", "reference": "the"}\n' + record + "\n")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.splitlines()[-1] == (f'error: --json-input: "{key}" holds a lone surrogate escape (not text) '
                                              "at <stdin>:2")


def test_cli_json_constraints_with_sampling_name_their_line(run_dir):
    lines = '{"text": "the dog"}\n{"text": "the ball", "constraints": ["dog"]}\n'
    for buffer in ("1", "10"):  # line 1 is translated and written first where it is a chunk of its own
        result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--json-input", "--sampling",
                     "--buffer-size", buffer, input=lines)
        assert result.exit_code != 0 and "Traceback" not in result.output
        assert result.output.splitlines()[-1] == "error: constraints need beam search, not --sampling, at <stdin>:2"
        assert len(result.stdout.splitlines()) == (1 if buffer == "1" else 0)
