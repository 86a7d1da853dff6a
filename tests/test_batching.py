"""Batching: coverage, token budgets, determinism, sharding, and the padded collater."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from databin_utils import reversal_data_bin

from nmt_cli.data import batching
from nmt_cli.data.batching import (
    epoch_batches,
    filter_by_size,
    make_batches,
    rank_share,
)
from nmt_cli.data.dictionary import EOS_ID, PAD_ID
from nmt_cli.data.indexed import sentence_sizes
from nmt_cli.data.pairs import collate, load_data_bin
from nmt_cli.errors import NmtError


def random_sizes(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 60, n), rng.integers(1, 60, n)


def padded_size(batch: np.ndarray, src: np.ndarray, tgt: np.ndarray) -> int:
    return len(batch) * int(max(src[batch].max(), tgt[batch].max()))


@pytest.mark.parametrize("multiple", [1, 8])
def test_every_pair_once_and_budget_respected(multiple: int) -> None:
    src, tgt = random_sizes(2000)
    batches = make_batches(src, tgt, max_tokens=500, required_batch_size_multiple=multiple, seed=3)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(2000))
    assert all(padded_size(b, src, tgt) <= 500 for b in batches)
    if multiple > 1:
        # All but the last batch of a run of equal lengths are multiples; most batches are.
        assert np.mean([len(b) % multiple == 0 for b in batches]) > 0.8


def test_batch_size_cap_and_sorted_lengths() -> None:
    src, tgt = random_sizes(1000)
    batches = make_batches(src, tgt, max_tokens=100_000, max_sentences=16, seed=1)
    assert max(len(b) for b in batches) == 16
    # Batches are cut from source-length-sorted order: lengths never decrease across them.
    firsts = [int(src[b].min()) for b in batches]
    lasts = [int(src[b].max()) for b in batches]
    assert all(lasts[i] <= firsts[i + 1] for i in range(len(batches) - 1))


def test_padding_is_small() -> None:
    src, tgt = random_sizes(3000)
    batches = make_batches(src, tgt, max_tokens=2000, seed=1)
    real = sum(int(src[b].sum()) for b in batches)
    padded = sum(len(b) * int(src[b].max()) for b in batches)
    assert real / padded > 0.9


def test_ties_broken_by_seed() -> None:
    src = tgt = np.full(100, 5)
    a = make_batches(src, tgt, max_tokens=50, seed=1)
    b = make_batches(src, tgt, max_tokens=50, seed=1)
    c = make_batches(src, tgt, max_tokens=50, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_epoch_order_deterministic_and_shuffled() -> None:
    src, tgt = random_sizes(500)
    batches = make_batches(src, tgt, max_tokens=300, seed=1)
    e1, e1_again, e2 = epoch_batches(batches, 1, 7), epoch_batches(batches, 1, 7), epoch_batches(batches, 2, 7)
    assert all(np.array_equal(x, y) for x, y in zip(e1, e1_again))
    assert [x.tolist() for x in e1] != [x.tolist() for x in e2]
    assert sorted(np.concatenate(e2).tolist()) == list(range(500))


def test_filter_by_size_counts_skipped() -> None:
    src = np.array([3, 10, 4, 0, 7])
    tgt = np.array([3, 4, 12, 2, 7])
    kept, skipped = filter_by_size(src, tgt, max_source_positions=8, max_target_positions=8)
    assert kept.tolist() == [0, 4] and skipped == 3
    batches = make_batches(src, tgt, max_tokens=100, indices=kept)
    assert sorted(np.concatenate(batches).tolist()) == [0, 4]


def test_pair_longer_than_budget_is_an_error() -> None:
    with pytest.raises(NmtError, match=r"^train pair 1 \(counting from 0.*\) has 50 tokens, which do not fit --max-tokens 20;"):
        make_batches(np.array([3, 50, 4]), np.array([3, 4, 2]), max_tokens=20, split="train")


@pytest.mark.parametrize("world_size,update_freq", [(1, 1), (2, 1), (2, 3), (3, 2)])
def test_shards_disjoint_and_covering(world_size: int, update_freq: int) -> None:
    src, tgt = random_sizes(700)
    order = epoch_batches(make_batches(src, tgt, max_tokens=400, seed=1), 1, 1)
    per_update = world_size * update_freq
    seen: list[int] = []
    for update in range(-(-len(order) // per_update)):  # the epoch's last update may take fewer batches
        shares = [rank_share(order, update * per_update, update_freq, world_size, r) for r in range(world_size)]
        assert all(len(s) <= update_freq for s in shares)
        for share in shares:
            seen.extend(np.concatenate(share).tolist() if share else [])
    assert sorted(seen) == list(range(700))


def test_collate_shifts_target_right(tmp_path) -> None:
    data = load_data_bin(reversal_data_bin(tmp_path / "bin", train=20, valid=5)).split("train")
    indices = np.array([0, 3, 7])
    batch = collate(data, indices)
    B, T = batch.target.shape
    assert (B, batch.nsentences) == (3, 3)
    assert batch.ntokens == int(data.tgt_sizes[indices].sum()) == int((batch.target != PAD_ID).sum())
    for row, i in enumerate(indices):
        src, tgt = data.src[int(i)], data.tgt[int(i)]
        assert batch.src_tokens[row, : len(src)].tolist() == src.tolist()
        assert (batch.src_tokens[row, len(src) :] == PAD_ID).all()
        assert batch.target[row, : len(tgt)].tolist() == tgt.tolist() and tgt[-1] == EOS_ID
        assert batch.prev_output_tokens[row, : len(tgt)].tolist() == [EOS_ID] + tgt[:-1].tolist()
        assert (batch.prev_output_tokens[row, len(tgt) :] == PAD_ID).all()
    assert batch.src_tokens.dtype == torch.int64


def test_collate_says_whether_any_source_row_is_padded(tmp_path) -> None:
    data = load_data_bin(reversal_data_bin(tmp_path / "bin", train=40, valid=5)).split("train")
    by_length: dict[int, list[int]] = {}
    for i, size in enumerate(data.src_sizes.tolist()):
        by_length.setdefault(size, []).append(i)
    same = next(group for group in by_length.values() if len(group) >= 2)
    short, long = min(by_length), max(by_length)
    assert not collate(data, np.array(same)).src_padded
    assert not collate(data, np.array(same)).to(torch.device("cpu")).src_padded  # `to` keeps it
    assert not collate(data, np.array(same[:1])).src_padded
    mixed = collate(data, np.array([by_length[long][0], by_length[short][0]]))
    assert mixed.src_padded and (mixed.src_tokens == PAD_ID).any()


def test_data_bin_errors(tmp_path) -> None:
    path = reversal_data_bin(tmp_path / "bin", train=10, valid=5)
    with pytest.raises(NmtError, match="'test' split"):
        load_data_bin(path).split("test")
    with pytest.raises(NmtError, match="no language 'fr'"):
        load_data_bin(path, "src", "fr")
    with pytest.raises(NmtError, match="no meta.json"):
        load_data_bin(tmp_path)


# --- the compact planner against the plain algorithm it replaced ---------------------------


def reference_make_batches(src_sizes, tgt_sizes, max_tokens, max_sentences, multiple, seed, indices):
    """The batch plan as first written: int64 arrays, full-length argsorts, a list of lengths."""
    src_sizes = np.asarray(src_sizes, dtype=np.int64)
    tgt_sizes = np.asarray(tgt_sizes, dtype=np.int64)
    rng = np.random.default_rng(seed)
    order = indices[rng.permutation(len(indices))]
    order = order[np.argsort(tgt_sizes[order], kind="stable")]
    order = order[np.argsort(src_sizes[order], kind="stable")]
    num_tokens = np.maximum(src_sizes[order], tgt_sizes[order]).tolist()
    max_tokens = max_tokens or 1 << 62
    max_sentences = max_sentences or 1 << 62
    batches, start, longest = [], 0, 0
    for i, length in enumerate(num_tokens):
        while i > start and (i - start == max_sentences or (i - start + 1) * max(longest, length) > max_tokens):
            size = i - start
            keep = max(multiple * (size // multiple), size % multiple)
            batches.append(order[start : start + keep])
            start += keep
            longest = max(num_tokens[start:i], default=0)
        longest = max(longest, length)
    if start < len(order):
        batches.append(order[start:])
    return batches


def corpus_sizes(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-pair lengths (words + </s>) of a corpus: generated, or the shared Multi30k training text."""
    if name == "generated":
        rng = np.random.default_rng(5)
        src = np.clip(rng.lognormal(3.2, 0.6, 30_000), 0, 300).astype(np.int64)  # empty and too long ones too
        tgt = np.clip(src * rng.lognormal(0.05, 0.25, 30_000), 0, 300).astype(np.int64)
        return src, tgt
    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
    if not (data / "train.en").is_file():
        pytest.skip("the shared Multi30k corpus is not here")
    sides = [np.array([len(line.split()) + 1 for line in (data / f"train.{lang}").read_text(encoding="utf-8").splitlines()])
             for lang in ("en", "de")]
    return sides[0], sides[1]


