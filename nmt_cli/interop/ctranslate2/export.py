"""An nmt checkpoint -> a CTranslate2 model directory, with nmt's text files alongside.

The weights go through CTranslate2's own Python API: a `TransformerSpec` made by
`from_config`, filled as CTranslate2's fairseq converter fills it (nmt's weights
under fairseq's names, nmt_cli/interop/source.py), then validated, quantized and
saved by a `ctranslate2.converters.Converter`. What nmt's model does that the spec
must be told:

* post-norm or pre-norm (pre-norm: the final LayerNorm of encoder and decoder);
* embeddings scaled by sqrt(d_model) or not, shared or not (CTranslate2 stores a
  shared matrix once);
* sinusoidal positions in fairseq's flavour ([sin | cos] halves, numbered from
  padding_idx + 1): the table is written explicitly from that row on, so that row 0
  is the first token's position, as CTranslate2 numbers them; or in Marian's, numbered
  from 0;
* the feed-forward activation, and the output projection's bias (Marian's models);
* LayerNorm epsilon 1e-5 (torch's and fairseq's);
* the decoder starts from `</s>` (or, for models imported from Marian, from `<pad>`,
  whose embedding is their start vector) and the source ends with `</s>`.

Beside CTranslate2's files the directory holds nmt's: `dict.{src,tgt}.txt`, the run's
meta.json and BPE model(s) (so that the same raw text reaches the model), and
`nmt_export.json` (languages, maximum lengths, the fingerprint of what made it).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from nmt_cli.data.dictionary import PAD_ID
from nmt_cli.errors import NmtError
from nmt_cli.interop.ctranslate2.extra import import_ctranslate2
from nmt_cli.interop.source import ExportSource
from nmt_cli.models.layers import marian_sinusoid_table, sinusoidal_table

EXPORT_INFO = "nmt_export.json"
LAYER_NORM_EPSILON = 1e-5
CT2_PAD = "<blank>"  # CTranslate2's name for the padding token


@dataclass(frozen=True)
class ExportInfo:
    """nmt_export.json: what `nmt translate --engine ctranslate2` needs besides CTranslate2's files."""

    source_lang: str
    target_lang: str
    max_source_positions: int
    max_target_positions: int
    checkpoint: str  # the checkpoint's file name
    fingerprint: str  # of the checkpoint, the text files and the settings (interop/source.py)
    quantization: str | None

    def write(self, directory: Path) -> None:
        (directory / EXPORT_INFO).write_text(json.dumps(self.__dict__, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, directory: Path) -> "ExportInfo":
        path = directory / EXPORT_INFO
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
            return cls(**{name: values[name] for name in cls.__dataclass_fields__})
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise NmtError(f"{path}: not an nmt CTranslate2 export ({type(error).__name__}: {error}); "
                           "export one with `nmt export --format ctranslate2`") from None


def ctranslate2_vocabulary(symbols: list[str], side: str) -> list[str]:
    """A dictionary's symbols as CTranslate2 names them (`<pad>` is `<blank>`)."""
    if CT2_PAD in symbols:
        raise NmtError(f"the {side} dictionary has a symbol {CT2_PAD!r}, CTranslate2's name for padding")
    return [CT2_PAD if i == PAD_ID else symbol for i, symbol in enumerate(symbols)]


def position_encodings(source: ExportSource, side: str, max_positions: int) -> torch.Tensor:
    """The position table as CTranslate2 indexes it: row 0 is the first token's position."""
    if source.cfg.learned_pos:
        table = source.weights[f"{side}.embed_positions.weight"]
    elif source.cfg.sinusoids == "marian":  # numbered from 0 already
        dim = source.cfg.encoder_embed_dim if side == "encoder" else source.cfg.decoder_embed_dim
        return marian_sinusoid_table(max_positions, dim)
    else:
        dim = source.cfg.encoder_embed_dim if side == "encoder" else source.cfg.decoder_embed_dim
        table = sinusoidal_table(max_positions + PAD_ID + 1, dim, PAD_ID)
    return table[PAD_ID + 1 :].contiguous()


def transformer_spec(source: ExportSource, ct2: ModuleType) -> Any:
    """A filled `ctranslate2.specs.TransformerSpec` for the checkpoint."""
    cfg = source.cfg
    if cfg.encoder_attention_heads != cfg.decoder_attention_heads:
        raise NmtError(f"{source.checkpoint}: CTranslate2 needs as many encoder as decoder attention heads "
                       f"({cfg.encoder_attention_heads} vs {cfg.decoder_attention_heads})")
    specs = ct2.specs
    activation = {"relu": specs.Activation.RELU, "gelu": specs.Activation.GELU, "swish": specs.Activation.SWISH}
    spec = specs.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers), cfg.encoder_attention_heads, pre_norm=cfg.normalize_before,
        activation=activation[cfg.activation_fn])
    weights = source.weights
    _set_side(spec.encoder, weights, "encoder", source, cfg.max_source_positions, cfg.encoder_embed_dim)
    _set_side(spec.decoder, weights, "decoder", source, cfg.max_target_positions, cfg.decoder_embed_dim)
    _set_linear(spec.decoder.projection, weights, "decoder.output_projection", bias=cfg.output_bias)
    for i, layer in enumerate(spec.encoder.layer):
        prefix = f"encoder.layers.{i}"
        _set_attention(layer.self_attention, weights, f"{prefix}.self_attn", ct2, self_attention=True)
        _set_norm(layer.self_attention.layer_norm, weights, f"{prefix}.self_attn_layer_norm")
        _set_ffn(layer.ffn, weights, prefix)
    for i, layer in enumerate(spec.decoder.layer):
        prefix = f"decoder.layers.{i}"
        _set_attention(layer.self_attention, weights, f"{prefix}.self_attn", ct2, self_attention=True)
        _set_norm(layer.self_attention.layer_norm, weights, f"{prefix}.self_attn_layer_norm")
        _set_attention(layer.attention, weights, f"{prefix}.encoder_attn", ct2, self_attention=False)
        _set_norm(layer.attention.layer_norm, weights, f"{prefix}.encoder_attn_layer_norm")
        _set_ffn(layer.ffn, weights, prefix)
    spec.register_source_vocabulary(ctranslate2_vocabulary(source.src_dict.symbols, "source"))
    spec.register_target_vocabulary(ctranslate2_vocabulary(source.tgt_dict.symbols, "target"))
    spec.config.decoder_start_token = decoder_start_token(source)
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    return spec


