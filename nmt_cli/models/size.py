"""A model's size and work from its config alone, and the refusal of a model too big to build or train.

The counts are arithmetic on the config's numbers, so they take no time and no memory
whatever those numbers are: a model is checked before torch allocates it, or fails
to (a huge dimension overflows torch's size computation, and a huge number of layers
takes minutes and gigabytes to build even on the meta device). They follow the modules
of transformer.py and layers.py; tests/test_model.py checks them against built models.
"""

from __future__ import annotations

import torch

from nmt_cli.config import ModelConfig
from nmt_cli.data.dictionary import PAD_ID
from nmt_cli.errors import NmtError
from nmt_cli.host_memory import physical_memory_bytes
from nmt_cli.models.transformer import check_vocab_sizes

FLOAT32_BYTES = 4
# torch computes a storage's size in bytes as an int64; a larger one overflows.
TORCH_MAX_BYTES = 2**63 - 1
# The Python and torch objects of one built layer, besides its weights, take more than
# this (CPython 3.11, torch 2.x). A lower bound, so that no model that fits is
# refused; it matters for many narrow layers, whose weights are small.
LAYER_OBJECT_BYTES = 10_000
# Float32 tensors of a parameter's size that training holds at least: the weight, its
# gradient and Adam's two moments.
TRAINING_COPIES = 4
# The flags that make a model smaller, for the messages that refuse one.
SIZE_FLAGS = ("--encoder-layers, --decoder-layers, --encoder-embed-dim, --decoder-embed-dim, "
              "--encoder-ffn-embed-dim or --decoder-ffn-embed-dim")


def _linear(in_dim: int, out_dim: int) -> int:
    return in_dim * out_dim + out_dim  # weight and bias


def _layer_norm(dim: int) -> int:
    return 2 * dim  # weight and bias


def encoder_layer_parameters(dim: int, ffn_dim: int) -> int:
    """An EncoderLayer: fused q/k/v and output projections, feed-forward, two LayerNorms."""
    self_attention = _linear(dim, 3 * dim) + _linear(dim, dim)
    feed_forward = _linear(dim, ffn_dim) + _linear(ffn_dim, dim)
    return self_attention + feed_forward + 2 * _layer_norm(dim)


def decoder_layer_parameters(dim: int, ffn_dim: int, encoder_dim: int) -> int:
    """A DecoderLayer: self-attention, cross-attention whose keys and values come from
    the encoder's dimension (fairseq's kdim/vdim), feed-forward, three LayerNorms."""
    self_attention = _linear(dim, 3 * dim) + _linear(dim, dim)
    cross_attention = _linear(dim, dim) + _linear(encoder_dim, 2 * dim) + _linear(dim, dim)
    feed_forward = _linear(dim, ffn_dim) + _linear(ffn_dim, dim)
    return self_attention + cross_attention + feed_forward + 3 * _layer_norm(dim)


def position_rows(max_positions: int) -> int:
    """Rows of a position table: positions are numbered from PAD_ID + 1 (fairseq's numbering)."""
    return max_positions + PAD_ID + 1