@pytest.mark.parametrize("corpus", ["generated", "multi30k"])
@pytest.mark.parametrize("chunk", [batching.CHUNK, 1000])  # 1000: every chunked path runs many times
def test_the_compact_plan_equals_the_plain_algorithm(monkeypatch, corpus: str, chunk: int) -> None:
    monkeypatch.setattr(batching, "CHUNK", chunk)
    src, tgt = corpus_sizes(corpus)
    offsets = lambda sizes: np.concatenate([[0], np.cumsum(sizes)])  # noqa: E731 - as a data-bin stores them
    src16, tgt16 = sentence_sizes(offsets(src)), sentence_sizes(offsets(tgt))
    assert src16.dtype == tgt16.dtype == np.int16 and np.array_equal(src16, src) and np.array_equal(tgt16, tgt)
    kept, skipped = filter_by_size(src16, tgt16, 120, 128)
    expected = np.flatnonzero((src <= 120) & (tgt <= 128) & (src > 0) & (tgt > 0))
    assert kept.dtype == np.int32 and np.array_equal(kept, expected) and skipped == len(src) - len(expected)
    for max_tokens, max_sentences, multiple, seed in [(4096, None, 8, 1), (1000, 50, 1, 7), (None, 64, 8, 3)]:
        new = make_batches(src16, tgt16, max_tokens, max_sentences, multiple, seed, kept)
        old = reference_make_batches(src, tgt, max_tokens, max_sentences, multiple, seed, expected)
        assert len(new) == len(old)
        assert all(a.dtype == np.int32 and np.array_equal(a, b) for a, b in zip(new, old))


def test_sentence_sizes_widen_for_long_sentences() -> None:
    offsets = np.array([0, 3, 3 + 40_000, 3 + 40_000 + 1], dtype=np.int64)
    sizes = sentence_sizes(offsets)
    assert sizes.dtype == np.int32 and sizes.tolist() == [3, 40_000, 1]
    assert sentence_sizes(np.zeros(1, dtype=np.int64)).tolist() == []
