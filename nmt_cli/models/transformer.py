"""The encoder-decoder Transformer (Vaswani et al., 2017), laid out as fairseq's TransformerModel.

Teacher forcing: `model(src_tokens, prev_output_tokens) -> logits (B, T, V)`.
Search: `encode`, then `decode_step` once per output position with the cache that
`new_cache` makes, `reorder_cache` / `reorder_encoder_out` when hypotheses are
reordered or dropped (the search's IncrementalDecoder protocol). The encoder output
and the cross-attention state are per source sentence; the target rows given to
`decode_step` come K per sentence (K beams, or K = 1), a sentence's rows next to each
other, and K is their number divided by the number of sentences. The cache and its
layouts are in nmt_cli/models/decoding_state.py; the speed work that decoding may use
(chosen by the model's `DecodingOptions`) in nmt_cli/models/fast/.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.config import ModelConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID
from nmt_cli.errors import NmtError
from nmt_cli.models.decoding_state import BufferSource, CrossAttentionState, DecoderCache, LayerKV, RowMajorKV
from nmt_cli.models.fast.beam_slots import BeamSlotKV
from nmt_cli.models.fast.buffer_pool import BufferPool
from nmt_cli.models.fast.dropout import maybe_dropout, set_lane_mask_dropout
from nmt_cli.models.fast.logits import vocabulary_logits
from nmt_cli.models.fast.options import DecodingOptions
from nmt_cli.models.fast.token_rows import TokenRows
from nmt_cli.models.layers import (
    DecoderLayer,
    EncoderLayer,
    LearnedPositions,
    MarianPositions,
    SinusoidalPositions,
    key_padding_to_attn_mask,
)


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
    if cfg.sinusoids == "marian":
        return MarianPositions(dim, max_positions)
    return SinusoidalPositions(dim, PAD_ID, max_positions)


class TransformerStack(nn.Module):
    """What the encoder and the decoder share: token embeddings scaled by sqrt(d_model) plus
    positions (section 3.4), dropout, `num_layers` layers from `make_layer`, and with pre-norm
    a final LayerNorm. (The order of construction is the order of a seeded initialisation's draws.)"""

    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding, max_positions: int, num_layers: int,
                 make_layer: Callable[[], nn.Module]) -> None:
        super().__init__()
        dim = embed_tokens.embedding_dim
        self.dropout = cfg.dropout
        self.lane_mask_dropout = True  # see nmt_cli/models/fast/dropout.py
        self.embed_scale = math.sqrt(dim) if cfg.scale_embedding else 1.0
        self.embed_tokens = embed_tokens
        self.embed_positions = make_positions_module(cfg, dim, max_positions)
        self.layers = nn.ModuleList(make_layer() for _ in range(num_layers))
        # Pre-norm leaves the last residual sum unnormalised; fairseq adds a final LayerNorm.
        self.layer_norm = nn.LayerNorm(dim) if cfg.normalize_before else None


class TransformerEncoder(TransformerStack):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__(cfg, embed_tokens, cfg.max_source_positions, cfg.encoder_layers, lambda: EncoderLayer(
            cfg.encoder_embed_dim, cfg.encoder_ffn_embed_dim, cfg.encoder_attention_heads, cfg.dropout,
            cfg.attention_dropout, cfg.activation_dropout, cfg.normalize_before, cfg.activation_fn))

    def forward(self, src_tokens: Tensor, padded: bool = True, token_rows: TokenRows | None = None) -> EncoderOut:
        """src_tokens (B, S), right-padded -> EncoderOut. `padded=False`: no row has pads
        (see Transformer.forward). `token_rows` (of src_tokens' pads): the layers run on
        the tokens alone and the output is zero at the pads (nmt_cli/models/fast/token_rows.py)."""
        padding_mask = src_tokens.eq(PAD_ID)  # (B, S)
        x = self.embed_scale * self.embed_tokens(src_tokens) + self.embed_positions(src_tokens)  # (B, S, D)
        x = maybe_dropout(x, self.dropout, self.training, self.lane_mask_dropout)
        attn_mask = None
        if padded:
            x = x.masked_fill(padding_mask.unsqueeze(-1), 0.0)  # as fairseq: pads enter the layers as zeros
            attn_mask = key_padding_to_attn_mask(padding_mask)  # (B, 1, 1, S)
        if token_rows is not None:
            x = token_rows.pack(x)  # (N, D)
        for layer in self.layers:
            x = layer(x, attn_mask, token_rows)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if token_rows is not None:
            x = token_rows.unpack(x)
        return EncoderOut(out=x, padding_mask=padding_mask)


