"""The encoder-decoder Transformer (Vaswani et al., 2017), laid out as fairseq's TransformerModel.

Teacher forcing: `model(src_tokens, prev_output_tokens) -> logits (B, T, V)`.
Search: `encode`, then `decode_step` once per output position with a cache dict,
`reorder_cache` / `reorder_encoder_out` when hypotheses are reordered or dropped.
The encoder output and the cross-attention state are per source sentence; the target
rows given to `decode_step` come K per sentence (K beams, or K = 1), a sentence's rows
next to each other, and K is their number divided by the number of sentences.

The decoding cache (a plain dict the caller creates empty) holds
  "length":    int, target positions already processed;
  "self_kv":   (B*K, capacity, L, 2, H, Dh) self-attention keys/values of all L
               decoder layers in one contiguous buffer, written in place and doubled in
               capacity when full (no torch.cat per step);
  "self_kv_spare": None or a buffer of the same shape that `reorder_cache` gathers
               into before the two swap (allocating a fresh buffer at every step
               costs more than the copy on a CPU);
  or, on a CPU in float32 (unless "zeroed"), instead of those two, a layout that
  reordering leaves in place (copying the whole reordered cache at every step is a
  large share of a small model's search on a CPU):
  "beam_kv":   (L, 2, B, H, capacity, K, Dh) each position's keys/values, in the slot
               of the beam that computed them, never moved; a row attends over its
               sentence's T * K slots with a mask of those on its history
               (layers.BeamCache);
  "beam_origin": (B*K, capacity) long, the slot holding each row's history at each
               position; reordering gathers these rows alone;
  "cross_kv":  (L, 2, B, H, S, Dh) cross-attention keys/values per sentence, computed
               once from the encoder output at the first step; each layer's keys and
               values are contiguous (B, H, S, Dh) blocks;
  "cross_keys_t": on a CPU (unless "zeroed"), the keys of "cross_kv" once more,
               transposed: (L, B, H, Dh, S). A CPU's batched products read keys laid
               out so faster than through a transposed view; the encoder's keys are
               made once per batch, so the copy is too.
               "cross_kv" stays whole (it is what fixed-shape steps read), its keys
               unread by `decode_step`;
  "cross_mask": (B, 1, 1, S) additive mask in the model's dtype: 0 at source tokens,
               -inf at pads;
  "zeroed":    bool, self-attention buffers are allocated as zeros (for fixed-shape
               steps, see `decode_step_static`);
  "buffers":   the model's BufferPool, where the self-attention buffers of a CPU
               cache come from (reused from batch to batch).
In "self_kv" the row comes first, so that `reorder_cache` is one row gather (on a GPU,
several times faster than selecting along an inner dimension), and the position next,
so that the filled prefix of a row is one contiguous block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.config import ModelConfig
from nmt_cli.data.dictionary import PAD_ID
from nmt_cli.errors import NmtError
from nmt_cli.models.buffer_pool import BufferPool
from nmt_cli.models.dropout import maybe_dropout
from nmt_cli.models.layers import (
    BeamCache,
    DecoderLayer,
    EncoderLayer,
    LearnedPositions,
    SinusoidalPositions,
    StaticPosition,
    key_padding_to_attn_mask,
)

# First capacity of the self-attention cache; it doubles as decoding goes on.
INITIAL_CACHE_CAPACITY = 32
# Decoding on a CPU in float32 (int8 too) keeps its self-attention cache where reordering
# leaves it in place ("beam_kv" in the module docstring): a step then gathers small
# integer rows instead of copying the cache. Not in bf16, whose attention would then
# round its scores to bf16 for no gain in speed.
# False: the row-major "self_kv" of other devices.
BEAM_CACHE_ON_CPU = True
# On a CPU, sentences that are done wait in the batch, masked, until this fraction of it
# is done, and then leave together (the search reads `sentence_drop_fraction`). Each
# departure copies the filled cache of every sentence that stays, and a done sentence
# kept costs its share of the step's arithmetic; a quarter balances the two (fractions
# from 0.2 to 0.35 were level: benchmarks/HISTORY.md, "done sentences leaving in groups").
CPU_SENTENCE_DROP_FRACTION = 0.25


def _find_onednn_linear():
    """torch's oneDNN linear (the op Inductor's CPU backend emits), or None where the build lacks it."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_ONEDNN_LINEAR = _find_onednn_linear()


