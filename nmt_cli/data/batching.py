"""Token-budget batches over length-sorted pairs, shuffled per epoch, sharded per rank.

Everything here is a pure function of the sentence sizes, the seed and the epoch, so
that every rank computes the same plan without talking to the others, and a resumed
run finds its place again from `(epoch, batches_done)` alone.

The plan follows fairseq: sort by source length then target length (ties broken by a
seeded permutation), cut batches whose *padded* size `batch_size * max(src_len,
tgt_len)` stays within `max_tokens`, then shuffle the order of whole batches each epoch.
One update consumes `update_freq * world_size` consecutive batches of that order; rank r
takes the r-th block of `update_freq` of them.
"""

from __future__ import annotations

import numpy as np

from nmt_cli.errors import NmtError


# Pairs handled at a time by the sorts and scans below: their int64 temporaries stay a few
# MiB whatever the corpus; the full-length arrays are int32 indices and compact sizes.
CHUNK = 1 << 18


def index_dtype(count: int) -> np.dtype:
    """The smallest signed type that indexes `count` pairs (int32 below 2**31)."""
    return np.dtype(np.int32) if count < 2**31 else np.dtype(np.int64)


def filter_by_size(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    max_source_positions: int,
    max_target_positions: int,
) -> tuple[np.ndarray, int]:
    """Indices of the pairs that fit the model's positions, and how many were skipped.

    Empty sentences (size 0, i.e. not even `</s>`) are skipped too: they carry no signal.
    The indices are int32 for fewer than 2**31 pairs (4 bytes a pair, not 8).
    """
    count = len(src_sizes)
    keep = np.empty(count, dtype=bool)
    for start in range(0, count, CHUNK):
        src, tgt = src_sizes[start : start + CHUNK], tgt_sizes[start : start + CHUNK]
        keep[start : start + CHUNK] = (src <= max_source_positions) & (tgt <= max_target_positions) & (src > 0) & (tgt > 0)
    indices = np.empty(int(np.count_nonzero(keep)), dtype=index_dtype(count))
    filled = 0
    for start in range(0, count, CHUNK):
        found = np.flatnonzero(keep[start : start + CHUNK]) + start
        indices[filled : filled + len(found)] = found
        filled += len(found)
    return indices, int(count - len(indices))


