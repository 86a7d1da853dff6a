"""Convert a fairseq Transformer checkpoint into an nmt run directory.

The checkpoint is read by `nmt_cli.interop.fairseq.checkpoint` (safely: no code stored in the
file runs, and fairseq need not be installed). The weights map onto
`nmt_cli.models.transformer.Transformer` by renaming (see `convert_state_dict`);
options our model cannot reproduce are refused by name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from nmt_cli.checkpoints.format import check_state_dict_fits, model_checkpoint, save_checkpoint
from nmt_cli.config import FairseqImportConfig, ModelConfig
from nmt_cli.data.dictionary import SPECIALS, read_dict_lines
from nmt_cli.errors import NmtError, where
from nmt_cli.interop.fairseq.checkpoint import (
    load_fairseq_checkpoint,
    malformed_checkpoint_as_error,
    model_config_from_args,
    recorded_language,
)
from nmt_cli.interop.imported import ImportResult, holds_this_import, imported_run_meta, publish_import
from nmt_cli.models.registry import build_model
from nmt_cli.run_lock import directory_lock
from nmt_cli.staging import check_unchanged, file_version, fingerprint
from nmt_cli.text.subword_nmt import SubwordNmtBpe

# ---------------------------------------------------------------------------
# Weights


def upgrade_legacy_names(weights: dict[str, torch.Tensor], origin: Path) -> dict[str, torch.Tensor]:
    """Old fairseq layouts -> fairseq 0.12 names (what its `upgrade_state_dict_named` does).

    * `layer_norms.{0,1,2}` -> `self_attn_layer_norm`, (decoder) `encoder_attn_layer_norm`,
      `final_layer_norm`;
    * fused `in_proj_weight`/`in_proj_bias` -> `q_proj`, `k_proj`, `v_proj`;
    * `decoder.embed_out` -> `decoder.output_projection.weight`.

    A key or shape these layouts cannot have is an NmtError naming `origin`.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in weights.items():
        parts = key.split(".")
        if len(parts) == 6 and parts[3] == "layer_norms":  # {encoder,decoder}.layers.N.layer_norms.I.weight
            names = ["self_attn_layer_norm", "final_layer_norm"]
            if parts[0] == "decoder":
                names = ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"]
            name = {str(i): n for i, n in enumerate(names)}.get(parts[4])
            if name is None:
                raise NmtError(f"{origin}: model weight {key}: a fairseq {parts[0]} layer has layer_norms.0 "
                               f"to layer_norms.{len(names) - 1} only")
            out[".".join(parts[:3] + [name, parts[5]])] = value
        elif parts[-1] in ("in_proj_weight", "in_proj_bias"):
            if value.dim() == 0 or value.size(0) % 3 != 0:
                raise NmtError(f"{origin}: model weight {key} has shape {tuple(value.shape)}: "
                               "a fused q/k/v projection needs a first dimension divisible by 3")
            prefix, kind = ".".join(parts[:-1]), parts[-1].removeprefix("in_proj_")
            for proj, chunk in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                out[f"{prefix}.{proj}.{kind}"] = chunk
        elif key == "decoder.embed_out":
            out["decoder.output_projection.weight"] = value
        else:
            out[key] = value
    return out


# fairseq keys that hold no weights of ours: format versions and sinusoid caches.
IGNORED_SUFFIXES = (".version", "embed_positions._float_tensor", "embed_positions.weights")


def convert_state_dict(weights: dict[str, torch.Tensor], cfg: ModelConfig, origin: Path) -> dict[str, torch.Tensor]:
    """fairseq TransformerModel weights -> our Transformer's state dict (float32).

    Everything is a renaming except the attention projections, which our model fuses:
    `self_attn.in_proj` = [q; k; v] and `encoder_attn.kv_proj` = [k; v]. A missing
    weight, or one left over (an option we do not model), is an NmtError naming `origin`.
    """
    source = {k: v for k, v in upgrade_legacy_names(weights, origin).items() if not k.endswith(IGNORED_SUFFIXES)}
    if cfg.share_all_embeddings and "decoder.embed_tokens.weight" not in source:
        source["decoder.embed_tokens.weight"] = source.get("encoder.embed_tokens.weight")
    if cfg.share_all_embeddings or cfg.share_decoder_input_output_embed:
        source["decoder.output_projection.weight"] = source.get("decoder.embed_tokens.weight")
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(*names: str) -> torch.Tensor:
        missing = [n for n in names if source.get(n) is None]
        if missing:
            raise NmtError(f"{origin}: fairseq weight {missing[0]} is missing")
        used.update(names)
        tensors = [source[n] for n in names]
        if len(tensors) > 1 and (min(t.dim() for t in tensors) == 0 or len({t.shape[1:] for t in tensors}) > 1):
            shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(names, tensors))
            raise NmtError(f"{origin}: fairseq weights of different shapes where our model joins them: {shapes}")
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)

    for key in _our_parameter_names(source):
        prefix, _, leaf = key.rpartition(".")
        if prefix.endswith("self_attn.in_proj"):
            base = prefix.removesuffix("in_proj")
            value = take(*(f"{base}{p}_proj.{leaf}" for p in "qkv"))
        elif prefix.endswith("encoder_attn.kv_proj"):
            base = prefix.removesuffix("kv_proj")
            value = take(*(f"{base}{p}_proj.{leaf}" for p in "kv"))
        else:
            value = take(key)
        out[key] = value.float() if value.is_floating_point() else value
    unused = sorted(set(source) - used)
    if unused:
        raise NmtError(f"{origin}: weight {unused[0]} belongs to a fairseq option nmt does not support")
    return out


