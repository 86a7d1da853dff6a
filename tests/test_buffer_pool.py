"""BufferPool: buffers come back only once the tensor they were handed out as is gone,
and decoding from reused buffers gives a fresh model's results."""

from __future__ import annotations

import copy
import pickle

import torch
from model_utils import EOS, SRC_V, TGT_V, padded_batch, tiny_model

from nmt_cli.models.fast.buffer_pool import MAX_BUFFERS, BufferPool


def kept_bytes(pool: BufferPool) -> int:
    """The memory the pool holds, in use or not."""
    return sum(flat.numel() * flat.element_size() for flat, _ in pool._buffers)


def test_a_buffer_is_handed_out_again_once_its_tensor_is_gone() -> None:
    pool = BufferPool()
    first = pool.empty((4, 8), torch.float32)
    address = first.data_ptr()
    second = pool.empty((4, 8), torch.float32)
    assert second.data_ptr() != address  # `first` still holds its buffer
    del first
    third = pool.empty((2, 3, 5), torch.float32)  # smaller: fits in the freed buffer
    assert third.data_ptr() == address and third.shape == (2, 3, 5) and third.is_contiguous()
    assert kept_bytes(pool) == 2 * 32 * 4


def test_the_smallest_free_buffer_that_fits_is_taken_and_dtypes_are_not_mixed() -> None:
    pool = BufferPool()
    big, small, double = pool.empty((100,), torch.float32), pool.empty((10,), torch.float32), pool.empty((10,), torch.float64)
    addresses = {"big": big.data_ptr(), "small": small.data_ptr(), "double": double.data_ptr()}
    del big, small, double
    assert pool.empty((8,), torch.float32).data_ptr() == addresses["small"]
    assert pool.empty((8,), torch.float64).data_ptr() == addresses["double"]
    assert pool.empty((50,), torch.float32).data_ptr() == addresses["big"]


def test_the_pool_keeps_at_most_max_buffers_and_drops_the_smallest_free_one() -> None:
    pool = BufferPool()
    held = [pool.empty((n,), torch.float32) for n in range(1, MAX_BUFFERS + 1)]
    extra = pool.empty((1000,), torch.float32)  # all in use: served, not kept
    assert kept_bytes(pool) == 4 * sum(range(1, MAX_BUFFERS + 1))
    del extra
    del held[0]  # the smallest (1 element) is now free
    larger = pool.empty((500,), torch.float32)  # fits nowhere: replaces the free one
    assert kept_bytes(pool) == 4 * (sum(range(2, MAX_BUFFERS + 1)) + 500)
    assert larger.numel() == 500


def test_copies_and_pickles_of_a_pool_start_empty() -> None:
    pool = BufferPool()
    held = pool.empty((16,), torch.float32)
    assert kept_bytes(copy.deepcopy(pool)) == 0
    assert kept_bytes(pickle.loads(pickle.dumps(pool))) == 0
    assert held.numel() == 16


def decode(model, src: torch.Tensor, prev: torch.Tensor) -> list[torch.Tensor]:
    encoder_out, cache = model.encode(src), model.new_cache()
    return [model.decode_step(prev[:, : t + 1], encoder_out, cache) for t in range(prev.size(1))]


def test_batches_one_after_another_reuse_the_cache_memory_and_decode_as_a_fresh_model() -> None:
    model, fresh = tiny_model(21), tiny_model(21)
    src_a, prev_a = padded_batch(22, [6, 3, 5], SRC_V), padded_batch(23, [9, 9, 9], TGT_V, bos=EOS)
    src_b, prev_b = padded_batch(24, [4, 7], SRC_V), padded_batch(25, [7, 7], TGT_V, bos=EOS)
    decode(model, src_a, prev_a)
    kept = kept_bytes(model.cache_buffers)
    assert kept > 0  # the first batch's self-attention cache stays with the model
    got = decode(model, src_b, prev_b)
    assert kept_bytes(model.cache_buffers) == kept  # the second batch found room in it
    for a, b in zip(got, decode(fresh, src_b, prev_b)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_two_searches_at_once_on_one_model_keep_their_own_caches() -> None:
    model = tiny_model(26)
    src_a, prev_a = padded_batch(27, [5, 5], SRC_V), padded_batch(28, [6, 6], TGT_V, bos=EOS)
    src_b, prev_b = padded_batch(29, [3, 4, 2], SRC_V), padded_batch(30, [6, 6, 6], TGT_V, bos=EOS)
    want_a, want_b = decode(model, src_a, prev_a), decode(model, src_b, prev_b)
    out_a, cache_a = model.encode(src_a), model.new_cache()
    out_b, cache_b = model.encode(src_b), model.new_cache()
    for t in range(prev_a.size(1)):  # steps taken in turn
        got_a = model.decode_step(prev_a[:, : t + 1], out_a, cache_a)
        got_b = model.decode_step(prev_b[:, : t + 1], out_b, cache_b)
        torch.testing.assert_close(got_a, want_a[t], atol=0, rtol=0)
        torch.testing.assert_close(got_b, want_b[t], atol=0, rtol=0)


def test_buffers_first_used_under_inference_mode_serve_caches_outside_it_and_back() -> None:
    """search.generate runs under torch.inference_mode; a cache written in place outside
    it must not get an inference tensor from the pool (torch refuses such writes)."""
    model = tiny_model(31)
    src, prev = padded_batch(32, [5, 3, 4], SRC_V), padded_batch(33, [6, 6, 6], TGT_V, bos=EOS)
    want = decode(model, src, prev)

    def decode_with_a_sentence_leaving() -> list[torch.Tensor]:
        encoder_out, cache, rows, got = model.encode(src), model.new_cache(), prev, []
        for t in range(rows.size(1)):
            if t == 3:  # the cache moves into a new buffer
                keep = torch.tensor([0, 2])
                model.reorder_cache(cache, keep, sentence_index=keep)
                encoder_out, rows = model.reorder_encoder_out(encoder_out, keep), rows[keep]
            got.append(model.decode_step(rows[:, : t + 1], encoder_out, cache))
        return got

    with torch.inference_mode():
        first = decode_with_a_sentence_leaving()
    second = decode_with_a_sentence_leaving()
    with torch.inference_mode():
        third = decode_with_a_sentence_leaving()
    for t, (a, b, c) in enumerate(zip(first, second, third)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        torch.testing.assert_close(a, c, atol=0, rtol=0)
        torch.testing.assert_close(a, want[t] if t < 3 else want[t][[0, 2]], atol=1e-12, rtol=0)
