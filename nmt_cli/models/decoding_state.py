"""What a Transformer keeps between decoding steps: one dataclass per cache layout.

`DecoderCache` is what the search holds (made empty by `Transformer.new_cache`, filled
at the first `decode_step`): the number of target positions already run, the
cross-attention state of each source sentence and the self-attention keys and values
of each target row, in one of two layouts:

* `RowMajorKV`, the reference layout (every device): a row's keys and values for all
  positions and layers in one buffer, the row first so that beam reordering is one
  row gather, the position next so that a row's filled prefix is one contiguous block.
* `BeamSlotKV` (models/fast/beam_slots.py, CPU decoding in float32): keys and values stay
  in the slot of the beam that computed them, so that reordering moves small integer
  rows instead of the cache.

For one decoder layer and one step, each layout gives a view whose `attend` is that
layout's one attention path (`SelfAttention.forward_cached` calls it): `RowMajorLayer`,
`FixedShapeLayer` (the fixed-shape step that a CUDA graph replays) and `BeamSlotLayer`.

Shapes: L decoder layers, B sentences, K target rows per sentence, H heads, Dh head
dimension, S source length, n new positions of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.models.layers import merge_heads

if TYPE_CHECKING:
    from nmt_cli.models.fast.buffer_pool import BufferPool


@dataclass
class BufferSource:
    """Where a cache's self-attention buffers come from.

    `zeroed`: zeros, not garbage, past the filled prefix, since a fixed-shape step reads
    the whole buffer (ordinary steps read only the prefix and skip the zeroing).
    `pool`: on a CPU, buffers reused from batch to batch (None: fresh ones each time).
    """

    zeroed: bool
    pool: BufferPool | None

    def new(self, like: Tensor, shape: tuple[int, ...]) -> Tensor:
        """A buffer of `shape` with the dtype and device of `like`."""
        if self.zeroed:
            return like.new_zeros(shape)
        if self.pool is not None and like.device.type == "cpu":
            return self.pool.empty(tuple(shape), like.dtype)
        return like.new_empty(shape)

    def with_capacity(self, old: Tensor, dim: int, capacity: int, length: int) -> Tensor:
        """A buffer like `old` with `capacity` positions along `dim`, holding old's first `length`."""
        shape = list(old.shape)
        shape[dim] = capacity
        new = self.new(old, tuple(shape))
        new.narrow(dim, 0, length).copy_(old.narrow(dim, 0, length))
        return new


@dataclass
class CrossAttentionState:
    """The decoder's cross-attention keys and values, per source sentence, made once from
    the encoder output at the first step."""

    kv: Tensor  # (L, 2, B, H, S, Dh); each layer's keys and values are contiguous (B, H, S, Dh) blocks
    mask: Tensor  # (B, 1, 1, S) additive, in the model's dtype: 0 at source tokens, -inf at pads
    # The keys of `kv` once more, transposed, (L, B, H, Dh, S), or None. A CPU's batched
    # products read keys laid out so faster than through a transposed view; `kv` stays
    # whole, as fixed-shape steps read it.
    keys_t: Tensor | None = None

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Layer i's keys and values, (B, H, S, Dh) each."""
        keys, values = self.kv[i]
        if self.keys_t is not None:
            keys = self.keys_t[i].transpose(-1, -2)
        return keys, values

    def keep_sentences(self, index: Tensor) -> None:
        """Keep sentences `index` (B',), in that order."""
        self.kv = self.kv.index_select(2, index)
        if self.keys_t is not None:
            self.keys_t = self.keys_t.index_select(1, index)
        self.mask = self.mask[index]


class LayerKV(Protocol):
    """One decoder layer's self-attention cache for one step."""

    def attend(self, qkv: Tensor) -> Tensor:
        """qkv (B*K, n, 3 * H * Dh), the new positions' queries, keys and values (the fused
        projection's output, viewed by each layout as it needs) -> the attention output
        (B*K, n, H * Dh), before the output projection; the new keys and values are stored."""


class SelfAttentionLayout(Protocol):
    """Every decoder layer's self-attention keys and values, in one layout (RowMajorKV,
    fast/beam_slots.BeamSlotKV)."""

    @property
    def capacity(self) -> int:
        """Positions the buffers hold before they must grow."""

    def layers(self, start: int, n: int) -> list[LayerKV]:
        """Each layer's view for new positions start..start+n-1."""

    def grow(self, capacity: int, length: int, buffers: BufferSource) -> None:
        """Move the first `length` positions into buffers of `capacity` positions."""

    def reorder(self, index: Tensor, sentence_index: Tensor | None, length: int, buffers: BufferSource) -> None:
        """See Transformer.reorder_cache."""

    def repeat_rows(self, K: int, length: int, buffers: BufferSource) -> None:
        """One row per sentence -> K equal rows per sentence."""


@dataclass
class RowMajorLayer:
    """A layer's view of a RowMajorKV for new positions start..start+n-1."""

    kv: Tensor  # (B*K, capacity, 2, H, Dh)
    start: int

    def attend(self, qkv: Tensor) -> Tensor:
        start, n = self.start, qkv.size(1)
        qkv = qkv.view(qkv.size(0), n, 3, *self.kv.shape[-2:])  # (B*K, n, 3, H, Dh)
        self.kv[:, start : start + n] = qkv[:, :, 1:]
        # Strided (B, H, T, Dh) views: scaled_dot_product_attention reads them in place.
        k, v = self.kv[:, : start + n].permute(2, 0, 3, 1, 4).unbind(0)
        q = qkv[:, :, 0].transpose(1, 2)  # (B, H, n, Dh)
        if n == 1:
            mask, is_causal = None, False  # one query may see every cached key
        elif start == 0:
            mask, is_causal = None, True
        else:
            # Query i (absolute start + i) may see keys 0..start + i.
            mask = torch.ones(n, start + n, dtype=torch.bool, device=qkv.device).tril(diagonal=start)
            is_causal = False
        return merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal))