def _our_parameter_names(source: dict[str, torch.Tensor]) -> list[str]:
    """Our names for the fairseq tensors present (q/k/v collapse into the fused names)."""
    names: list[str] = []
    for key in source:
        prefix, leaf = key.rsplit(".", 1) if "." in key else ("", key)
        if prefix.endswith("self_attn.q_proj"):
            names.append(prefix.removesuffix("q_proj") + "in_proj." + leaf)
        elif prefix.endswith("encoder_attn.k_proj"):
            names.append(prefix.removesuffix("k_proj") + "kv_proj." + leaf)
        elif not (prefix.endswith(("self_attn.k_proj", "self_attn.v_proj", "encoder_attn.v_proj"))):
            names.append(key)
    return names


# ---------------------------------------------------------------------------
# Dictionaries


def read_fairseq_dictionary(path: str | Path) -> list[str]:
    """Symbols by id exactly as fairseq's `Dictionary.load` numbers them.

    The four specials come first; each line `symbol count [#fairseq:overwrite]` adds
    one id. fairseq appends an overwritten symbol again (a second id); our Dictionary
    keeps one id per symbol, so such files are refused rather than renumbered.
    """
    path = Path(path)
    symbols = list(SPECIALS)
    seen = set(symbols)
    for line in read_dict_lines(path):
        if line.symbol in seen:
            what = "overwrites" if line.overwrite else "duplicates"
            raise NmtError(f"dictionary line {what} symbol {line.symbol!r} (fairseq would give it a second id): "
                           f"{where(path, line.lineno)}")
        seen.add(line.symbol)
        symbols.append(line.symbol)
    return symbols


# ---------------------------------------------------------------------------
# The run directory


