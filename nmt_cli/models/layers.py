"""Transformer building blocks: positions, attention, encoder and decoder layers.

Parameter names follow fairseq's `TransformerModel` (`self_attn`, `self_attn_layer_norm`,
`encoder_attn`, `encoder_attn_layer_norm`, `fc1`, `fc2`, `final_layer_norm`), so that a
fairseq checkpoint maps onto this model by renaming alone. The one structural
difference: query/key/value projections are fused for speed.

* `SelfAttention.in_proj.weight` (3D, D) = cat([q_proj.weight, k_proj.weight,
  v_proj.weight]) and likewise for the bias (the layout of
  `torch.nn.MultiheadAttention.in_proj_weight`).
* `CrossAttention.q_proj` is fairseq's `q_proj`; `CrossAttention.kv_proj.weight`
  (2D, D) = cat([k_proj.weight, v_proj.weight]).

Shapes: B batch, S source length, T target length, D model dim, H heads, Dh = D / H.
Padding masks are bool, True at pads; attention masks given to
`scaled_dot_product_attention` are bool, True where attention is allowed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from nmt_cli.errors import NmtError
from nmt_cli.models.fast.dropout import maybe_dropout

if TYPE_CHECKING:
    from nmt_cli.models.decoding_state import LayerKV
    from nmt_cli.models.fast.token_rows import TokenRows


def sinusoidal_table(num_positions: int, dim: int, padding_idx: int) -> Tensor:
    """fairseq's sinusoid table (num_positions, dim), float32: [sin | cos] halves.

    Frequency i is exp(-log(10000) * i / (half_dim - 1)); the row at `padding_idx`
    is zero, so pads get no position signal. Computed in float32 as fairseq does.
    """
    half_dim = dim // 2
    step = math.log(10000) / (half_dim - 1)
    freqs = torch.exp(torch.arange(half_dim, dtype=torch.float32) * -step)  # (D/2,)
    angles = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # (N, 2 * (D/2))
    if dim % 2 == 1:
        table = torch.cat([table, torch.zeros(num_positions, 1)], dim=1)
    table[padding_idx, :] = 0
    return table


def marian_sinusoid_table(num_positions: int, dim: int) -> Tensor:
    """Marian's sinusoid table (num_positions, dim), float32, as Hugging Face's MarianMTModel
    computes it: position p, frequency i is p / 10000^(2i/dim) (the paper's), the sines in
    the first half and the cosines in the second, computed in float64 and rounded once."""
    sines = (dim + 1) // 2
    positions = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    angles = positions / torch.pow(10000.0, 2 * torch.arange(sines, dtype=torch.float64) / dim)  # (N, ceil(D/2))
    return torch.cat([torch.sin(angles), torch.cos(angles[:, : dim // 2])], dim=1).float()


def make_positions(tokens: Tensor, padding_idx: int) -> Tensor:
    """Position ids (B, T): non-pad tokens count from padding_idx + 1; pads get padding_idx."""
    not_pad = tokens.ne(padding_idx).int()
    return (torch.cumsum(not_pad, dim=1) * not_pad).long() + padding_idx


def step_positions(start: int, length: int, padding_idx: int, device: torch.device) -> Tensor:
    """Position ids (1, length) for tokens start..start+length-1 of an unpadded prefix."""
    first = padding_idx + 1 + start
    return torch.arange(first, first + length, device=device).unsqueeze(0)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal position embeddings; the table grows when a longer input arrives."""

    def __init__(self, dim: int, padding_idx: int, max_positions: int) -> None:
        super().__init__()
        self.dim = dim
        self.padding_idx = padding_idx
        # Not saved in checkpoints: it is a pure function of (dim, padding_idx).
        table = sinusoidal_table(max_positions + padding_idx + 1, dim, padding_idx)  # (N, D)
        self.register_buffer("table", table, persistent=False)

    def forward(self, tokens: Tensor, start: int | None = None) -> Tensor:
        """(B, T) tokens -> (B, T, D); or (1, T, D) for an incremental step at `start`."""
        length = tokens.size(1)
        self.prepare(length + (start or 0))
        if start is None:
            positions = make_positions(tokens, self.padding_idx)
        else:
            positions = step_positions(start, length, self.padding_idx, tokens.device)
        return self.table[positions]

    def prepare(self, length: int) -> None:
        """Make room for `length` positions, before `at` is called without host checks."""
        last = self.padding_idx + length
        if last >= self.table.size(0):
            size = max(last + 1, 2 * self.table.size(0))
            self.table = sinusoidal_table(size, self.dim, self.padding_idx).to(self.table)

    def at(self, position: Tensor) -> Tensor:
        """The embedding (1, 1, D) of 0-based position `position`, a () long tensor on the device."""
        return self.table.index_select(0, position.view(1) + (self.padding_idx + 1)).unsqueeze(0)


class MarianPositions(nn.Module):
    """Marian's fixed sinusoids (`marian_sinusoid_table`): positions count from 0 whatever
    the token, pads included (they are masked or, in the decoder, after every real token)."""

    def __init__(self, dim: int, max_positions: int) -> None:
        super().__init__()
        self.dim = dim
        self.register_buffer("table", marian_sinusoid_table(max_positions, dim), persistent=False)

    def forward(self, tokens: Tensor, start: int | None = None) -> Tensor:
        """(B, T) tokens -> (1, T, D) for positions start..start+T-1 (start None: 0)."""
        first = start or 0
        self.prepare(first + tokens.size(1))
        return self.table[first: first + tokens.size(1)].unsqueeze(0)

    def prepare(self, length: int) -> None:
        """Make room for `length` positions, before `at` is called without host checks."""
        if length > self.table.size(0):
            self.table = marian_sinusoid_table(max(length, 2 * self.table.size(0)), self.dim).to(self.table)

    def at(self, position: Tensor) -> Tensor:
        """The embedding (1, 1, D) of 0-based position `position`, a () long tensor on the device."""
        return self.table.index_select(0, position.view(1)).unsqueeze(0)


class LearnedPositions(nn.Module):
    """fairseq's LearnedPositionalEmbedding: max_positions + padding_idx + 1 rows, same numbering."""

    def __init__(self, dim: int, padding_idx: int, max_positions: int) -> None:
        super().__init__()
        self.padding_idx = padding_idx
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions + padding_idx + 1, dim))
        nn.init.normal_(self.weight, mean=0.0, std=dim**-0.5)
        with torch.no_grad():
            self.weight[padding_idx].zero_()

    def forward(self, tokens: Tensor, start: int | None = None) -> Tensor:
        """(B, T) tokens -> (B, T, D); or (1, T, D) for an incremental step at `start`."""
        length = tokens.size(1) + (start or 0)
        self.prepare(length)
        if start is None:
            positions = make_positions(tokens, self.padding_idx)
        else:
            positions = step_positions(start, tokens.size(1), self.padding_idx, tokens.device)
        return F.embedding(positions, self.weight, self.padding_idx)

    def prepare(self, length: int) -> None:
        """Check that `length` positions fit, before `at` is called without host checks."""
        if length > self.max_positions:
            raise NmtError(f"sequence of {length} tokens exceeds the model's {self.max_positions} learned positions")

    def at(self, position: Tensor) -> Tensor:
        """The embedding (1, 1, D) of 0-based position `position`, a () long tensor on the device."""
        return self.weight.index_select(0, position.view(1) + (self.padding_idx + 1)).unsqueeze(0)


