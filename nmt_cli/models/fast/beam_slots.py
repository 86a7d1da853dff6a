"""The self-attention cache layout of CPU decoding in float32, which beam reordering
leaves in place.

Copying the whole reordered cache at every step is a large share of a small model's
beam search on a CPU. Here each position's keys and values stay in the slot of the
beam that computed them; a row attends over its sentence's T * K slots, with an
additive mask of the slots its own history went through, and reordering gathers the
rows of a small integer table (`origin`) instead of the cache. Not in bf16, whose
attention would then round its scores to bf16 for no gain in speed.

Selected by `DecodingOptions.beam_slot_cache` (nmt_cli/models/transformer.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt_cli.models.decoding_state import BufferSource, LayerKV
from nmt_cli.models.layers import few_query_attention


@dataclass
class BeamSlotLayer:
    """A layer's view of a BeamSlotKV for new positions start..start+n-1."""

    kv: Tensor  # (2, B, H, capacity, K, Dh): keys and values per sentence, position and beam slot
    history_mask: Tensor  # (B, 1, K * n, T * K) additive: 0 where the query's history is, -inf elsewhere
    start: int

    def attend(self, qkv: Tensor) -> Tensor:
        rows, n = qkv.size(0), qkv.size(1)
        _, B, H, _, K, Dh = self.kv.shape
        start = self.start
        qkv = qkv.view(B, K, n, 3, H, Dh)
        self.kv[:, :, :, start : start + n] = qkv[:, :, :, 1:].permute(3, 0, 4, 2, 1, 5)  # (2, B, H, n, K, Dh)
        # A sentence's T * K (position, slot) keys are one contiguous block per head.
        k, v = self.kv[:, :, :, : start + n].reshape(2, B, H, (start + n) * K, Dh).unbind(0)
        q = qkv[:, :, :, 0].permute(0, 3, 1, 2, 4).reshape(B, H, K * n, Dh)
        out = few_query_attention(q, k, v, self.history_mask)  # (B, H, K * n, Dh)
        return out.view(B, H, K, n, Dh).permute(0, 2, 3, 1, 4).reshape(rows, n, H * Dh)


@dataclass
class BeamSlotKV:
    """Every decoder layer's self-attention keys and values in beam slots (see the module docstring)."""

    kv: Tensor  # (L, 2, B, H, capacity, K, Dh), never moved by beam reordering
    origin: Tensor  # (B*K, capacity) long: the slot holding each row's history at each position

    @classmethod
    def start(cls, cross_kv: Tensor, rows: int, capacity: int, buffers: BufferSource) -> "BeamSlotKV":
        """An empty cache for `rows` target rows, with cross-attention keys and values (L, 2, B, H, S, Dh)."""
        L, _, B, H, _, Dh = cross_kv.shape
        kv = buffers.new(cross_kv, (L, 2, B, H, capacity, rows // B, Dh))
        return cls(kv, torch.empty(rows, capacity, dtype=torch.long, device=cross_kv.device))

    @property
    def capacity(self) -> int:
        return self.kv.size(4)

    def layers(self, start: int, n: int) -> list[LayerKV]:
        K = self.kv.size(5)
        origin = self.origin
        origin[:, start : start + n] = (torch.arange(origin.size(0), device=origin.device) % K).unsqueeze(1)
        mask = history_mask(origin[:, : start + n], K, n, self.kv.dtype)
        return [BeamSlotLayer(self.kv[i], mask, start) for i in range(self.kv.size(0))]

    def grow(self, capacity: int, length: int, buffers: BufferSource) -> None:
        self.kv = buffers.with_capacity(self.kv, 4, capacity, length)
        self.origin = buffers.with_capacity(self.origin, 1, capacity, length)

    def reorder(self, index: Tensor, sentence_index: Tensor | None, length: int, buffers: BufferSource) -> None:
        """The keys and values stay; each row takes its new history, and only sentences
        that leave move the slots of those that stay."""
        self.origin = self.origin.index_select(0, index)
        if sentence_index is not None:
            old = self.kv
            kept = buffers.new(old, old.shape[:2] + (sentence_index.numel(),) + old.shape[3:])
            torch.index_select(old[:, :, :, :, :length], 2, sentence_index, out=kept[:, :, :, :, :length])
            self.kv = kept

    def repeat_rows(self, K: int, length: int, buffers: BufferSource) -> None:
        """One row per sentence (one slot per position) -> K equal rows per sentence:
        each of the K slots gets the one row's keys and values."""
        old = self.kv  # (L, 2, B, H, capacity, 1, Dh)
        new = buffers.new(old, old.shape[:5] + (K,) + old.shape[6:])
        # Slots off a row's history are masked, but must not hold garbage that could be NaN.
        new[:, :, :, :, :length].copy_(old[:, :, :, :, :length].expand(-1, -1, -1, -1, -1, K, -1))
        self.kv = new
        sentences = old.size(2)
        self.reorder(torch.arange(sentences, device=old.device).repeat_interleave(K), None, length, buffers)


def history_mask(origin: Tensor, K: int, n: int, dtype: torch.dtype) -> Tensor:
    """origin (B*K, T): the slot of each row's history at each position, the last n
    positions new -> additive mask (B, 1, K * n, T * K) for BeamSlotLayer: query (k, i),
    row k's new position T - n + i, sees slot (p, j) when its history is there (origin
    j at p) and p is not later than itself."""
    rows, T = origin.shape
    B = rows // K
    slots = torch.arange(K, device=origin.device)
    on_history = origin.view(B, K, 1, T, 1) == slots  # (B, K, 1, T, K)
    if n > 1:
        not_later = torch.arange(T, device=origin.device) <= torch.arange(T - n, T, device=origin.device).unsqueeze(1)
        on_history = on_history & not_later.view(1, 1, n, T, 1)
    mask = torch.zeros(on_history.shape[:2] + (n, T, K), dtype=dtype, device=origin.device)  # (B, K, n, T, K)
    return mask.masked_fill_(on_history.logical_not(), float("-inf")).view(B, 1, K * n, T * K)