@dataclass
class FixedShapeLayer:
    """A layer's view of a RowMajorKV for one new token per row whose position is known
    only to the device: shapes and memory do not depend on it, so a CUDA graph can
    replay the step. The buffer must hold finite values everywhere (zeros are fine):
    masked positions still enter the products."""

    kv: Tensor  # (B*K, capacity, 2, H, Dh)
    index: Tensor  # () long: the new token's 0-based position
    self_mask: Tensor  # (1, 1, 1, capacity) additive: 0 at positions <= index, -inf after

    def attend(self, qkv: Tensor) -> Tensor:
        qkv = qkv.view(qkv.size(0), 1, 3, *self.kv.shape[-2:])  # (B*K, 1, 3, H, Dh)
        self.kv.index_copy_(1, self.index.view(1), qkv[:, :, 1:])
        k, v = self.kv.permute(2, 0, 3, 1, 4).unbind(0)  # (B*K, H, capacity, Dh) each
        q = qkv[:, :, 0].transpose(1, 2)  # (B*K, H, 1, Dh)
        return merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=self.self_mask))


@dataclass
class RowMajorKV:
    """Every decoder layer's self-attention keys and values, per target row, in one
    buffer written in place and doubled in capacity when full (no torch.cat per step)."""

    kv: Tensor  # (B*K, capacity, L, 2, H, Dh)
    # None, or a buffer of kv's shape that `reorder` gathers into before the two swap
    # (allocating a fresh buffer at every step costs more than the copy on a CPU).
    spare: Tensor | None = None

    @staticmethod
    def shape(cross_kv: Tensor, rows: int, capacity: int) -> tuple[int, ...]:
        """The shape of a buffer that goes with cross-attention keys and values (L, 2, B, H, S, Dh)."""
        L, _, _, H, _, Dh = cross_kv.shape
        return (rows, capacity, L, 2, H, Dh)

    @property
    def capacity(self) -> int:
        return self.kv.size(1)

    def layers(self, start: int, n: int) -> list[LayerKV]:
        return [RowMajorLayer(self.kv[:, :, i], start) for i in range(self.kv.size(2))]

    def fixed_shape_layers(self, index: Tensor) -> list[LayerKV]:
        """The layers' views for a fixed-shape step at position `index` (a () long tensor)."""
        later = torch.arange(self.capacity, device=index.device) > index  # (capacity,)
        self_mask = torch.zeros(1, 1, 1, self.capacity, dtype=self.kv.dtype, device=self.kv.device).masked_fill_(
            later, float("-inf"))
        return [FixedShapeLayer(self.kv[:, :, i], index, self_mask) for i in range(self.kv.size(2))]

    def grow(self, capacity: int, length: int, buffers: BufferSource) -> None:
        self.kv = buffers.with_capacity(self.kv, 1, capacity, length)
        self.spare = None

    def reorder(self, index: Tensor, sentence_index: Tensor | None, length: int, buffers: BufferSource) -> None:
        """Keep rows `index`: gathered into the spare buffer, which then becomes the cache
        (only the filled positions are copied). Rows hold their own keys, so which
        sentences stay needs nothing more."""
        old, spare = self.kv, self.spare
        if spare is None or spare.size(0) != index.numel():
            spare = buffers.new(old, (index.numel(), *old.shape[1:]))
        torch.index_select(old[:, :length], 0, index, out=spare[:, :length])
        self.kv, self.spare = spare, old

    def repeat_rows(self, K: int, length: int, buffers: BufferSource) -> None:
        """One row per sentence -> K equal rows per sentence."""
        rows = torch.arange(self.kv.size(0), device=self.kv.device).repeat_interleave(K)
        self.reorder(rows, None, length, buffers)


@dataclass
class DecoderCache:
    """What `Transformer.decode_step` keeps between steps (see the module docstring).
    Empty (`started` False) until the first step fills it."""

    length: int = 0  # target positions already run
    cross: CrossAttentionState | None = None
    self_attn: SelfAttentionLayout | None = None
    buffers: BufferSource | None = None

    @property
    def started(self) -> bool:
        return self.self_attn is not None

    def ensure_capacity(self, needed: int) -> None:
        """Double the self-attention buffers' capacity until `needed` positions fit."""
        capacity = self.self_attn.capacity
        if needed <= capacity:
            return
        while capacity < needed:
            capacity *= 2
        self.self_attn.grow(capacity, self.length, self.buffers)

    def reorder(self, index: Tensor, sentence_index: Tensor | None) -> None:
        """See Transformer.reorder_cache."""
        if not self.started:
            return
        self.self_attn.reorder(index, sentence_index, self.length, self.buffers)
        if sentence_index is not None:
            self.cross.keep_sentences(sentence_index)

    def repeat_rows(self, K: int) -> None:
        """A cache of one row per sentence -> K equal rows per sentence."""
        self.self_attn.repeat_rows(K, self.length, self.buffers)