def split_heads(x: Tensor, parts: int, num_heads: int) -> tuple[Tensor, ...]:
    """(B, T, parts * D) -> `parts` views (B, H, T, Dh) of x.

    Unbinding before transposing lets the backward pass stack the parts' gradients
    straight into x's layout; a stack in (B, parts, H, T, Dh) order would need a second
    copy to become x's gradient.
    """
    B, T, _ = x.shape
    return tuple(part.transpose(1, 2) for part in x.view(B, T, parts, num_heads, -1).unbind(2))


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, Dh) -> (B, T, D)."""
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)


def key_padding_to_attn_mask(padding_mask: Tensor) -> Tensor:
    """(B, S) True-at-pad -> (B, 1, 1, S) True-where-allowed, broadcast over heads and queries."""
    return padding_mask.logical_not()[:, None, None, :]


def few_query_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> Tensor:
    """Attention of a decoding step's few queries: q (B, H, n, Dh), k and v (B, H, S, Dh),
    attn_mask None or additive (B, 1, 1 or n, S) -> (B, H, n, Dh). No dropout.

    On a CPU, scaled_dot_product_attention's kernel works through B * H tiny blocks one
    by one, paying a fixed cost for each; two batched matrix products do the same work
    in one call each. Elsewhere its fused kernel is the faster one. k and v must allow a
    (B * H, S, Dh) view (the decoding cache lays them out so); k may be a transposed
    view of (B, H, Dh, S) keys, which makes the scores' product read its keys
    contiguously.
    """
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    B, H, n, Dh = q.shape
    S = k.size(2)
    scores = torch.bmm(q.reshape(B * H, n, Dh), k.view(B * H, S, Dh).transpose(1, 2))  # (B*H, n, S)
    scores = scores.view(B, H, n, S).mul_(Dh**-0.5)
    if attn_mask is not None:
        scores.add_(attn_mask)
    probs = torch.softmax(scores, dim=-1).view(B * H, n, S)
    return torch.bmm(probs, v.view(B * H, S, Dh)).view(B, H, n, Dh)


def sequence_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float,
                       is_causal: bool) -> Tensor:
    """scaled_dot_product_attention over whole sequences, as in training.

    When gradients will be computed on a CPU in bf16 or fp16, its math kernel: there the
    flash kernel's backward pass alone is slower than the math kernel's forward and
    backward together, for the same accuracy (both sum in float32; benchmarks/HISTORY.md,
    "Training on this CPU").
    """
    slow_backward = (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
                     and q.requires_grad and not torch.compiler.is_compiling())
    if not slow_backward:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused q/k/v projection."""

    def __init__(self, embed_dim: int, num_heads: int, attention_dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attention_dropout = attention_dropout
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # xavier on the fused (3D, D) matrix has the same bound as fairseq's
        # xavier(gain=1/sqrt(2)) on each of its separate (D, D) projections.
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: Tensor, attn_mask: Tensor | None, is_causal: bool,
                token_rows: TokenRows | None = None) -> Tensor:
        """Full-sequence attention: x (B, T, D) -> (B, T, D). With `token_rows`, x and the
        result hold the batch's token positions only, (N, D), and attention alone runs on
        the padded layout (nmt_cli/models/fast/token_rows.py)."""
        qkv = self.in_proj(x)
        if token_rows is not None:
            qkv = token_rows.unpack(qkv)
        q, k, v = split_heads(qkv, 3, self.num_heads)  # each (B, H, T, Dh)
        dropout = self.attention_dropout if self.training else 0.0
        out = merge_heads(sequence_attention(q, k, v, attn_mask, dropout, is_causal))
        return self.out_proj(out if token_rows is None else token_rows.pack(out))

    def forward_cached(self, x: Tensor, cache: LayerKV) -> Tensor:
        """Decoding: new tokens x (B*K, n, D) -> (B*K, n, D), attending over the earlier
        positions that `cache` holds and over one another causally; their keys and
        values are stored in `cache` (nmt_cli/models/decoding_state.py, one path per layout)."""
        return self.out_proj(cache.attend(self.in_proj(x)))  # in_proj: (B*K, n, 3 * D)


