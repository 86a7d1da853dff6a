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


def _same_sides(dim: int, ffn: int, layers: int, heads: int, dropout: float) -> ModelConfig:
    """An encoder and a decoder of the same shape, as every preset here has."""
    return ModelConfig(
        encoder_embed_dim=dim, encoder_ffn_embed_dim=ffn, encoder_layers=layers, encoder_attention_heads=heads,
        decoder_embed_dim=dim, decoder_ffn_embed_dim=ffn, decoder_layers=layers, decoder_attention_heads=heads,
        dropout=dropout,
    )


ARCHITECTURES: dict[str, ModelConfig] = {
    # Vaswani et al. (2017), Table 3 "base": 65M parameters with a 37k shared vocabulary.
    "transformer_base": _same_sides(dim=512, ffn=2048, layers=6, heads=8, dropout=0.1),
    # Table 3 "big": 213M parameters; dropout 0.3 for En-De (the paper used 0.1 for En-Fr).
    "transformer_big": _same_sides(dim=1024, ffn=4096, layers=6, heads=16, dropout=0.3),
    # fairseq's IWSLT'14 De-En recipe.
    "transformer_iwslt_de_en": _same_sides(dim=512, ffn=1024, layers=6, heads=4, dropout=0.3),
    # Small data sets (Multi30k, quick experiments).
    "transformer_small": _same_sides(dim=256, ffn=1024, layers=3, heads=4, dropout=0.1),
    # Tests and smoke runs: trains in seconds on a CPU.
    "transformer_tiny": _same_sides(dim=32, ffn=64, layers=2, heads=2, dropout=0.1),
}
# fairseq's names of the same Transformers, with fairseq's preset values, so that its
# commands run unchanged (fairseq/models/transformer/transformer_legacy.py).
_BIG = ARCHITECTURES["transformer_big"]
ARCHITECTURES |= {
    "transformer": ARCHITECTURES["transformer_base"],
    "transformer_wmt_en_de": ARCHITECTURES["transformer_base"],
    "transformer_vaswani_wmt_en_de_big": _BIG,
    "transformer_vaswani_wmt_en_fr_big": dataclasses.replace(_BIG, dropout=0.1),
    "transformer_wmt_en_de_big": dataclasses.replace(_BIG, attention_dropout=0.1),
    "transformer_wmt_en_de_big_t2t": dataclasses.replace(_BIG, attention_dropout=0.1, activation_dropout=0.1,
                                                         normalize_before=True),
}
# The presets whose decoder takes the encoder's width and feed-forward width unless given
# its own: fairseq's base_architecture, which `transformer` and `transformer_wmt_en_de` are
# (`--arch transformer --encoder-embed-dim 256` is 256 wide on both sides there).
DECODER_FOLLOWS_ENCODER = {"transformer", "transformer_wmt_en_de"}
_FOLLOWED = {"decoder_embed_dim": "encoder_embed_dim", "decoder_ffn_embed_dim": "encoder_ffn_embed_dim"}


def resolve_config(arch: str, overrides: dict[str, Any]) -> ModelConfig:
    """The preset `arch` with some fields replaced (keys are ModelConfig field names)."""
    if arch not in ARCHITECTURES:
        raise NmtError(f"unknown architecture {arch!r}; choose one of: {', '.join(ARCHITECTURES)}")
    known = {field.name for field in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise NmtError(f"unknown model config fields: {', '.join(unknown)}")
    if arch in DECODER_FOLLOWS_ENCODER:
        overrides = {**{decoder: overrides[encoder] for decoder, encoder in _FOLLOWED.items() if encoder in overrides},
                     **overrides}
    cfg = dataclasses.replace(ARCHITECTURES[arch], **overrides)
    # One matrix serves encoder input, decoder input and output: asked to untie the last two,
    # the model would share them anyway, so the request is refused rather than ignored.
    if cfg.share_all_embeddings and overrides.get("share_decoder_input_output_embed") is False:
        raise NmtError("--share-all-embeddings ties the decoder's input and output embeddings too: "
                       "drop --no-share-decoder-input-output-embed, or share less")
    return cfg


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, initialise: bool = True,
                decoding: DecodingOptions = DecodingOptions(), lane_mask_dropout: bool = True) -> Transformer:
    """A freshly initialised Transformer for the given vocabulary sizes, with the speed
    work `decoding` and `lane_mask_dropout` select (see Transformer).

    `initialise=False` leaves the weights as allocated, uninitialised memory, for a
    caller that loads every one of them next: the random initialisation it skips is most
    of the time to load a large model for translation on a CPU.

    NmtError, before anything is allocated, for a model too big for this machine's memory
    (every command builds its models here: train, the commands that load a checkpoint through
    nmt_cli.checkpoints.format, info, import-fairseq and import-marian).
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
