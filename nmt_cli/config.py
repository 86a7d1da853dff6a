"""Typed configurations: the boundary between the CLI and the library.

click parses flags into these dataclasses; library code takes nothing else.
Each validates itself in `__post_init__` and raises `NmtError` on bad values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from nmt_cli.errors import NmtError


@dataclass(frozen=True)
class ModelConfig:
    """An encoder-decoder Transformer. Field names follow fairseq's flags."""

    encoder_embed_dim: int = 512
    encoder_ffn_embed_dim: int = 2048
    encoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_embed_dim: int = 512
    decoder_ffn_embed_dim: int = 2048
    decoder_layers: int = 6
    decoder_attention_heads: int = 8
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    # Post-norm (False) is the paper's layout; pre-norm trains more stably when deep.
    normalize_before: bool = False
    share_all_embeddings: bool = False
    share_decoder_input_output_embed: bool = False
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    # Learned position embeddings instead of sinusoids (for imported models).
    learned_pos: bool = False
    # Multiply embeddings by sqrt(d_model) (the paper); off only for imported models.
    scale_embedding: bool = True

    def __post_init__(self) -> None:
        for side in ("encoder", "decoder"):
            dim = getattr(self, f"{side}_embed_dim")
            heads = getattr(self, f"{side}_attention_heads")
            if min(dim, heads, getattr(self, f"{side}_ffn_embed_dim"), getattr(self, f"{side}_layers")) <= 0:
                raise NmtError(f"{side} sizes must be positive")
            if dim % heads != 0:
                raise NmtError(f"--{side}-embed-dim {dim} is not divisible by --{side}-attention-heads {heads}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise NmtError(f"--{name.replace('_', '-')} must be in [0, 1)")
        if self.share_all_embeddings and self.encoder_embed_dim != self.decoder_embed_dim:
            raise NmtError("--share-all-embeddings needs --encoder-embed-dim == --decoder-embed-dim")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise NmtError(f"unknown model config fields: {', '.join(unknown)}")
        return cls(**values)