class TransformerDecoder(TransformerStack):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding, share_input_output: bool) -> None:
        super().__init__(cfg, embed_tokens, cfg.max_target_positions, cfg.decoder_layers, lambda: DecoderLayer(
            cfg.decoder_embed_dim, cfg.decoder_ffn_embed_dim, cfg.decoder_attention_heads, cfg.dropout,
            cfg.attention_dropout, cfg.activation_dropout, cfg.normalize_before, cfg.encoder_embed_dim,
            cfg.activation_fn))
        dim = cfg.decoder_embed_dim
        # The decoder's first input, in place of </s>'s embedding (which is where </s> is
        # ever an input: it starts every target and ends none); None: </s>'s embedding.
        self.start_embedding = nn.Parameter(torch.zeros(dim)) if cfg.start_embedding else None
        vocab_size = embed_tokens.num_embeddings
        self.output_projection = nn.Linear(dim, vocab_size, bias=cfg.output_bias)
        if share_input_output:
            self.output_projection.weight = embed_tokens.weight
        else:
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=dim**-0.5)
        if cfg.output_bias:
            nn.init.zeros_(self.output_projection.bias)

    def token_embeddings(self, tokens: Tensor) -> Tensor:
        """tokens (B, T) -> unscaled embeddings (B, T, D), the start vector at </s>."""
        x = self.embed_tokens(tokens)
        if self.start_embedding is None:
            return x
        return torch.where(tokens.eq(EOS_ID).unsqueeze(-1), self.start_embedding.to(x.dtype), x)

    def embed(self, tokens: Tensor, start: int | None) -> Tensor:
        """tokens (B, T) -> (B, T, D): scaled embeddings + positions, dropout."""
        x = self.embed_scale * self.token_embeddings(tokens) + self.embed_positions(tokens, start)
        return maybe_dropout(x, self.dropout, self.training, self.lane_mask_dropout)

    def forward(self, prev_output_tokens: Tensor, encoder_out: EncoderOut, src_padded: bool = True) -> Tensor:
        """Teacher forcing: prev_output_tokens (B, T), right-padded -> hidden states (B, T, D).
        `src_padded=False`: no source row has pads (see Transformer.forward)."""
        x = self.embed(prev_output_tokens, None)
        cross_mask = key_padding_to_attn_mask(encoder_out.padding_mask) if src_padded else None  # (B, 1, 1, S)
        for layer in self.layers:
            # Target pads need no key mask: with right padding, causality already hides them.
            x = layer(x, layer.encoder_attn.project_kv(encoder_out.out), cross_mask)
        return x if self.layer_norm is None else self.layer_norm(x)

    def embed_at(self, tokens: Tensor, index: Tensor) -> Tensor:
        """One new token per row (B*K, 1) at 0-based position `index`, a () long tensor on
        the device (no host checks: call `embed_positions.prepare` first) -> (B*K, 1, D)."""
        x = self.embed_scale * self.token_embeddings(tokens) + self.embed_positions.at(index)
        return maybe_dropout(x, self.dropout, self.training, self.lane_mask_dropout)

    def forward_cached(self, x: Tensor, cross: CrossAttentionState, self_caches: list[LayerKV]) -> Tensor:
        """Decoding: embedded new tokens x (B*K, n, D) -> hidden states (B*K, n, D), with
        each layer's view of the self-attention cache for the new positions."""
        for i, (layer, self_cache) in enumerate(zip(self.layers, self_caches)):
            cross_k, cross_v = cross.layer(i)
            x = layer.forward_cached(x, cross_k, cross_v, cross.mask, self_cache)
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
    """Encoder-decoder Transformer; see the module docstring for the decoding interface.

    `decoding` chooses the speed work that decoding uses (nmt_cli/models/fast/options.py);
    it changes no output. `lane_mask_dropout`: training's dropout on a CPU draws its
    masks from 16-bit lanes (nmt_cli/models/fast/dropout.py); False: F.dropout.
    """

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 decoding: DecodingOptions = DecodingOptions(), lane_mask_dropout: bool = True) -> None:
        super().__init__()
        check_vocab_sizes(cfg, src_vocab_size, tgt_vocab_size)
        self.cfg = cfg
        self.decoding = decoding
        self.pad_idx = PAD_ID
        encoder_embed = make_embedding(src_vocab_size, cfg.encoder_embed_dim, PAD_ID)
        if cfg.share_all_embeddings:
            decoder_embed = encoder_embed
        else:
            decoder_embed = make_embedding(tgt_vocab_size, cfg.decoder_embed_dim, PAD_ID)
        share_output = cfg.share_all_embeddings or cfg.share_decoder_input_output_embed
        self.encoder = TransformerEncoder(cfg, encoder_embed)
        self.decoder = TransformerDecoder(cfg, decoder_embed, share_output)
        self.cache_buffers = BufferPool()  # used when decoding.pooled_buffers
        set_lane_mask_dropout(self, lane_mask_dropout)

    # ---- teacher forcing ----

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

    # ---- decoding (the search's IncrementalDecoder protocol) ----

    @property
    def sentence_drop_fraction(self) -> float:
        """How much of a batch must be done before its done sentences leave (see
        DecodingOptions.sentence_drop_fraction; 0 off a CPU)."""
        on_cpu = self.decoder.embed_tokens.weight.device.type == "cpu"
        return self.decoding.sentence_drop_fraction if on_cpu else 0.0

    def encode(self, src_tokens: Tensor) -> EncoderOut:
        return self.encoder(src_tokens, token_rows=self._token_rows(src_tokens.eq(PAD_ID)))

    def _token_rows(self, padding_mask: Tensor) -> TokenRows | None:
        """The token rows that decoding's encoder and cross-attention projections run
        on, or None: every position (see DecodingOptions.token_rows_from_pads)."""
        fewest_pads = self.decoding.token_rows_from_pads
        if fewest_pads is None or padding_mask.device.type != "cpu":
            return None
        return TokenRows.if_pads_reach(padding_mask, fewest_pads)

    def new_cache(self) -> DecoderCache:
        """An empty cache for a search; the first `decode_step` fills it."""
        return DecoderCache()

    @torch.no_grad()
    def decode_step(self, prev_tokens: Tensor, encoder_out: EncoderOut, cache: DecoderCache) -> Tensor:
        """prev_tokens (B*K, t) all tokens so far -> float32 log-probabilities (B*K, V) of the next.

        `encoder_out` holds B sentences; prev_tokens K rows for each, in sentence order.
        Only the tokens not yet in `cache` are run (normally the last one; on the
        first call a whole forced prefix may be given). `encoder_out` is read on
        the first call only; afterwards the cache holds what the decoder needs.
        """
        if not cache.started:
            sentences = encoder_out.out.size(0)
            beams = 1
            if self.decoding.first_step_once and prev_tokens.device.type == "cpu":
                beams = _alike_rows_per_sentence(prev_tokens, sentences)
            if beams > 1:
                # A search's beams start alike, so a sentence's rows would all compute the
                # same first step: run one per sentence and copy it, output projection included.
                self.start_cache(encoder_out, sentences, cache)
                lprobs = self._advance(prev_tokens[::beams], cache)
                cache.repeat_rows(beams)
                return lprobs.repeat_interleave(beams, dim=0)
            self.start_cache(encoder_out, prev_tokens.size(0), cache)
        return self._advance(prev_tokens, cache)

    def reorder_cache(self, cache: DecoderCache, index: Tensor, sentence_index: Tensor | None = None) -> None:
        """Keep target rows `index` (B'*K,), in that order (beam reordering), and, when
        sentences leave the batch, sentences `sentence_index` (B',), in that order.

        New row i must continue a row of the sentence that becomes sentence i // K:
        beams move within their sentence. With `sentence_index` None, every sentence
        stays where it is and the per-sentence cross-attention state is not touched.
        """
        cache.reorder(index, sentence_index)

    def reorder_encoder_out(self, encoder_out: EncoderOut, index: Tensor) -> EncoderOut:
        """Keep sentences `index` (B',) of the encoder output, in that order."""
        return EncoderOut(out=encoder_out.out[index], padding_mask=encoder_out.padding_mask[index])

    def start_cache(self, encoder_out: EncoderOut, rows: int, cache: DecoderCache, zeroed: bool = False) -> None:
        """Fill an empty `cache` for `rows` target rows (K per sentence of `encoder_out`).

        `zeroed`: for fixed-shape steps (`decode_step_static`), which read the whole
        row-major buffer (see BufferSource) and the untransposed cross-attention keys.
        """
        sentences = encoder_out.out.size(0)
        if rows % sentences != 0:
            raise ValueError(f"decode_step got {rows} target rows for {sentences} sentences; it needs K per sentence")
        options = self.decoding
        cross = self.cross_attention_state(encoder_out)
        cpu_layouts = cross.kv.device.type == "cpu" and not zeroed
        if cpu_layouts and options.transposed_cross_keys:
            cross.keys_t = cross.kv[:, 0].transpose(-1, -2).contiguous()
        buffers = BufferSource(zeroed, self.cache_buffers if options.pooled_buffers else None)
        low_precision = cross.kv.dtype in (torch.bfloat16, torch.float16)
        if cpu_layouts and options.beam_slot_cache and not low_precision:
            self_attn = BeamSlotKV.start(cross.kv, rows, options.initial_capacity, buffers)
        else:
            self_attn = RowMajorKV(buffers.new(cross.kv, RowMajorKV.shape(cross.kv, rows, options.initial_capacity)))
        cache.length, cache.cross, cache.self_attn, cache.buffers = 0, cross, self_attn, buffers

    def cross_attention_state(self, encoder_out: EncoderOut) -> CrossAttentionState:
        """Every decoder layer's cross-attention keys and values for `encoder_out`, and its mask."""
        layers = self.decoder.layers
        token_rows = self._token_rows(encoder_out.padding_mask)
        memory = encoder_out.out if token_rows is None else token_rows.pack(encoder_out.out)
        # project_kv gives keys and values (B, H, S, Dh) per layer; stacked as (L, 2, B, H, S, Dh)
        # in one copy.
        keys_values = [part for layer in layers for part in layer.encoder_attn.project_kv(memory, token_rows)]
        cross_kv = torch.stack(keys_values).unflatten(0, (len(layers), 2))
        # An additive float mask (0 or -inf), made once: a bool mask would be converted on every call.
        allowed = key_padding_to_attn_mask(encoder_out.padding_mask)  # (B, 1, 1, S)
        cross_mask = torch.zeros(allowed.shape, dtype=cross_kv.dtype, device=cross_kv.device).masked_fill(
            allowed.logical_not(), float("-inf"))
        return CrossAttentionState(cross_kv, cross_mask)

    def _advance(self, prev_tokens: Tensor, cache: DecoderCache) -> Tensor:
        """decode_step on a started cache."""
        start = cache.length
        new_tokens = prev_tokens[:, start:]  # (B*K, n)
        n = new_tokens.size(1)
        if n == 0:
            raise ValueError(f"decode_step got {prev_tokens.size(1)} tokens but the cache already holds {start}")
        cache.ensure_capacity(start + n)
        x = self.decoder.embed(new_tokens, start)
        hidden = self.decoder.forward_cached(x, cache.cross, cache.self_attn.layers(start, n))  # (B*K, n, D)
        cache.length = start + n
        return self._log_probs(hidden[:, -1])

    def _log_probs(self, hidden: Tensor) -> Tensor:
        """Last hidden states (N, D) -> float32 log-probabilities (N, V)."""
        projection = self.decoder.output_projection
        if self.decoding.onednn_logits and isinstance(projection, nn.Linear):
            logits = vocabulary_logits(hidden, projection.weight, projection.bias)
        else:  # F.linear, or a CPU inference layer (Int8Linear, PackedLinear)
            logits = projection(hidden)
        if logits.dtype == torch.float32 and logits.device.type == "cpu":
            # In place: each row is normalised while it is still in the CPU's cache, and
            # no second (N, V) buffer is written.
            return torch.log_softmax(logits, dim=-1, out=logits)
        # dtype= reads bf16/fp16 logits directly: no float32 copy of them is written first.
        return F.log_softmax(logits, dim=-1, dtype=torch.float32)

    # ---- fixed-shape steps (CUDA graphs: nmt_cli/decode/graphs.py) ----

    def prepare_static_step(self, cache: DecoderCache) -> None:
        """Make room in `cache` (and the position table) for the next token, on the host,
        so that `decode_step_static` itself needs no host checks."""
        length = cache.length + 1
        cache.ensure_capacity(length)
        self.decoder.embed_positions.prepare(length)

    @torch.no_grad()
    def decode_step_static(self, new_tokens: Tensor, index: Tensor, self_kv: Tensor, cross_kv: Tensor,
                           cross_mask: Tensor) -> Tensor:
        """decode_step for one new token per row (B*K, 1) at position `index` (a () long
        tensor), on a zeroed row-major cache's buffers (RowMajorKV.kv, CrossAttentionState's
        kv and mask), passed one by one: a captured step must keep reading these very
        buffers, whatever the cache holds later. It neither reads nor updates the cache's
        length. Shapes and memory do not depend on the position and no value goes to the
        host, so a CUDA graph can capture it. Call `prepare_static_step` first.
        -> float32 log-probabilities (B*K, V).
        """
        self_caches = RowMajorKV(self_kv).fixed_shape_layers(index)
        x = self.decoder.embed_at(new_tokens, index)
        hidden = self.decoder.forward_cached(x, CrossAttentionState(cross_kv, cross_mask), self_caches)  # (B*K, 1, D)
        return self._log_probs(hidden[:, -1])


def _alike_rows_per_sentence(tokens: Tensor, sentences: int) -> int:
    """K when tokens (B*K, n) hold K equal rows for each of the B sentences, else 1."""
    K, rest = divmod(tokens.size(0), sentences)
    if K < 2 or rest:
        return 1
    per_sentence = tokens.view(sentences, K, tokens.size(1))
    return K if bool(per_sentence.eq(per_sentence[:, :1]).all()) else 1