def decoder_start_token(source: ExportSource) -> str:
    """The token whose embedding starts the decoder: `</s>`, or, for a model with a start
    vector of its own (models imported from Marian), the token whose embedding it is."""
    if not source.cfg.start_embedding:
        return "</s>"
    start, embeddings = source.weights["decoder.start_embedding"], source.weights["decoder.embed_tokens.weight"]
    if torch.equal(start, embeddings[PAD_ID]):
        return CT2_PAD
    raise NmtError(f"{source.checkpoint}: the decoder's start vector is no token's embedding, and CTranslate2 "
                   "starts the decoder from a token")


def _set_side(spec: Any, weights: dict[str, torch.Tensor], side: str, source: ExportSource,
              max_positions: int, dim: int) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(weights[f"{side}.embed_tokens.weight"])
    spec.scale_embeddings = dim**0.5 if source.cfg.scale_embedding else 1.0
    spec.position_encodings.encodings = _array(position_encodings(source, side, max_positions))
    if source.cfg.normalize_before:
        _set_norm(spec.layer_norm, weights, f"{side}.layer_norm")


def _set_attention(spec: Any, weights: dict[str, torch.Tensor], prefix: str, ct2: ModuleType, self_attention: bool) -> None:
    """CTranslate2 fuses q/k/v (self-attention) and k/v (cross-attention), as nmt does."""
    common = ct2.specs.common_spec
    fused = "qkv" if self_attention else "kv"
    parts = [common.LinearSpec() for _ in fused]
    for part, name in zip(parts, fused):
        _set_linear(part, weights, f"{prefix}.{name}_proj")
    if self_attention:
        ct2.converters.utils.fuse_linear(spec.linear[0], parts)
    else:
        _set_linear(spec.linear[0], weights, f"{prefix}.q_proj")
        ct2.converters.utils.fuse_linear(spec.linear[1], parts)
    _set_linear(spec.linear[-1], weights, f"{prefix}.out_proj")


def _set_ffn(spec: Any, weights: dict[str, torch.Tensor], prefix: str) -> None:
    _set_norm(spec.layer_norm, weights, f"{prefix}.final_layer_norm")
    _set_linear(spec.linear_0, weights, f"{prefix}.fc1")
    _set_linear(spec.linear_1, weights, f"{prefix}.fc2")


def _set_linear(spec: Any, weights: dict[str, torch.Tensor], prefix: str, bias: bool = True) -> None:
    spec.weight = _array(weights[f"{prefix}.weight"])
    if bias:
        spec.bias = _array(weights[f"{prefix}.bias"])


def _set_norm(spec: Any, weights: dict[str, torch.Tensor], prefix: str) -> None:
    spec.gamma = _array(weights[f"{prefix}.weight"])
    spec.beta = _array(weights[f"{prefix}.bias"])


def _array(tensor: torch.Tensor) -> Any:
    return tensor.detach().float().contiguous().numpy().copy()


def write_ctranslate2_model(source: ExportSource, directory: Path, quantization: str | None) -> None:
    """Write the CTranslate2 model and nmt's text files into `directory` (a fresh staging
    directory: CTranslate2's converter replaces it)."""
    ct2 = import_ctranslate2("exporting to CTranslate2")
    import ctranslate2.converters.utils  # noqa: F401 - submodules the spec code reaches through `ct2`
    import ctranslate2.specs  # noqa: F401

    class SpecConverter(ct2.converters.Converter):
        """CTranslate2's converter machinery (validate, quantize, save) for a spec built here."""

        def _load(self) -> Any:
            return transformer_spec(source, ct2)

    try:
        SpecConverter().convert(str(directory), quantization=quantization, force=True)
    except (ValueError, NotImplementedError) as error:  # CTranslate2's own checks of the spec
        raise NmtError(f"CTranslate2 refused the model of {source.checkpoint}: {error}") from None
    write_text_side(source, directory)
    ExportInfo(source.source_lang, source.target_lang, source.cfg.max_source_positions,
               source.cfg.max_target_positions, source.checkpoint.name, source.fingerprint, quantization).write(directory)


def write_text_side(source: ExportSource, directory: Path) -> None:
    """The dictionaries (from the checkpoint itself) and the run's meta.json and BPE files."""
    source.src_dict.save(directory / f"dict.{source.source_lang}.txt")
    source.tgt_dict.save(directory / f"dict.{source.target_lang}.txt")
    for path in source.text_files:
        shutil.copyfile(path, directory / path.name)