def stable_sort_by(order: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`order` stably sorted by `sizes[order]` (a counting sort by chunks).

    The same result as `order[np.argsort(sizes[order], kind="stable")]`, without that
    expression's full-length int64 temporaries: each chunk is sorted on its own and its
    pairs are placed after those of earlier chunks with the same size.
    """
    if len(order) <= CHUNK:
        return order[np.argsort(sizes[order], kind="stable")]
    num_keys = int(sizes.max()) + 1
    counts = np.zeros(num_keys, dtype=np.int64)
    for start in range(0, len(order), CHUNK):
        counts += np.bincount(sizes[order[start : start + CHUNK]], minlength=num_keys)
    next_slot = np.cumsum(counts) - counts  # where the next pair of each size goes
    out = np.empty_like(order)
    for start in range(0, len(order), CHUNK):
        chunk = order[start : start + CHUNK]
        keys = sizes[chunk]
        within = np.argsort(keys, kind="stable")
        sorted_keys = keys[within]
        chunk_counts = np.bincount(sorted_keys, minlength=num_keys)
        rank = np.arange(len(chunk)) - (np.cumsum(chunk_counts) - chunk_counts)[sorted_keys]
        out[next_slot[sorted_keys] + rank] = chunk[within]
        next_slot += chunk_counts
    return out


def ordered_indices(src_sizes: np.ndarray, tgt_sizes: np.ndarray, indices: np.ndarray, seed: int) -> np.ndarray:
    """`indices` sorted by (source length, target length), ties in a seeded random order."""
    rng = np.random.default_rng(seed)
    # The values of rng.permutation(len(indices)) (arange, then the same shuffle), at 4 bytes an entry.
    permutation = np.arange(len(indices), dtype=index_dtype(len(indices)))
    rng.shuffle(permutation)
    order = np.asarray(indices)[permutation].astype(index_dtype(len(src_sizes)), copy=False)
    del permutation
    # Stable sorts, least significant key first.
    order = stable_sort_by(order, tgt_sizes)
    return stable_sort_by(order, src_sizes)


def make_batches(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    max_tokens: int | None,
    max_sentences: int | None = None,
    required_batch_size_multiple: int = 1,
    seed: int = 1,
    indices: np.ndarray | None = None,
    split: str = "training",
) -> list[np.ndarray]:
    """Cut length-sorted pairs into batches (arrays of pair indices).

    A batch's padded size, `len(batch) * max(src_len, tgt_len)` over its pairs, stays
    within `max_tokens`; it holds at most `max_sentences` pairs; batch sizes are rounded
    down to a multiple of `required_batch_size_multiple` when larger than it (the
    remainder starts the next batch). `indices` restricts the plan to those pairs
    (e.g. the output of `filter_by_size`); default: all pairs. The batches are views of
    one int32 array (int64 from 2**31 pairs on). `split` names the pairs in the error of
    one too long for `max_tokens`.
    """
    if max_tokens is None and max_sentences is None:
        raise NmtError("set --max-tokens or --batch-size (or both)")
    src_sizes, tgt_sizes = np.asarray(src_sizes), np.asarray(tgt_sizes)
    if indices is None:
        indices = np.arange(len(src_sizes), dtype=index_dtype(len(src_sizes)))
    order = ordered_indices(src_sizes, tgt_sizes, indices, seed)
    max_tokens = max_tokens or 1 << 62
    max_sentences = max_sentences or 1 << 62
    multiple = max(1, required_batch_size_multiple)

    batches: list[np.ndarray] = []
    start, longest = 0, 0  # the open batch is order[start:i]
    for first in range(0, len(order), CHUNK):  # a chunk of lengths at a time, not a list of all
        pairs = order[first : first + CHUNK]
        num_tokens = np.maximum(src_sizes[pairs], tgt_sizes[pairs]).tolist()
        for i, length in enumerate(num_tokens, start=first):
            if length > max_tokens:
                raise NmtError(
                    f"{split} pair {int(order[i])} (counting from 0, as fairseq's sentence ids do) has {length} "
                    f"tokens, which do not fit --max-tokens {max_tokens}; raise --max-tokens "
                    "or lower --max-source-positions/--max-target-positions"
                )
            # Close the open batch at a multiple of `multiple`; the rest carries over, and
            # is closed in turn if it still cannot take pair i.
            while i > start and (i - start == max_sentences or (i - start + 1) * max(longest, length) > max_tokens):
                size = i - start
                keep = max(multiple * (size // multiple), size % multiple)
                batches.append(order[start : start + keep])
                start += keep
                longest = _longest(src_sizes, tgt_sizes, order[start:i])
            longest = max(longest, length)
    if start < len(order):
        batches.append(order[start:])
    return batches


def _longest(src_sizes: np.ndarray, tgt_sizes: np.ndarray, pairs: np.ndarray) -> int:
    """max(src_len, tgt_len) over `pairs` (0 for none)."""
    if len(pairs) == 0:
        return 0
    return int(max(src_sizes[pairs].max(), tgt_sizes[pairs].max()))


def epoch_batches(batches: list[np.ndarray], epoch: int, seed: int) -> list[np.ndarray]:
    """The order of whole batches in `epoch`: a permutation fixed by (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    return [batches[i] for i in rng.permutation(len(batches))]


def check_update_freq(update_freq: int, world_size: int, num_batches: int) -> None:
    """NmtError unless an update's batches fit in one epoch: beyond that, every update
    but the first would run passes of weight 0 (the epoch's batches are used up)."""
    if update_freq * world_size > num_batches:
        most = max(num_batches // world_size, 1)
        ranks = f" on each of {world_size} processes" if world_size > 1 else ""
        raise NmtError(f"--update-freq {update_freq} asks for {update_freq} batches{ranks} per update, more than "
                       f"the {num_batches} batches of an epoch of the train split; use at most {most} "
                       "(or smaller batches: --max-tokens, --batch-size)")


def rank_share(
    epoch_order: list[np.ndarray],
    batches_done: int,
    update_freq: int,
    world_size: int,
    rank: int,
) -> list[np.ndarray]:
    """The batches rank `rank` runs in the update starting after `batches_done` batches.

    The update takes the next `update_freq * world_size` batches of the epoch (fewer at
    the end of the epoch); rank r takes block r of `update_freq` consecutive ones. The
    list may be shorter than `update_freq`, even empty, in the epoch's last update.
    """
    group = epoch_order[batches_done : batches_done + update_freq * world_size]
    return group[rank * update_freq : (rank + 1) * update_freq]