def vocabulary_logits(hidden: Tensor, weight: Tensor) -> Tensor:
    """hidden (N, D) x output projection weight (V, D) -> logits (N, V), as F.linear.

    On a CPU in float32 this runs oneDNN's kernel, which is faster than MKL's sgemm
    (F.linear's) for a decoding step's shapes on the CPUs measured (CTranslate2 picks
    oneDNN there too; benchmarks/HISTORY.md). Elsewhere, and under autocast, F.linear.
    """
    on_cpu_fp32 = hidden.device.type == "cpu" and hidden.dtype == weight.dtype == torch.float32
    if _ONEDNN_LINEAR is not None and on_cpu_fp32 and not torch.is_autocast_enabled("cpu"):
        return _ONEDNN_LINEAR(hidden.contiguous(), weight, None, "none", [], "")
    return F.linear(hidden, weight)


@dataclass
class EncoderOut:
    out: Tensor  # (B, S, D) encoder output
    padding_mask: Tensor  # (B, S) bool, True at pads


def make_embedding(vocab_size: int, dim: int, padding_idx: int) -> nn.Embedding:
    """Token embedding initialised as fairseq: normal(0, dim^-0.5), pad row zero."""
    embedding = nn.Embedding(vocab_size, dim, padding_idx=padding_idx)
    nn.init.normal_(embedding.weight, mean=0.0, std=dim**-0.5)
    with torch.no_grad():
        embedding.weight[padding_idx].zero_()
    return embedding


def make_positions_module(cfg: ModelConfig, dim: int, max_positions: int) -> nn.Module:
    if cfg.learned_pos:
        return LearnedPositions(dim, PAD_ID, max_positions)
    return SinusoidalPositions(dim, PAD_ID, max_positions)


class TransformerEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        dim = cfg.encoder_embed_dim
        self.dropout = cfg.dropout
        self.embed_scale = math.sqrt(dim) if cfg.scale_embedding else 1.0
        self.embed_tokens = embed_tokens
        self.embed_positions = make_positions_module(cfg, dim, cfg.max_source_positions)
        self.layers = nn.ModuleList(
            EncoderLayer(dim, cfg.encoder_ffn_embed_dim, cfg.encoder_attention_heads, cfg.dropout,
                         cfg.attention_dropout, cfg.activation_dropout, cfg.normalize_before)
            for _ in range(cfg.encoder_layers)
        )
        # Pre-norm leaves the last residual sum unnormalised; fairseq adds a final LayerNorm.
        self.layer_norm = nn.LayerNorm(dim) if cfg.normalize_before else None

    def forward(self, src_tokens: Tensor, padded: bool = True) -> EncoderOut:
        """src_tokens (B, S), right-padded -> EncoderOut. `padded=False`: no row has pads
        (see Transformer.forward)."""
        padding_mask = src_tokens.eq(PAD_ID)  # (B, S)
        x = self.embed_scale * self.embed_tokens(src_tokens) + self.embed_positions(src_tokens)  # (B, S, D)
        x = maybe_dropout(x, self.dropout, self.training)
        attn_mask = None
        if padded:
            x = x.masked_fill(padding_mask.unsqueeze(-1), 0.0)  # as fairseq: pads enter the layers as zeros
            attn_mask = key_padding_to_attn_mask(padding_mask)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, attn_mask)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return EncoderOut(out=x, padding_mask=padding_mask)


class TransformerDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding, share_input_output: bool) -> None:
        super().__init__()
        dim = cfg.decoder_embed_dim
        self.dropout = cfg.dropout
        self.embed_scale = math.sqrt(dim) if cfg.scale_embedding else 1.0
        self.embed_tokens = embed_tokens
        self.embed_positions = make_positions_module(cfg, dim, cfg.max_target_positions)
        self.layers = nn.ModuleList(
            DecoderLayer(dim, cfg.decoder_ffn_embed_dim, cfg.decoder_attention_heads, cfg.dropout,
                         cfg.attention_dropout, cfg.activation_dropout, cfg.normalize_before, cfg.encoder_embed_dim)
            for _ in range(cfg.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dim) if cfg.normalize_before else None
        vocab_size = embed_tokens.num_embeddings
        self.output_projection = nn.Linear(dim, vocab_size, bias=False)
        if share_input_output:
            self.output_projection.weight = embed_tokens.weight
        else:
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=dim**-0.5)

    def embed(self, tokens: Tensor, start: int | None) -> Tensor:
        """tokens (B, T) -> (B, T, D): scaled embeddings + positions, dropout."""
        x = self.embed_scale * self.embed_tokens(tokens) + self.embed_positions(tokens, start)
        return maybe_dropout(x, self.dropout, self.training)

    def forward(self, prev_output_tokens: Tensor, encoder_out: EncoderOut, src_padded: bool = True) -> Tensor:
        """Teacher forcing: prev_output_tokens (B, T), right-padded -> hidden states (B, T, D).
        `src_padded=False`: no source row has pads (see Transformer.forward)."""
        x = self.embed(prev_output_tokens, None)
        cross_mask = key_padding_to_attn_mask(encoder_out.padding_mask) if src_padded else None  # (B, 1, 1, S)
        for layer in self.layers:
            # Target pads need no key mask: with right padding, causality already hides them.
            x = layer(x, layer.encoder_attn.project_kv(encoder_out.out), cross_mask)
        return x if self.layer_norm is None else self.layer_norm(x)

    def forward_cached(self, new_tokens: Tensor, cache: dict) -> Tensor:
        """New tokens (B*K, n) at positions cache["length"]... -> hidden states (B*K, n, D)."""
        start = cache["length"]
        x = self.embed(new_tokens, start)
        self_caches = _self_attention_caches(cache, start, new_tokens.size(1), len(self.layers))
        for i, layer in enumerate(self.layers):
            cross_k, cross_v = cache["cross_kv"][i]  # (B, H, S, Dh) each
            if "cross_keys_t" in cache:  # the same keys, in the layout a CPU reads faster
                cross_k = cache["cross_keys_t"][i].transpose(-1, -2)
            x = layer.forward_cached(x, cross_k, cross_v, cache["cross_mask"], self_caches[i], start)
        return x if self.layer_norm is None else self.layer_norm(x)

    def forward_static(self, new_tokens: Tensor, position: StaticPosition, self_kv: Tensor, cross_kv: Tensor,
                       cross_mask: Tensor) -> Tensor:
        """forward_cached for one new token per row (B*K, 1) with fixed shapes -> (B*K, 1, D).

        The cache's tensors are passed one by one: a captured step must keep reading
        these very buffers, whatever the cache dict holds later.
        """
        x = self.embed_scale * self.embed_tokens(new_tokens) + self.embed_positions.at(position.index)
        x = maybe_dropout(x, self.dropout, self.training)
        for i, layer in enumerate(self.layers):
            cross_k, cross_v = cross_kv[i]
            x = layer.forward_cached(x, cross_k, cross_v, cross_mask, self_kv[:, :, i], position)
        return x if self.layer_norm is None else self.layer_norm(x)