def import_fairseq(cfg: FairseqImportConfig) -> ImportResult:
    """Write `cfg.out_dir` (checkpoint.pt, meta.json, dictionaries, BPE codes) as a whole.

    An out_dir that holds anything (an nmt training run, another import) is refused
    unless `cfg.force`; one that holds this same import (same inputs, same nmt) is left
    as it is, so re-running an import is harmless.
    """
    checkpoint_path = cfg.out_dir / "checkpoint.pt"
    read_version = {cfg.checkpoint: file_version(cfg.checkpoint)} if cfg.checkpoint.is_file() else {}
    with malformed_checkpoint_as_error(cfg.checkpoint):
        loaded = load_fairseq_checkpoint(cfg.checkpoint)
        model_cfg = model_config_from_args(loaded.args, loaded.weights, cfg.checkpoint, loaded.labels)
        inferred = infer_language_pair(cfg.dict_dir)
        src_lang = cfg.source_lang or recorded_language(loaded, "source_lang", cfg.checkpoint) or inferred[0]
        tgt_lang = cfg.target_lang or recorded_language(loaded, "target_lang", cfg.checkpoint) or inferred[1]
    if not src_lang or not tgt_lang:
        raise NmtError(
            f"neither {cfg.checkpoint} nor the file names in {cfg.dict_dir} tell the languages; "
            "give --source-lang and --target-lang"
        )
    src_dict_path, tgt_dict_path = cfg.dict_dir / f"dict.{src_lang}.txt", cfg.dict_dir / f"dict.{tgt_lang}.txt"
    src_dict, tgt_dict = read_fairseq_dictionary(src_dict_path), read_fairseq_dictionary(tgt_dict_path)
    if cfg.bpe_codes is not None:
        # Parsed as `nmt translate` will parse them: broken codes are refused now, not at translation.
        SubwordNmtBpe.load(cfg.bpe_codes)
    inputs = [cfg.checkpoint, src_dict_path, tgt_dict_path] + ([cfg.bpe_codes] if cfg.bpe_codes is not None else [])
    print_id = fingerprint({"languages": [src_lang, tgt_lang]}, inputs)
    check_unchanged(read_version)  # the fingerprint is of the checkpoint that was loaded
    run_files = {"checkpoint.pt", "meta.json", src_dict_path.name, tgt_dict_path.name}
    run_files |= {"bpe.codes"} if cfg.bpe_codes is not None else set()
    with directory_lock(cfg.out_dir, "--out"):  # one writer, from the check of --out to its publication
        if holds_this_import(cfg.out_dir, print_id, cfg.force, run_files, inputs):
            return ImportResult(checkpoint_path, written=False)
        with malformed_checkpoint_as_error(cfg.checkpoint):
            _check_vocab_size(loaded.weights, "encoder", src_dict, src_dict_path, cfg.checkpoint)
            _check_vocab_size(loaded.weights, "decoder", tgt_dict, tgt_dict_path, cfg.checkpoint)
            if model_cfg.share_all_embeddings and src_dict != tgt_dict:
                raise NmtError(f"{cfg.checkpoint} shares all embeddings but {src_dict_path} and {tgt_dict_path} differ")
            weights = convert_state_dict(loaded.weights, model_cfg, cfg.checkpoint)
            # Every weight is loaded next (check_state_dict_fits makes sure): no random init.
            model = build_model(model_cfg, len(src_dict), len(tgt_dict), initialise=False)
            check_state_dict_fits(model, weights, cfg.checkpoint)
            model.load_state_dict(weights)
        copies = {src_dict_path.name: src_dict_path, tgt_dict_path.name: tgt_dict_path}
        if cfg.bpe_codes is not None:
            copies["bpe.codes"] = cfg.bpe_codes
        meta = run_meta(src_lang, tgt_lang, src_dict == tgt_dict, cfg.bpe_codes is not None, cfg.checkpoint, print_id)
        state = model_checkpoint(model_cfg, model.state_dict(), src_lang, tgt_lang, src_dict, tgt_dict,
                                 num_updates=loaded.num_updates, epoch=0)
        publish_import(cfg.out_dir, lambda staging: write_run(staging, copies, meta, state))
    return ImportResult(checkpoint_path, written=True)


def write_run(run_dir: Path, copies: dict[str, Path], meta: dict[str, Any], state: dict[str, Any]) -> None:
    """The imported run's files: the copied dictionaries (and BPE codes), meta.json, checkpoint.pt."""
    for name, source in copies.items():
        shutil.copyfile(source, run_dir / name)
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    save_checkpoint(state, run_dir / "checkpoint.pt")


def infer_language_pair(data_bin: Path) -> tuple[str | None, str | None]:
    """(src, tgt) from binarized split names `{split}.{src}-{tgt}.{lang}.bin`, as fairseq infers them."""
    if not data_bin.is_dir():
        return None, None
    for path in sorted(data_bin.iterdir()):
        parts = path.name.split(".")
        if len(parts) >= 3 and len(parts[1].split("-")) == 2:
            src, tgt = parts[1].split("-")
            return src, tgt
    return None, None


def _check_vocab_size(weights: dict[str, torch.Tensor], side: str, symbols: list[str], dict_path: Path, ckpt: Path) -> None:
    key = f"{side}.embed_tokens.weight"
    if key not in weights and side == "decoder":
        key = "encoder.embed_tokens.weight"  # shared, stored once
    embedding = weights.get(key)
    if embedding is not None and embedding.dim() != 2:
        raise NmtError(f"{ckpt}: model weight {key} has shape {tuple(embedding.shape)}, not (symbols, width)")
    if embedding is not None and embedding.size(0) != len(symbols):
        raise NmtError(
            f"{dict_path} has {len(symbols)} symbols (specials included) but the {side} embedding "
            f"of {ckpt} has {embedding.size(0)} rows: not the dictionary this model was trained with"
        )


def run_meta(src_lang: str, tgt_lang: str, joined: bool, has_codes: bool, origin: Path, print_id: str) -> dict[str, Any]:
    """meta.json of an imported run: fairseq's default Moses settings and subword-nmt BPE.

    fairseq's `--tokenizer moses` escapes XML characters and splits hyphens
    (`-a`) and does not normalize punctuation; WMT models were trained that way.
    """
    return imported_run_meta(
        src_lang, tgt_lang, joined,
        tokenizer={"name": "moses", "normalize_punctuation": False, "aggressive_dash_splits": True, "escape": True},
        bpe={"type": "subword_nmt", "codes": "bpe.codes", "separator": "@@"} if has_codes else None,
        imported_from={"toolkit": "fairseq", "checkpoint": origin.name, "fingerprint": print_id})