class CrossAttention(nn.Module):
    """Multi-head attention from decoder states to encoder output (keys/values computed once).

    `memory_dim` is the encoder's model dimension (fairseq's kdim/vdim).
    """

    def __init__(self, embed_dim: int, num_heads: int, attention_dropout: float, memory_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attention_dropout = attention_dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.kv_proj = nn.Linear(memory_dim, 2 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # Same per-projection bounds as fairseq's xavier(gain=1/sqrt(2)) on separate k and v.
        nn.init.xavier_uniform_(self.q_proj.weight, gain=2**-0.5)
        kv_gain = ((memory_dim + 2 * embed_dim) / (2 * (memory_dim + embed_dim))) ** 0.5
        nn.init.xavier_uniform_(self.kv_proj.weight, gain=kv_gain)
        nn.init.zeros_(self.q_proj.bias)
        nn.init.zeros_(self.kv_proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def project_kv(self, memory: Tensor, token_rows: TokenRows | None = None) -> tuple[Tensor, Tensor]:
        """Encoder output (B, S, D) -> keys and values, (B, H, S, Dh) each. With
        `token_rows`, memory holds the token positions only, (N, D); the pads' keys and
        values are zeros."""
        kv = self.kv_proj(memory)
        if token_rows is not None:
            kv = token_rows.unpack(kv)
        k, v = split_heads(kv, 2, self.num_heads)
        return k, v

    def forward(self, x: Tensor, kv: tuple[Tensor, Tensor], attn_mask: Tensor | None) -> Tensor:
        """x (B, T, D), kv from `project_kv`, attn_mask (B, 1, 1, S) -> (B, T, D).

        attn_mask is bool (True where allowed), additive float in x's dtype, or None
        (every key allowed).
        """
        (q,) = split_heads(self.q_proj(x), 1, self.num_heads)  # (B, H, T, Dh)
        dropout = self.attention_dropout if self.training else 0.0
        out = sequence_attention(q, *kv, attn_mask, dropout, False)
        return self.out_proj(merge_heads(out))

    def forward_cached(self, x: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor) -> Tensor:
        """Decoding: x (B*K, n, D) holds K target rows per source sentence, a sentence's rows
        next to each other; k, v (B, H, S, Dh) and additive attn_mask (B, 1, 1, S) are per
        sentence -> (B*K, n, D).

        The K * n queries of a sentence attend as one block, so each sentence's keys and
        values are stored and read once, not once per beam.
        """
        rows, n, D = x.shape
        B = k.size(0)
        (q,) = split_heads(self.q_proj(x).view(B, rows // B * n, D), 1, self.num_heads)  # (B, H, K*n, Dh)
        out = few_query_attention(q, k, v, attn_mask)
        return self.out_proj(merge_heads(out)).view(rows, n, D)


def _linear(in_dim: int, out_dim: int) -> nn.Linear:
    layer = nn.Linear(in_dim, out_dim)
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


# The feed-forward activations, by ModelConfig.activation_fn (fairseq's and Marian's names).
ACTIVATION_FUNCTIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class _Sublayers(nn.Module):
    """Residual wiring shared by encoder and decoder layers (post-norm or pre-norm)."""

    def __init__(self, dropout: float, activation_dropout: float, normalize_before: bool, activation: str) -> None:
        super().__init__()
        self.dropout = dropout
        self.activation_dropout = activation_dropout
        self.normalize_before = normalize_before
        self.activation = activation
        self._activate = ACTIVATION_FUNCTIONS[activation]
        self.lane_mask_dropout = True  # see nmt_cli/models/fast/dropout.py
        # True once fc1 applies the ReLU itself, as it writes its product (the CPU
        # inference layers of nmt_cli/models/fast/packed.py; only for inference).
        self.fc1_applies_relu = False

    def before(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        return norm(x) if self.normalize_before else x

    def after(self, x: Tensor, residual: Tensor, norm: nn.LayerNorm) -> Tensor:
        x = residual + maybe_dropout(x, self.dropout, self.training, self.lane_mask_dropout)
        return x if self.normalize_before else norm(x)

    def feed_forward(self, x: Tensor, fc1: nn.Module, fc2: nn.Module) -> Tensor:
        if self.fc1_applies_relu:
            return fc2(fc1(x))
        hidden = maybe_dropout(self._activate(fc1(x)), self.activation_dropout, self.training,
                               self.lane_mask_dropout)  # (B, T, ffn_dim)
        return fc2(hidden)


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each with dropout, residual and LayerNorm."""

    def __init__(self, dim: int, ffn_dim: int, heads: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, normalize_before: bool, activation: str) -> None:
        super().__init__()
        self.wiring = _Sublayers(dropout, activation_dropout, normalize_before, activation)
        self.self_attn = SelfAttention(dim, heads, attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = _linear(dim, ffn_dim)
        self.fc2 = _linear(ffn_dim, dim)
        self.final_layer_norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, attn_mask: Tensor | None, token_rows: TokenRows | None = None) -> Tensor:
        """x (B, S, D), attn_mask (B, 1, 1, S) or None (no pads) -> (B, S, D); with
        `token_rows`, x and the result are the token positions' rows (N, D)."""
        w = self.wiring
        h = self.self_attn(w.before(x, self.self_attn_layer_norm), attn_mask, False, token_rows)
        x = w.after(h, x, self.self_attn_layer_norm)
        h = w.feed_forward(w.before(x, self.final_layer_norm), self.fc1, self.fc2)
        return w.after(h, x, self.final_layer_norm)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention and feed-forward, each with residual and LayerNorm."""

    def __init__(self, dim: int, ffn_dim: int, heads: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, normalize_before: bool, encoder_dim: int, activation: str) -> None:
        super().__init__()
        self.wiring = _Sublayers(dropout, activation_dropout, normalize_before, activation)
        self.self_attn = SelfAttention(dim, heads, attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.encoder_attn = CrossAttention(dim, heads, attention_dropout, encoder_dim)
        self.encoder_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = _linear(dim, ffn_dim)
        self.fc2 = _linear(ffn_dim, dim)
        self.final_layer_norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, cross_kv: tuple[Tensor, Tensor], cross_mask: Tensor | None) -> Tensor:
        """Teacher forcing: x (B, T, D), a whole right-padded target prefix -> (B, T, D);
        cross_kv from `encoder_attn.project_kv`, cross_mask (B, 1, 1, S) or None (no pads)."""
        w = self.wiring
        h = self.self_attn(w.before(x, self.self_attn_layer_norm), None, True)
        x = w.after(h, x, self.self_attn_layer_norm)
        h = self.encoder_attn(w.before(x, self.encoder_attn_layer_norm), cross_kv, cross_mask)
        return self._feed_forward(w.after(h, x, self.encoder_attn_layer_norm))

    def forward_cached(self, x: Tensor, cross_k: Tensor, cross_v: Tensor, cross_mask: Tensor,
                       self_cache: LayerKV) -> Tensor:
        """Decoding: new tokens x (B*K, n, D) -> (B*K, n, D).

        K target rows per source sentence (see CrossAttention.forward_cached); cross_k,
        cross_v (B, H, S, Dh) and cross_mask (B, 1, 1, S) per sentence; `self_cache` this
        layer's view of the decoding cache for the new positions.
        """
        w = self.wiring
        h = self.self_attn.forward_cached(w.before(x, self.self_attn_layer_norm), self_cache)
        x = w.after(h, x, self.self_attn_layer_norm)
        h = self.encoder_attn.forward_cached(w.before(x, self.encoder_attn_layer_norm), cross_k, cross_v, cross_mask)
        return self._feed_forward(w.after(h, x, self.encoder_attn_layer_norm))

    def _feed_forward(self, x: Tensor) -> Tensor:
        w = self.wiring
        h = w.feed_forward(w.before(x, self.final_layer_norm), self.fc1, self.fc2)
        return w.after(h, x, self.final_layer_norm)