def check_vocab_sizes(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
    """NmtError when a Transformer of `cfg` cannot have these vocabulary sizes."""
    for side, size in (("source", src_vocab_size), ("target", tgt_vocab_size)):
        if size <= PAD_ID:
            raise NmtError(f"{side} vocabulary of {size} symbols is too small")
    if cfg.share_all_embeddings and src_vocab_size != tgt_vocab_size:
        raise NmtError(
            f"--share-all-embeddings needs one joined dictionary, but the source has "
            f"{src_vocab_size} symbols and the target {tgt_vocab_size} (preprocess with --joined-dictionary)"
        )


class Transformer(nn.Module):
    """Encoder-decoder Transformer; see the module docstring for the decoding interface."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        check_vocab_sizes(cfg, src_vocab_size, tgt_vocab_size)
        self.cfg = cfg
        self.pad_idx = PAD_ID
        encoder_embed = make_embedding(src_vocab_size, cfg.encoder_embed_dim, PAD_ID)
        if cfg.share_all_embeddings:
            decoder_embed = encoder_embed
        else:
            decoder_embed = make_embedding(tgt_vocab_size, cfg.decoder_embed_dim, PAD_ID)
        share_output = cfg.share_all_embeddings or cfg.share_decoder_input_output_embed
        self.encoder = TransformerEncoder(cfg, encoder_embed)
        self.decoder = TransformerDecoder(cfg, decoder_embed, share_output)
        self.cache_buffers = BufferPool()  # see the "buffers" key of the decoding cache

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor, features_only: bool = False,
                src_padded: bool = True) -> Tensor:
        """Teacher forcing: (B, S), (B, T) -> logits (B, T, V), or hidden (B, T, D) if features_only.

        `features_only` lets a trainer apply `output_projection` in chunks (large V)
        while the forward pass still runs through a DDP wrapper.
        `src_padded=False` promises that no source row has pads, as in most batches of
        length-sorted training data: attention then runs without a key mask, which lets
        a GPU use its fastest kernel (FlashAttention). The default is always correct.
        """
        hidden = self.decoder(prev_output_tokens, self.encoder(src_tokens, src_padded), src_padded)
        return hidden if features_only else self.decoder.output_projection(hidden)

    def output_projection(self, hidden: Tensor) -> Tensor:
        """Hidden states (..., D) -> logits (..., V)."""
        return self.decoder.output_projection(hidden)

    @property
    def sentence_drop_fraction(self) -> float:
        """How much of a batch must be done before its done sentences leave (see
        CPU_SENTENCE_DROP_FRACTION)."""
        on_cpu = self.decoder.embed_tokens.weight.device.type == "cpu"
        return CPU_SENTENCE_DROP_FRACTION if on_cpu else 0.0

    def encode(self, src_tokens: Tensor) -> EncoderOut:
        return self.encoder(src_tokens)

    @torch.no_grad()
    def decode_step(self, prev_tokens: Tensor, encoder_out: EncoderOut, cache: dict) -> Tensor:
        """prev_tokens (B*K, t) all tokens so far -> float32 log-probabilities (B*K, V) of the next.

        `encoder_out` holds B sentences; prev_tokens K rows for each, in sentence order.
        Only the tokens not yet in `cache` are run (normally the last one; on the
        first call a whole forced prefix may be given). `encoder_out` is read on
        the first call only; afterwards the cache holds what the decoder needs.
        """
        if not cache:
            on_cpu = prev_tokens.device.type == "cpu"
            beams = _alike_rows_per_sentence(prev_tokens, encoder_out.out.size(0)) if on_cpu else 1
            if beams > 1:
                # A search's beams start alike, so a sentence's rows would all compute the
                # same first step: run one per sentence and copy it, output projection
                # included. Not on a GPU, where the check would
                # make the host wait for the encoder.
                self.start_cache(encoder_out, encoder_out.out.size(0), cache)
                lprobs = self._advance(prev_tokens[::beams], cache)
                self._repeat_rows(cache, beams)
                return lprobs.repeat_interleave(beams, dim=0)
            self.start_cache(encoder_out, prev_tokens.size(0), cache)
        return self._advance(prev_tokens, cache)

    def _advance(self, prev_tokens: Tensor, cache: dict) -> Tensor:
        """decode_step on a started cache."""
        start = cache["length"]
        new_tokens = prev_tokens[:, start:]  # (B*K, n)
        if new_tokens.size(1) == 0:
            raise ValueError(f"decode_step got {prev_tokens.size(1)} tokens but the cache already holds {start}")
        self._ensure_capacity(cache, start + new_tokens.size(1))
        hidden = self.decoder.forward_cached(new_tokens, cache)  # (B*K, n, D)
        cache["length"] = start + new_tokens.size(1)
        return self._log_probs(hidden[:, -1])

    def _log_probs(self, hidden: Tensor) -> Tensor:
        """Last hidden states (N, D) -> float32 log-probabilities (N, V)."""
        projection = self.decoder.output_projection
        if isinstance(projection, nn.Linear):
            logits = vocabulary_logits(hidden, projection.weight)
        else:  # the CPU inference layers (Int8Linear, PackedLinear) have no plain weight
            logits = projection(hidden)
        if logits.dtype == torch.float32 and logits.device.type == "cpu":
            # In place: each row is normalised while it is still in the CPU's cache, and
            # no second (N, V) buffer is written.
            return torch.log_softmax(logits, dim=-1, out=logits)
        # dtype= reads bf16/fp16 logits directly: no float32 copy of them is written first.
        return F.log_softmax(logits, dim=-1, dtype=torch.float32)

    def prepare_static_step(self, cache: dict) -> None:
        """Make room in `cache` (and the position table) for the next token, on the host,
        so that `decode_step_static` itself needs no host checks."""
        length = cache["length"] + 1
        self._ensure_capacity(cache, length)
        self.decoder.embed_positions.prepare(length)

    @torch.no_grad()
    def decode_step_static(self, new_tokens: Tensor, index: Tensor, self_kv: Tensor, cross_kv: Tensor,
                           cross_mask: Tensor) -> Tensor:
        """decode_step for one new token per row (B*K, 1) at position `index` (a () long
        tensor), with the cache's buffers passed in; it neither reads nor updates
        cache["length"]. Shapes and memory do not depend on the position and no value
        goes to the host, so a CUDA graph can capture it (nmt_cli/decode/graphs.py).
        Call `prepare_static_step` first. -> float32 log-probabilities (B*K, V).
        """
        capacity = self_kv.size(1)
        later = torch.arange(capacity, device=index.device) > index  # (capacity,)
        self_mask = torch.zeros(1, 1, 1, capacity, dtype=self_kv.dtype, device=self_kv.device).masked_fill_(
            later, float("-inf"))
        position = StaticPosition(index=index, self_mask=self_mask)
        hidden = self.decoder.forward_static(new_tokens, position, self_kv, cross_kv, cross_mask)  # (B*K, 1, D)
        return self._log_probs(hidden[:, -1])

    def start_cache(self, encoder_out: EncoderOut, rows: int, cache: dict, zeroed: bool = False) -> None:
        """Fill an empty `cache` for `rows` target rows (K per sentence of `encoder_out`).

        `zeroed`: self-attention buffers start as zeros, not garbage, past the filled
        prefix, since a fixed-shape step reads the whole buffer. Ordinary steps read
        only the prefix and skip the zeroing (a few percent of CPU decoding time).
        """
        sentences = encoder_out.out.size(0)
        if rows % sentences != 0:
            raise ValueError(f"decode_step got {rows} target rows for {sentences} sentences; it needs K per sentence")
        cache["length"] = 0
        cross_kv, cache["cross_mask"] = self.cross_attention_state(encoder_out)
        cache["cross_kv"] = cross_kv
        if cross_kv.device.type == "cpu" and not zeroed:  # zeroed: for fixed-shape steps, which read cross_kv
            cache["cross_keys_t"] = cross_kv[:, 0].transpose(-1, -2).contiguous()
        cache["zeroed"] = zeroed
        cache["buffers"] = self.cache_buffers
        low_precision = cross_kv.dtype in (torch.bfloat16, torch.float16)
        if BEAM_CACHE_ON_CPU and cross_kv.device.type == "cpu" and not low_precision and not zeroed:
            L, _, B, H, _, Dh = cross_kv.shape
            cache["beam_kv"] = _new_buffer(cache, cross_kv, (L, 2, B, H, INITIAL_CACHE_CAPACITY, rows // B, Dh))
            cache["beam_origin"] = torch.empty(rows, INITIAL_CACHE_CAPACITY, dtype=torch.long, device=cross_kv.device)
            return
        cache["self_kv"] = _new_buffer(cache, cross_kv, self_kv_shape(cross_kv, rows, INITIAL_CACHE_CAPACITY))
        cache["self_kv_spare"] = None

    def cross_attention_state(self, encoder_out: EncoderOut) -> tuple[Tensor, Tensor]:
        """The cache's "cross_kv" and "cross_mask" for `encoder_out` (see the module docstring)."""
        layers = self.decoder.layers
        # project_kv gives keys and values (B, H, S, Dh) per layer; stacked as (L, 2, B, H, S, Dh)
        # in one copy.
        keys_values = [part for layer in layers for part in layer.encoder_attn.project_kv(encoder_out.out)]
        cross_kv = torch.stack(keys_values).unflatten(0, (len(layers), 2))
        # An additive float mask (0 or -inf), made once: a bool mask would be converted on every call.
        allowed = key_padding_to_attn_mask(encoder_out.padding_mask)  # (B, 1, 1, S)
        cross_mask = torch.zeros(allowed.shape, dtype=cross_kv.dtype, device=cross_kv.device).masked_fill(
            allowed.logical_not(), float("-inf"))
        return cross_kv, cross_mask

    @staticmethod
    def _ensure_capacity(cache: dict, needed: int) -> None:
        """Double the self-attention buffers' capacity until `needed` positions fit."""
        beams = "beam_kv" in cache
        capacity = cache["beam_kv"].size(4) if beams else cache["self_kv"].size(1)
        if needed <= capacity:
            return
        while capacity < needed:
            capacity *= 2
        if beams:
            cache["beam_kv"] = _with_capacity(cache, cache["beam_kv"], 4, capacity)
            cache["beam_origin"] = _with_capacity(cache, cache["beam_origin"], 1, capacity)
        else:
            cache["self_kv"] = _with_capacity(cache, cache["self_kv"], 1, capacity)
            cache["self_kv_spare"] = None

    def reorder_cache(self, cache: dict, index: Tensor, sentence_index: Tensor | None = None) -> None:
        """Keep target rows `index` (B'*K,), in that order (beam reordering), and, when
        sentences leave the batch, sentences `sentence_index` (B',), in that order.

        New row i must continue a row of the sentence that becomes sentence i // K:
        beams move within their sentence. With `sentence_index` None, every sentence
        stays where it is and the per-sentence cross-attention state is not touched.
        """
        if not cache:
            return
        # Only the filled positions of the self-attention buffers are copied, not their
        # spare capacity.
        length = cache["length"]
        if "beam_kv" in cache:  # the keys and values stay; each row takes its new history
            cache["beam_origin"] = cache["beam_origin"].index_select(0, index)
            if sentence_index is not None:
                old = cache["beam_kv"]
                kept = _new_buffer(cache, old, old.shape[:2] + (sentence_index.numel(),) + old.shape[3:])
                torch.index_select(old[:, :, :, :, :length], 2, sentence_index, out=kept[:, :, :, :, :length])
                cache["beam_kv"] = kept
        else:  # gathered into the spare buffer, which then becomes the cache
            old, spare = cache["self_kv"], cache["self_kv_spare"]
            if spare is None or spare.size(0) != index.numel():
                spare = _new_buffer(cache, old, (index.numel(), *old.shape[1:]))
            torch.index_select(old[:, :length], 0, index, out=spare[:, :length])
            cache["self_kv"], cache["self_kv_spare"] = spare, old
        if sentence_index is not None:
            cache["cross_kv"] = cache["cross_kv"].index_select(2, sentence_index)
            if "cross_keys_t" in cache:
                cache["cross_keys_t"] = cache["cross_keys_t"].index_select(1, sentence_index)
            cache["cross_mask"] = cache["cross_mask"][sentence_index]

    def _repeat_rows(self, cache: dict, K: int) -> None:
        """A cache of one row per sentence -> K equal rows per sentence: the reorder that
        repeats each row K times, once "beam_kv" has K slots per position."""
        if "beam_kv" in cache:  # each slot gets the one row's keys and values
            old = cache["beam_kv"]  # (L, 2, B, H, capacity, 1, Dh)
            new = _new_buffer(cache, old, old.shape[:5] + (K,) + old.shape[6:])
            # Slots off a row's history are masked, but must not hold garbage that could be NaN.
            length = cache["length"]
            new[:, :, :, :, :length].copy_(old[:, :, :, :, :length].expand(-1, -1, -1, -1, -1, K, -1))
            cache["beam_kv"] = new
        sentences = cache["cross_kv"].size(2)
        self.reorder_cache(cache, torch.arange(sentences, device=cache["cross_kv"].device).repeat_interleave(K))

    def reorder_encoder_out(self, encoder_out: EncoderOut, index: Tensor) -> EncoderOut:
        """Keep sentences `index` (B',) of the encoder output, in that order."""
        return EncoderOut(out=encoder_out.out[index], padding_mask=encoder_out.padding_mask[index])


def self_kv_shape(cross_kv: Tensor, rows: int, capacity: int) -> tuple[int, ...]:
    """The shape of a "self_kv" buffer that goes with `cross_kv` (L, 2, B, H, S, Dh)."""
    L, _, _, H, _, Dh = cross_kv.shape
    return (rows, capacity, L, 2, H, Dh)


def _alike_rows_per_sentence(tokens: Tensor, sentences: int) -> int:
    """K when tokens (B*K, n) hold K equal rows for each of the B sentences, else 1."""
    K, rest = divmod(tokens.size(0), sentences)
    if K < 2 or rest:
        return 1
    per_sentence = tokens.view(sentences, K, tokens.size(1))
    return K if bool(per_sentence.eq(per_sentence[:, :1]).all()) else 1


def _self_attention_caches(cache: dict, start: int, n: int, layers: int) -> list[Tensor | BeamCache]:
    """Each decoder layer's self-attention cache for new positions start..start+n-1."""
    if "beam_kv" not in cache:
        return [cache["self_kv"][:, :, i] for i in range(layers)]
    beam_kv, origin = cache["beam_kv"], cache["beam_origin"]
    K = beam_kv.size(5)
    origin[:, start : start + n] = (torch.arange(origin.size(0), device=origin.device) % K).unsqueeze(1)
    mask = history_mask(origin[:, : start + n], K, n, beam_kv.dtype)
    return [BeamCache(beam_kv[i], mask) for i in range(layers)]


def history_mask(origin: Tensor, K: int, n: int, dtype: torch.dtype) -> Tensor:
    """origin (B*K, T): the slot of each row's history at each position, the last n
    positions new -> additive mask (B, 1, K * n, T * K) for BeamCache: query (k, i), row
    k's new position T - n + i, sees slot (p, j) when its history is there (origin
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


def _with_capacity(cache: dict, old: Tensor, dim: int, capacity: int) -> Tensor:
    """A buffer like `old` with `capacity` positions along `dim`, holding old's filled ones."""
    shape = list(old.shape)
    shape[dim] = capacity
    new = _new_buffer(cache, old, tuple(shape))
    new.narrow(dim, 0, cache["length"]).copy_(old.narrow(dim, 0, cache["length"]))
    return new


def _new_buffer(cache: dict, like: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A self-attention buffer like `like`: zeros when the cache asks for them (see
    start_cache), else uninitialised, from the model's pool on a CPU."""
    if cache["zeroed"]:
        return like.new_zeros(shape)
    if like.device.type == "cpu":
        return cache["buffers"].empty(tuple(shape), like.dtype)
    return like.new_empty(shape)
