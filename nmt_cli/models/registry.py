"""Named architectures: a plain dict of ModelConfig presets, and the model factory.

Variants are made with `resolve_config(arch, overrides)` (dataclasses.replace), e.g.
from the `--encoder-layers`, `--dropout`, ... flags of `nmt train` and `nmt info`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from torch import Tensor, nn

from nmt_cli.config import ModelConfig
from nmt_cli.errors import NmtError
from nmt_cli.models.fast.options import DecodingOptions
from nmt_cli.models.size import check_model_fits
from nmt_cli.models.transformer import Transformer

ARCHITECTURES: dict[str, ModelConfig] = {
    # Vaswani et al. (2017), Table 3 "base": 65M parameters with a 37k shared vocabulary.
    "transformer_base": ModelConfig(
        encoder_embed_dim=512, encoder_ffn_embed_dim=2048, encoder_layers=6, encoder_attention_heads=8,
        decoder_embed_dim=512, decoder_ffn_embed_dim=2048, decoder_layers=6, decoder_attention_heads=8,
        dropout=0.1,
    ),
    # Table 3 "big": 213M parameters; dropout 0.3 for En-De (the paper used 0.1 for En-Fr).
    "transformer_big": ModelConfig(
        encoder_embed_dim=1024, encoder_ffn_embed_dim=4096, encoder_layers=6, encoder_attention_heads=16,
        decoder_embed_dim=1024, decoder_ffn_embed_dim=4096, decoder_layers=6, decoder_attention_heads=16,
        dropout=0.3,
    ),
    # fairseq's IWSLT'14 De-En recipe.
    "transformer_iwslt_de_en": ModelConfig(
        encoder_embed_dim=512, encoder_ffn_embed_dim=1024, encoder_layers=6, encoder_attention_heads=4,
        decoder_embed_dim=512, decoder_ffn_embed_dim=1024, decoder_layers=6, decoder_attention_heads=4,
        dropout=0.3,
    ),
    # Small data sets (Multi30k, quick experiments).
    "transformer_small": ModelConfig(
        encoder_embed_dim=256, encoder_ffn_embed_dim=1024, encoder_layers=3, encoder_attention_heads=4,
        decoder_embed_dim=256, decoder_ffn_embed_dim=1024, decoder_layers=3, decoder_attention_heads=4,
        dropout=0.1,
    ),
    # Tests and smoke runs: trains in seconds on a CPU.
    "transformer_tiny": ModelConfig(
        encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_layers=2, encoder_attention_heads=2,
        decoder_embed_dim=32, decoder_ffn_embed_dim=64, decoder_layers=2, decoder_attention_heads=2,
        dropout=0.1,
    ),
}


def resolve_config(arch: str, overrides: dict[str, Any]) -> ModelConfig:
    """The preset `arch` with some fields replaced (keys are ModelConfig field names)."""
    if arch not in ARCHITECTURES:
        raise NmtError(f"unknown architecture {arch!r}; choose one of: {', '.join(ARCHITECTURES)}")
    known = {field.name for field in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise NmtError(f"unknown model config fields: {', '.join(unknown)}")
    return dataclasses.replace(ARCHITECTURES[arch], **overrides)


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, initialise: bool = True,
                decoding: DecodingOptions = DecodingOptions(), lane_mask_dropout: bool = True) -> Transformer:
    """A freshly initialised Transformer for the given vocabulary sizes, with the speed
    work `decoding` and `lane_mask_dropout` select (see Transformer).

    `initialise=False` leaves the weights as allocated, uninitialised memory, for a
    caller that loads every one of them next: the random initialisation it skips is most
    of the time to load a large model for translation on a CPU.

    NmtError, before anything is allocated, for a model too big for this machine's memory
    (every command builds its models here: train, translate, info, import-fairseq).
    """
    check_model_fits(cfg, src_vocab_size, tgt_vocab_size)
    if initialise:
        return Transformer(cfg, src_vocab_size, tgt_vocab_size, decoding, lane_mask_dropout)
    with _init_functions_skipped():
        return Transformer(cfg, src_vocab_size, tgt_vocab_size, decoding, lane_mask_dropout)


@contextlib.contextmanager
def _init_functions_skipped() -> Iterator[None]:
    """Within it, torch.nn.init's in-place initialisers (which the model's layers and
    torch's own call as they are built) leave their tensor as it is. Not thread-safe:
    it swaps module attributes of torch.nn.init for its duration."""
    names = [name for name in vars(nn.init) if name.endswith("_") and not name.startswith("_")]
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, _leave_as_is)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def _leave_as_is(tensor: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    return tensor


def matching_architecture(cfg: ModelConfig) -> str | None:
    """The preset name whose sizes and options equal `cfg`'s (dropouts ignored), if any."""
    ignore = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
    for name, preset in ARCHITECTURES.items():
        if dataclasses.replace(preset, **ignore) == dataclasses.replace(cfg, **ignore):
            return name
    return None
