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


def filter_by_size(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    max_source_positions: int,
    max_target_positions: int,
) -> tuple[np.ndarray, int]:
    """Indices of the pairs that fit the model's positions, and how many were skipped.

    Empty sentences (size 0, i.e. not even `</s>`) are skipped too: they carry no signal.
    """
    keep = (src_sizes <= max_source_positions) & (tgt_sizes <= max_target_positions)
    keep &= (src_sizes > 0) & (tgt_sizes > 0)
    indices = np.flatnonzero(keep)
    return indices, int(len(src_sizes) - len(indices))


def ordered_indices(src_sizes: np.ndarray, tgt_sizes: np.ndarray, indices: np.ndarray, seed: int) -> np.ndarray:
    """`indices` sorted by (source length, target length), ties in a seeded random order."""
    rng = np.random.default_rng(seed)
    order = indices[rng.permutation(len(indices))]
    # Stable sorts, least significant key first.
    order = order[np.argsort(tgt_sizes[order], kind="stable")]
    return order[np.argsort(src_sizes[order], kind="stable")]


def make_batches(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    max_tokens: int | None,
    max_sentences: int | None = None,
    required_batch_size_multiple: int = 1,
    seed: int = 1,
    indices: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Cut length-sorted pairs into batches (arrays of pair indices).

    A batch's padded size, `len(batch) * max(src_len, tgt_len)` over its pairs, stays
    within `max_tokens`; it holds at most `max_sentences` pairs; batch sizes are rounded
    down to a multiple of `required_batch_size_multiple` when larger than it (the
    remainder starts the next batch). `indices` restricts the plan to those pairs
    (e.g. the output of `filter_by_size`); default: all pairs.
    """
    if max_tokens is None and max_sentences is None:
        raise NmtError("set --max-tokens or --batch-size (or both)")
    src_sizes = np.asarray(src_sizes, dtype=np.int64)
    tgt_sizes = np.asarray(tgt_sizes, dtype=np.int64)
    if indices is None:
        indices = np.arange(len(src_sizes))
    order = ordered_indices(src_sizes, tgt_sizes, np.asarray(indices, dtype=np.int64), seed)
    num_tokens = np.maximum(src_sizes[order], tgt_sizes[order]).tolist()
    max_tokens = max_tokens or 1 << 62
    max_sentences = max_sentences or 1 << 62
    multiple = max(1, required_batch_size_multiple)

    batches: list[np.ndarray] = []
    start, longest = 0, 0  # the open batch is order[start:i]
    for i, length in enumerate(num_tokens):
        if length > max_tokens:
            raise NmtError(
                f"a pair of {length} tokens does not fit --max-tokens {max_tokens}; raise --max-tokens "
                "or lower --max-source-positions/--max-target-positions"
            )
        # Close the open batch at a multiple of `multiple`; the rest carries over, and
        # is closed in turn if it still cannot take pair i.
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


def epoch_batches(batches: list[np.ndarray], epoch: int, seed: int) -> list[np.ndarray]:
    """The order of whole batches in `epoch`: a permutation fixed by (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    return [batches[i] for i in rng.permutation(len(batches))]


def updates_in_epoch(num_batches: int, update_freq: int, world_size: int) -> int:
    """How many updates one epoch gives: the last one may take fewer batches."""
    per_update = update_freq * world_size
    return -(-num_batches // per_update)


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
