"""What every export reads: an nmt checkpoint (given itself or as its run directory),
its weights under fairseq's names, and the text files that turn raw text into its input.

fairseq's `TransformerModel` names are the common ground of the exports: nmt's own
names are fairseq's except the fused attention projections (nmt_cli/models/layers.py),
which are split here, and CTranslate2's fairseq converter documents where each fairseq
weight goes.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from nmt_cli import __version__
from nmt_cli.checkpoints.format import load_checkpoint_file
from nmt_cli.checkpoints.names import resolve_checkpoint
from nmt_cli.config import ModelConfig
from nmt_cli.data.dictionary import Dictionary
from nmt_cli.data.meta import read_meta, text_files as run_text_files
from nmt_cli.decode.loading import dictionary_from_symbols
from nmt_cli.errors import NmtError
from nmt_cli.text.pipeline import TextPipeline

# fairseq's per-module state version: 3 is what fairseq 0.12 writes (a pre-norm model's
# final LayerNorm is read only from version 3 on).
FAIRSEQ_STATE_VERSION = 3.0


@dataclass
class ExportSource:
    """One nmt checkpoint, ready to be written in another toolkit's format."""

    checkpoint: Path
    cfg: ModelConfig
    model_state: dict[str, torch.Tensor]  # the checkpoint's "model", nmt's names
    src_dict: Dictionary
    tgt_dict: Dictionary
    source_lang: str
    target_lang: str
    num_updates: int
    text_files: list[Path]  # meta.json and the BPE model(s) it names; empty when the run has none
    fingerprint: str  # of the checkpoint's contents, the text files and the export's settings

    @functools.cached_property
    def weights(self) -> dict[str, torch.Tensor]:
        """The weights under fairseq's names, float32: made when first asked for (checking
        that a cached export is still this checkpoint's needs none of them)."""
        return fairseq_weights(self.model_state, self.cfg)


def load_export_source(path: Path, settings: dict[str, Any]) -> ExportSource:
    """Read the checkpoint at `path` (file or run directory) for an export made with
    `settings`, and fingerprint them."""
    checkpoint = resolve_checkpoint(path)
    fingerprint = ContentFingerprint(settings)
    # Hashed and loaded from one open file: a checkpoint that training saves over this one
    # meanwhile (a rename) changes neither, so the fingerprint is always of these weights.
    try:
        file = open(checkpoint, "rb")
    except OSError as error:
        raise NmtError(f"cannot read checkpoint {checkpoint}: {error.strerror or error}") from None
    with file:
        fingerprint.add(checkpoint.name, file)
        file.seek(0)
        state = load_checkpoint_file(file, checkpoint)
    cfg = ModelConfig.from_dict(state["model_config"])
    source_lang, target_lang = str(state.get("source_lang") or "src"), str(state.get("target_lang") or "tgt")
    files = text_files(checkpoint.parent, source_lang, target_lang)
    for text_file in files:
        with open(text_file, "rb") as f:
            fingerprint.add(text_file.name, f)
    return ExportSource(
        checkpoint=checkpoint, cfg=cfg, model_state=state["model"],
        src_dict=dictionary_from_symbols(list(state["src_dict"]), str(checkpoint)),
        tgt_dict=dictionary_from_symbols(list(state["tgt_dict"]), str(checkpoint)),
        source_lang=source_lang, target_lang=target_lang, num_updates=int(state.get("num_updates", 0)),
        text_files=files, fingerprint=fingerprint.hexdigest(),
    )


def fairseq_weights(weights: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """nmt's state dict -> fairseq TransformerModel's (the inverse of the importer's
    convert_state_dict): fused projections split into q/k/v, format versions added,
    every tensor float32 and contiguous."""
    out: dict[str, torch.Tensor] = {}
    for key, value in weights.items():
        value = value.detach().float().contiguous()
        prefix, _, leaf = key.rpartition(".")
        if prefix.endswith("self_attn.in_proj"):
            base = prefix.removesuffix("in_proj")
            for name, part in zip("qkv", value.chunk(3, dim=0)):
                out[f"{base}{name}_proj.{leaf}"] = part.clone()
        elif prefix.endswith("encoder_attn.kv_proj"):
            base = prefix.removesuffix("kv_proj")
            for name, part in zip("kv", value.chunk(2, dim=0)):
                out[f"{base}{name}_proj.{leaf}"] = part.clone()
        else:
            out[key] = value
    if cfg.share_all_embeddings and "decoder.embed_tokens.weight" not in out:
        out["decoder.embed_tokens.weight"] = out["encoder.embed_tokens.weight"]
    if "decoder.output_projection.weight" not in out:  # tied: stored once in nmt's state dict
        out["decoder.output_projection.weight"] = out["decoder.embed_tokens.weight"]
    for side in ("encoder", "decoder"):
        out[f"{side}.version"] = torch.tensor([FAIRSEQ_STATE_VERSION])
    return out


def text_files(run_dir: Path, source_lang: str, target_lang: str) -> list[Path]:
    """meta.json and the BPE files it names, when the run directory has them and they are
    for this language pair; otherwise none (the export then takes pre-segmented text).
    The dictionaries are the checkpoint's own, written by each export."""
    files = run_text_files(run_dir, languages=())
    if not files:
        return []
    meta: dict[str, Any] = read_meta(run_dir)
    if (meta.get("source_lang"), meta.get("target_lang")) != (source_lang, target_lang):
        raise NmtError(f"{run_dir / 'meta.json'} is for {meta.get('source_lang')}-{meta.get('target_lang')} but the "
                       f"checkpoint translates {source_lang}-{target_lang}")
    for path in files:
        if not path.is_file():
            raise NmtError(f"{run_dir / 'meta.json'} names BPE file {path.relative_to(run_dir)}, which is not in {run_dir}")
    for lang in (source_lang, target_lang):  # loaded as translate loads them: a damaged file fails the export
        TextPipeline.from_data_bin(run_dir, lang)
    return files


class ContentFingerprint:
    """sha256 of nmt's version, the settings and the files' contents: the same only for
    the same inputs, whatever their modification times say."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._digest = hashlib.sha256(repr((__version__, sorted(settings.items()))).encode("utf-8"))

    def add(self, name: str, file: BinaryIO) -> None:
        """The contents of `file` (open, at its start), under the file name `name`."""
        size = os.fstat(file.fileno()).st_size
        self._digest.update(name.encode("utf-8") + b"\0" + str(size).encode("ascii") + b"\0")
        for block in iter(lambda: file.read(1 << 22), b""):
            self._digest.update(block)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()
