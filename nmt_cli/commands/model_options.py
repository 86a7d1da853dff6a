"""click options that override fields of an architecture preset (shared by `train` and `info`).

Each option defaults to None, meaning "keep the preset's value"; `overrides_from`
picks the options that were given, ready for `resolve_config(arch, overrides)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

# (flag, ModelConfig field, type, help). Flag names are fairseq's.
_VALUE_OPTIONS: tuple[tuple[str, str, Any, str], ...] = (
    ("--encoder-embed-dim", "encoder_embed_dim", int, "Encoder model dimension (d_model)."),
    ("--encoder-ffn-embed-dim", "encoder_ffn_embed_dim", int, "Encoder feed-forward inner dimension (d_ff)."),
    ("--encoder-layers", "encoder_layers", int, "Number of encoder layers."),
    ("--encoder-attention-heads", "encoder_attention_heads", int, "Encoder attention heads."),
    ("--decoder-embed-dim", "decoder_embed_dim", int, "Decoder model dimension (d_model)."),
    ("--decoder-ffn-embed-dim", "decoder_ffn_embed_dim", int, "Decoder feed-forward inner dimension (d_ff)."),
    ("--decoder-layers", "decoder_layers", int, "Number of decoder layers."),
    ("--decoder-attention-heads", "decoder_attention_heads", int, "Decoder attention heads."),
    ("--dropout", "dropout", float, "Dropout on embeddings and sub-layer outputs."),
    ("--attention-dropout", "attention_dropout", float, "Dropout on attention weights."),
    ("--activation-dropout", "activation_dropout", float, "Dropout after the feed-forward ReLU."),
    ("--max-source-positions", "max_source_positions", int, "Longest source sentence (tokens) the model accepts."),
    ("--max-target-positions", "max_target_positions", int, "Longest target sentence (tokens) the model accepts."),
)

# (flag stem, ModelConfig field, help) for on/off switches.
_SWITCH_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("normalize-before", "normalize_before",
     "LayerNorm before each sub-layer (pre-norm) instead of after it (post-norm, the paper's)."),
    ("share-all-embeddings", "share_all_embeddings",
     "One embedding matrix for encoder input, decoder input and output (needs a joined dictionary)."),
    ("share-decoder-input-output-embed", "share_decoder_input_output_embed",
     "Tie the decoder input embedding to the output projection."),
    ("learned-pos", "learned_pos", "Learned position embeddings instead of sinusoids."),
    ("scale-embedding", "scale_embedding", "Multiply token embeddings by sqrt(d_model) (the paper's)."),
)

MODEL_FIELDS: tuple[str, ...] = tuple(f for _, f, _, _ in _VALUE_OPTIONS) + tuple(f for _, f, _ in _SWITCH_OPTIONS)


def model_options(func: Callable) -> Callable:
    """Add the architecture override options to a click command (each defaults to None)."""
    decorators = [
        click.option(flag, field, type=kind, default=None, help=f"{text} [default: the --arch preset's]")
        for flag, field, kind, text in _VALUE_OPTIONS
    ] + [
        click.option(f"--{stem}/--no-{stem}", field, default=None, help=f"{text} [default: the --arch preset's]")
        for stem, field, text in _SWITCH_OPTIONS
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def overrides_from(params: dict[str, Any]) -> dict[str, Any]:
    """The model options that were given (not None), keyed by ModelConfig field name."""
    return {field: params[field] for field in MODEL_FIELDS if params.get(field) is not None}