def parameter_counts(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> dict[str, int]:
    """The parameters of `build_model(cfg, src_vocab_size, tgt_vocab_size)` by part:
    "embeddings" (token embeddings, output projection, learned positions), "encoder",
    "decoder" and "total". A tied matrix counts once, as model.parameters() lists it.
    NmtError for vocabulary sizes the model cannot have."""
    check_vocab_sizes(cfg, src_vocab_size, tgt_vocab_size)
    enc_dim, dec_dim = cfg.encoder_embed_dim, cfg.decoder_embed_dim
    embeddings = src_vocab_size * enc_dim
    if not cfg.share_all_embeddings:  # shared: one matrix for both inputs and the output
        embeddings += tgt_vocab_size * dec_dim
        if not cfg.share_decoder_input_output_embed:
            embeddings += tgt_vocab_size * dec_dim  # the output projection's weight
    embeddings += tgt_vocab_size * cfg.output_bias + dec_dim * cfg.start_embedding
    if cfg.learned_pos:  # sinusoids are a buffer, not parameters
        embeddings += position_rows(cfg.max_source_positions) * enc_dim
        embeddings += position_rows(cfg.max_target_positions) * dec_dim
    encoder = cfg.encoder_layers * encoder_layer_parameters(enc_dim, cfg.encoder_ffn_embed_dim)
    decoder = cfg.decoder_layers * decoder_layer_parameters(dec_dim, cfg.decoder_ffn_embed_dim, enc_dim)
    if cfg.normalize_before:  # pre-norm ends each stack with a LayerNorm
        encoder += _layer_norm(enc_dim)
        decoder += _layer_norm(dec_dim)
    return {"embeddings": embeddings, "encoder": encoder, "decoder": decoder,
            "total": embeddings + encoder + decoder}


def sinusoid_table_values(cfg: ModelConfig) -> int:
    """Values in the float32 sinusoid tables that a model of `cfg` builds (0 with learned positions)."""
    if cfg.learned_pos:
        return 0
    return (position_rows(cfg.max_source_positions) * cfg.encoder_embed_dim
            + position_rows(cfg.max_target_positions) * cfg.decoder_embed_dim)


def training_matmul_flops(cfg: ModelConfig, sentences: int, src_len: int, tgt_len: int, tgt_vocab_size: int) -> int:
    """Floating-point operations of the matrix products in one training update on
    `sentences` pairs of `src_len` source and `tgt_len` target tokens, no padding.

    A product of (m, k) by (k, n) counts 2mkn; the backward pass twice the forward (the
    gradients of both factors). Attention's score and value products count whole, the
    half that a causal mask hides included (a fused kernel may skip it; it is a small
    part at translation's lengths). Elementwise work (LayerNorm, softmax, the loss) is
    left out: this is the work whose rate a device's matrix units bound.
    """
    enc, dec = cfg.encoder_embed_dim, cfg.decoder_embed_dim
    src_tokens, tgt_tokens = sentences * src_len, sentences * tgt_len
    encoder_layer = (src_tokens * (4 * enc * enc + 2 * enc * cfg.encoder_ffn_embed_dim)  # q/k/v, out, feed-forward
                     + 2 * sentences * src_len * src_len * enc)  # scores and their weighted sum
    decoder_layer = (tgt_tokens * (6 * dec * dec + 2 * dec * cfg.decoder_ffn_embed_dim)  # self q/k/v, out; cross q, out
                     + src_tokens * 2 * enc * dec  # cross-attention keys and values
                     + 2 * sentences * tgt_len * tgt_len * dec  # self-attention
                     + 2 * sentences * tgt_len * src_len * dec)  # cross-attention
    output_projection = tgt_tokens * dec * tgt_vocab_size
    forward_macs = cfg.encoder_layers * encoder_layer + cfg.decoder_layers * decoder_layer + output_projection
    return 3 * 2 * forward_macs


GB_SHOWN = 5 * 10**7  # the least size that _gb shows as more than 0.0 GB


def _gb(size: int) -> str:
    tenths = (size + GB_SHOWN) // 10**8  # in integers: exact however large
    return f"{tenths // 10:,}.{tenths % 10} GB"


def check_model_fits(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
    """NmtError, in one line, for a model that this machine's physical memory cannot
    hold: building it would fail in torch or exhaust the machine.

    Where the system does not say how much memory it has, only models whose size torch
    cannot even compute are refused.
    """
    parameters = parameter_counts(cfg, src_vocab_size, tgt_vocab_size)["total"]
    weights = FLOAT32_BYTES * parameters
    tables = FLOAT32_BYTES * sinusoid_table_values(cfg)
    layers = cfg.encoder_layers + cfg.decoder_layers
    objects = LAYER_OBJECT_BYTES * layers
    memory = physical_memory_bytes()
    limit = memory if memory is not None else TORCH_MAX_BYTES
    if weights + tables + objects <= limit:
        return
    than = f"this machine's {_gb(memory)} of memory" if memory is not None else "the 2^63 bytes that torch can address"
    if weights > limit:
        raise NmtError(f"this model has {parameters:,} parameters: its float32 weights alone need {_gb(weights)}, "
                       f"more than {than}")
    # The weights fit, so large position tables or many layers make the rest: name them
    # (parts below 0.05 GB would show as 0.0 and are left out).
    parts = [f"{_gb(weights)} for its {parameters:,} parameters in float32"]
    if tables >= GB_SHOWN:
        parts.append(f"{_gb(tables)} for its sinusoidal position tables (--max-source-positions "
                     f"{cfg.max_source_positions}, --max-target-positions {cfg.max_target_positions})")
    if objects >= GB_SHOWN:
        parts.append(f"{_gb(objects)} for the torch modules of its {layers:,} layers")
    raise NmtError(f"this model needs at least {_gb(weights + tables + objects)}, more than {than}: "
                   f"{', '.join(parts)}")


def device_memory_bytes(device: torch.device) -> int | None:
    """The memory that a model on `device` lives in: the GPU's, else the machine's
    physical memory (None where the system does not say)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return physical_memory_bytes()


def check_training_fits(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, device: torch.device,
                        pure_bf16: bool = False, ema: bool = False) -> None:
    """NmtError, in one line, for a model whose training cannot fit in `device`'s memory:
    its float32 weights, their gradients and Adam's two moments, under pure-bf16 also the
    bf16 working copy and its gradients, with an EMA its float32 copy (a lower bound:
    activations come on top). Nothing is refused where the memory size is unknown."""
    memory = device_memory_bytes(device)
    if memory is None:
        return
    parameters = parameter_counts(cfg, src_vocab_size, tgt_vocab_size)["total"]
    weights = FLOAT32_BYTES * parameters
    parts = [(TRAINING_COPIES * weights,
              f"for its {parameters:,} parameters' float32 weights, gradients and Adam's two moments")]
    if pure_bf16:  # 2 + 2 bytes a parameter
        parts.append((weights, "for the bf16 working copy and its gradients (--precision pure-bf16)"))
    if ema:
        parts.append((weights, "for the float32 moving average (--ema-decay)"))
    if device.type == "cpu":  # built on the host: check_model_fits counts the rest there
        rest = FLOAT32_BYTES * sinusoid_table_values(cfg) + LAYER_OBJECT_BYTES * (cfg.encoder_layers + cfg.decoder_layers)
        parts.append((rest, "for its position tables and torch modules"))
    needed = sum(size for size, _ in parts)
    if needed <= memory:
        return
    where = "this machine's" if device.type == "cpu" else f"{device}'s"
    shown = ", ".join(f"{_gb(size)} {what}" for i, (size, what) in enumerate(parts) if i == 0 or size >= GB_SHOWN)
    raise NmtError(f"training this model needs at least {_gb(needed)}, more than {where} {_gb(memory)} of memory "
                   f"({shown}); lower {SIZE_FLAGS}")
