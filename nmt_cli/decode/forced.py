"""Teacher forcing over given translations: the model's per-token log-probabilities of a
target (`--score-reference` of translate and generate) and a decoder layer's
cross-attention over the source (`--print-alignment`).

Both run the whole target through the model at once, after search or instead of it,
so plain decoding computes nothing for them. Teacher forcing gives the same numbers
as the incremental steps of search (tests/test_model.py checks that they agree), so the
alignment of a hypothesis is the attention its search steps had.

Shapes: B sentences, S source length, T target length (with its `</s>`), V vocabulary,
H heads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from nmt_cli.data.dictionary import EOS_ID, PAD_ID
from nmt_cli.models.layers import key_padding_to_attn_mask, split_heads
from nmt_cli.models.transformer import Transformer


def previous_tokens(tgt_tokens: Tensor) -> Tensor:
    """Target (B, T), right-padded, each row ending in `</s>` -> the decoder's input:
    `</s>` (the BOS) then the target shifted right by one."""
    prev = torch.full_like(tgt_tokens, PAD_ID)
    prev[:, 0] = EOS_ID
    prev[:, 1:] = tgt_tokens[:, :-1]
    return prev.masked_fill(tgt_tokens.eq(PAD_ID), PAD_ID)


@torch.no_grad()
def token_log_probs(models: Sequence[Transformer], src_tokens: Tensor, tgt_tokens: Tensor) -> Tensor:
    """Per-token log-probabilities (B, T), float32, of `tgt_tokens` (B, T) given
    `src_tokens` (B, S), both right-padded with `<pad>` and ending in `</s>`; 0 at pads.

    Several models are an ensemble: probabilities averaged, as in search (decode/ensemble.py).
    """
    prev = previous_tokens(tgt_tokens)
    per_model = []
    for model in models:
        logits = model(src_tokens, prev).float()  # (B, T, V)
        per_model.append(torch.log_softmax(logits, dim=-1).gather(2, tgt_tokens.unsqueeze(2)).squeeze(2))
    lprobs = per_model[0] if len(per_model) == 1 else torch.logsumexp(torch.stack(per_model), 0) - math.log(len(models))
    return lprobs.masked_fill(tgt_tokens.eq(PAD_ID), 0.0)


def reference_log_probs(models: Sequence[Transformer], src_tokens: Tensor,
                        references: Sequence[Sequence[int]]) -> list[Tensor]:
    """Each reference's per-token log-probabilities (T_i,), float32 on the CPU, given the
    sources `src_tokens` (B, S); each reference is an id list ending in `</s>`."""
    lprobs = token_log_probs(models, src_tokens, pad_rows(references, src_tokens.device)).cpu()
    return [row[: len(ids)] for row, ids in zip(lprobs, references)]


@torch.no_grad()
def cross_attention(models: Sequence[Transformer], src_tokens: Tensor, tgt_tokens: Tensor,
                    layer: int) -> Tensor:
    """Decoder layer `layer`'s cross-attention probabilities averaged over heads, (B, T, S):
    row t is the attention of the position that predicts target token t. A negative `layer`
    counts from the last. An ensemble's attention is the mean of its models' (each at its
    own `layer`), as fairseq's ensemble returns it."""
    total = sum(_layer_cross_attention(m, src_tokens, tgt_tokens, layer % len(m.decoder.layers)) for m in models)
    return total / len(models)


def _layer_cross_attention(model: Transformer, src_tokens: Tensor, tgt_tokens: Tensor, layer: int) -> Tensor:
    encoder_out = model.encoder(src_tokens)
    decoder = model.decoder
    x = decoder.embed(previous_tokens(tgt_tokens), None)  # (B, T, D)
    allowed = key_padding_to_attn_mask(encoder_out.padding_mask)  # (B, 1, 1, S)
    for i, block in enumerate(decoder.layers):
        if i < layer:
            x = block(x, block.encoder_attn.project_kv(encoder_out.out), allowed)
            continue
        # This layer's self-attention, then its cross-attention's probabilities (as
        # CrossAttention.forward computes them inside scaled_dot_product_attention).
        w = block.wiring
        x = w.after(block.self_attn(w.before(x, block.self_attn_layer_norm), None, True), x, block.self_attn_layer_norm)
        attn = block.encoder_attn
        (q,) = split_heads(attn.q_proj(w.before(x, block.encoder_attn_layer_norm)), 1, attn.num_heads)  # (B, H, T, Dh)
        keys, _ = attn.project_kv(encoder_out.out)  # (B, H, S, Dh)
        scores = (q.float() @ keys.float().transpose(-1, -2)) / math.sqrt(q.size(-1))  # (B, H, T, S)
        probs = torch.softmax(scores.masked_fill(allowed.logical_not(), -math.inf), dim=-1)
        return probs.mean(dim=1)
    raise ValueError(f"layer {layer} is outside the decoder's {len(decoder.layers)} layers")


def hard_alignment(models: Sequence[Transformer], src_tokens: Tensor, tgt_rows: Sequence[Sequence[int]],
                   layer: int) -> list[list[int]]:
    """For each target (an id list ending in `</s>`) of the sources `src_tokens` (N, S), the
    source position each of its tokens but the `</s>` attends most in decoder layer
    `layer` (fairseq's hard alignment); the source's `</s>` and pads are never chosen."""
    attention = cross_attention(models, src_tokens, pad_rows(tgt_rows, src_tokens.device), layer)  # (N, T, S)
    lengths = src_tokens.ne(PAD_ID).sum(dim=1, keepdim=True)
    words = torch.arange(src_tokens.size(1), device=src_tokens.device) < lengths - 1  # (N, S)
    best = attention.masked_fill(words.logical_not().unsqueeze(1), -math.inf).argmax(dim=-1).cpu()  # (N, T)
    return [row[: len(tgt) - 1].tolist() for row, tgt in zip(best, tgt_rows)]


def pad_rows(rows: Sequence[Sequence[int]], device: torch.device) -> Tensor:
    """Right-pad id lists into a (B, T) tensor."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
    return out.to(device)
