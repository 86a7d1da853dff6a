"""Convert a fairseq Transformer checkpoint into an nmt run directory.

The checkpoint is read with the restricted unpickler of `nmt_cli.fairseq_pickle`:
no code stored in the file runs, and fairseq need not be installed.

The weights map onto `nmt_cli.models.transformer.Transformer` by renaming (see
`convert_state_dict`); options our model cannot reproduce are refused by name.
"""

from __future__ import annotations

import json
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt_cli.checkpoint import FORMAT_VERSION, check_state_dict_fits, save_checkpoint
from nmt_cli.config import ModelConfig
from nmt_cli.data.dictionary import SPECIALS
from nmt_cli.errors import NmtError, where
from nmt_cli.fairseq_pickle import PICKLE_MODULE, plain
from nmt_cli.models.registry import build_model

# ---------------------------------------------------------------------------
# Arguments


# fairseq's `base_architecture` (transformer_legacy.py): what an old checkpoint may omit.
BASE_DEFAULTS: dict[str, Any] = {
    "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_layers": 6, "encoder_attention_heads": 8,
    "encoder_normalize_before": False, "encoder_learned_pos": False,
    "decoder_layers": 6, "decoder_attention_heads": 8, "decoder_normalize_before": False, "decoder_learned_pos": False,
    "attention_dropout": 0.0, "activation_dropout": 0.0, "activation_fn": "relu", "dropout": 0.1,
    "share_decoder_input_output_embed": False, "share_all_embeddings": False, "no_scale_embedding": False,
    "max_source_positions": 1024, "max_target_positions": 1024,
}
_BIG = {"encoder_embed_dim": 1024, "encoder_ffn_embed_dim": 4096, "encoder_attention_heads": 16,
        "decoder_embed_dim": 1024, "decoder_ffn_embed_dim": 4096, "decoder_attention_heads": 16, "dropout": 0.3}
# The fairseq Transformer architectures we import, with the values their presets set.
ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "transformer": {},
    "transformer_wmt_en_de": {},
    "transformer_iwslt_de_en": {"encoder_ffn_embed_dim": 1024, "encoder_attention_heads": 4,
                                "decoder_ffn_embed_dim": 1024, "decoder_attention_heads": 4},
    "transformer_vaswani_wmt_en_de_big": _BIG,
    "transformer_vaswani_wmt_en_fr_big": {**_BIG, "dropout": 0.1},
    "transformer_wmt_en_de_big": {**_BIG, "attention_dropout": 0.1},
    "transformer_wmt_en_de_big_t2t": {**_BIG, "attention_dropout": 0.1, "activation_dropout": 0.1,
                                      "encoder_normalize_before": True, "decoder_normalize_before": True},
}
# Options that change the network in ways our model does not reproduce (flag -> is it on?).
UNSUPPORTED_FLAGS = (
    "layernorm_embedding", "adaptive_input", "tie_adaptive_weights", "adaptive_softmax_cutoff",
    "no_cross_attention", "cross_self_attention", "no_token_positional_embeddings", "char_inputs",
    "encoder_layers_to_keep", "decoder_layers_to_keep",
)


def read_args(args: Any, cfg: Any, path: Path) -> dict[str, Any]:
    """The flat model and task arguments of a checkpoint: `args` (old) or `cfg.model`/`cfg.task` (new).

    A hydra-style model config nests `encoder`/`decoder` groups; they are flattened to
    the `encoder_embed_dim`-style names of the argparse era.
    """
    if isinstance(args, dict) and args:
        return dict(args)
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise NmtError(f"{path} records neither 'args' nor 'cfg.model': not a fairseq training checkpoint")
    flat: dict[str, Any] = {}
    for key, value in cfg["model"].items():
        if key in ("encoder", "decoder") and isinstance(value, dict):
            flat.update({f"{key}_{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    flat.setdefault("arch", flat.get("_name"))
    task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
    for key in ("source_lang", "target_lang"):
        if flat.get(key) is None:
            flat[key] = task.get(key)
    return flat


def model_config_from_args(args: dict[str, Any], weights: dict[str, torch.Tensor], path: Path) -> ModelConfig:
    """Our ModelConfig for a fairseq Transformer; NmtError naming any option we cannot reproduce."""
    arch = args.get("arch")
    if arch not in ARCH_DEFAULTS:
        raise NmtError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCH_DEFAULTS)})")
    v = {**BASE_DEFAULTS, **ARCH_DEFAULTS[arch], **{k: x for k, x in args.items() if x is not None}}
    for side_key, encoder_key in (("decoder_embed_dim", "encoder_embed_dim"), ("decoder_ffn_embed_dim", "encoder_ffn_embed_dim")):
        v.setdefault(side_key, v[encoder_key])
    problems = [f"--{flag.replace('_', '-')}" for flag in UNSUPPORTED_FLAGS if v.get(flag)]
    if v["activation_fn"] != "relu":
        problems.append(f"--activation-fn {v['activation_fn']}")
    for name in ("normalize_before", "learned_pos"):
        if bool(v[f"encoder_{name}"]) != bool(v[f"decoder_{name}"]):
            problems.append(f"--encoder-{name.replace('_', '-')} differing from --decoder-{name.replace('_', '-')}")
    if v["encoder_embed_dim"] != v["decoder_embed_dim"]:
        problems.append("--encoder-embed-dim differing from --decoder-embed-dim")
    for name in ("decoder_input_dim", "decoder_output_dim"):
        if v.get(name) not in (None, v["decoder_embed_dim"]):
            problems.append(f"--{name.replace('_', '-')} differing from --decoder-embed-dim")
    pre_norm = bool(v["encoder_normalize_before"])
    if pre_norm and v.get("no_decoder_final_norm"):
        problems.append("--no-decoder-final-norm")
    if pre_norm and (_version(weights, "encoder") < 2 or _version(weights, "decoder") <= 2):
        problems.append("a pre-norm model from before fairseq added the final LayerNorm (state version < 3)")
    if problems:
        raise NmtError(f"{path}: nmt cannot reproduce this fairseq model: {'; '.join(problems)}")
    return ModelConfig(
        encoder_embed_dim=v["encoder_embed_dim"], encoder_ffn_embed_dim=v["encoder_ffn_embed_dim"],
        encoder_layers=v["encoder_layers"], encoder_attention_heads=v["encoder_attention_heads"],
        decoder_embed_dim=v["decoder_embed_dim"], decoder_ffn_embed_dim=v["decoder_ffn_embed_dim"],
        decoder_layers=v["decoder_layers"], decoder_attention_heads=v["decoder_attention_heads"],
        dropout=v["dropout"], attention_dropout=v["attention_dropout"], activation_dropout=v["activation_dropout"],
        normalize_before=pre_norm,
        share_all_embeddings=bool(v["share_all_embeddings"]),
        share_decoder_input_output_embed=bool(v["share_decoder_input_output_embed"]),
        max_source_positions=v["max_source_positions"], max_target_positions=v["max_target_positions"],
        learned_pos=bool(v["encoder_learned_pos"]),
        scale_embedding=not v["no_scale_embedding"],
    )


def _version(weights: dict[str, torch.Tensor], side: str) -> float:
    """fairseq's per-module state version (a missing key reads as 1, as fairseq does)."""
    version = weights.get(f"{side}.version")
    return float(version.flatten()[0]) if version is not None else 1.0


@dataclass
class FairseqCheckpoint:
    args: dict[str, Any]  # model and task arguments, flattened
    weights: dict[str, torch.Tensor]  # fairseq parameter names
    num_updates: int = 0


def load_fairseq_checkpoint(path: str | Path) -> FairseqCheckpoint:
    """Read a fairseq checkpoint safely (see the module docstring for the trust model)."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", pickle_module=PICKLE_MODULE, weights_only=False)
    except pickle.UnpicklingError as error:
        raise NmtError(f"cannot read fairseq checkpoint {path}: {error}") from None
    except Exception as error:  # noqa: BLE001 - torch raises many types for a damaged file
        raise NmtError(f"not a readable fairseq checkpoint: {path} ({str(error).splitlines()[0]})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise NmtError(f"not a fairseq checkpoint (no 'model' weights): {path}")
    weights = {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}
    history = plain(state.get("optimizer_history")) or [{}]
    num_updates = history[-1].get("num_updates") if isinstance(history[-1], dict) else None
    args = read_args(plain(state.get("args")), plain(state.get("cfg")), path)
    return FairseqCheckpoint(args, weights, int(num_updates or 0))


# ---------------------------------------------------------------------------
# Weights


def upgrade_legacy_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Old fairseq layouts -> fairseq 0.12 names (what its `upgrade_state_dict_named` does).

    * `layer_norms.{0,1,2}` -> `self_attn_layer_norm`, (decoder) `encoder_attn_layer_norm`,
      `final_layer_norm`;
    * fused `in_proj_weight`/`in_proj_bias` -> `q_proj`, `k_proj`, `v_proj`;
    * `decoder.embed_out` -> `decoder.output_projection.weight`.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in weights.items():
        parts = key.split(".")
        if len(parts) == 6 and parts[3] == "layer_norms":  # {encoder,decoder}.layers.N.layer_norms.I.weight
            names = ["self_attn_layer_norm", "final_layer_norm"]
            if parts[0] == "decoder":
                names = ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"]
            out[".".join(parts[:3] + [names[int(parts[4])], parts[5]])] = value
        elif parts[-1] in ("in_proj_weight", "in_proj_bias"):
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
    source = {k: v for k, v in upgrade_legacy_names(weights).items() if not k.endswith(IGNORED_SUFFIXES)}
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
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)

    for key in _our_parameter_names(source):
        prefix, leaf = key.rsplit(".", 1)
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
    if not path.is_file():
        raise NmtError(f"dictionary not found: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise NmtError(f"dictionary is not valid UTF-8: {path} (byte {e.start})") from None
    symbols = list(SPECIALS)
    seen = set(symbols)
    for lineno, line in enumerate(lines, start=1):
        fields = line.rstrip().rsplit(" ", 1)
        overwrite = len(fields) == 2 and fields[1] == "#fairseq:overwrite"
        if overwrite:
            fields = fields[0].rsplit(" ", 1)
        if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
            raise NmtError(f"bad dictionary line (expected 'symbol count'): {where(path, lineno)}")
        symbol = fields[0]
        if symbol in seen:
            what = "overwrites" if overwrite else "duplicates"
            raise NmtError(f"dictionary line {what} symbol {symbol!r} (fairseq would give it a second id): {where(path, lineno)}")
        seen.add(symbol)
        symbols.append(symbol)
    return symbols


# ---------------------------------------------------------------------------
# The run directory


@dataclass(frozen=True)
class ImportConfig:
    checkpoint: Path
    dict_dir: Path
    out_dir: Path
    bpe_codes: Path | None = None
    source_lang: str | None = None
    target_lang: str | None = None


def import_fairseq(cfg: ImportConfig) -> Path:
    """Write `cfg.out_dir` (checkpoint.pt, meta.json, dictionaries, BPE codes); return the checkpoint path."""
    loaded = load_fairseq_checkpoint(cfg.checkpoint)
    model_cfg = model_config_from_args(loaded.args, loaded.weights, cfg.checkpoint)
    inferred = infer_language_pair(cfg.dict_dir)
    src_lang = cfg.source_lang or loaded.args.get("source_lang") or inferred[0]
    tgt_lang = cfg.target_lang or loaded.args.get("target_lang") or inferred[1]
    if not src_lang or not tgt_lang:
        raise NmtError(
            f"neither {cfg.checkpoint} nor the file names in {cfg.dict_dir} tell the languages; "
            "give --source-lang and --target-lang"
        )
    src_dict_path, tgt_dict_path = cfg.dict_dir / f"dict.{src_lang}.txt", cfg.dict_dir / f"dict.{tgt_lang}.txt"
    src_dict, tgt_dict = read_fairseq_dictionary(src_dict_path), read_fairseq_dictionary(tgt_dict_path)
    _check_vocab_size(loaded.weights, "encoder", src_dict, src_dict_path, cfg.checkpoint)
    _check_vocab_size(loaded.weights, "decoder", tgt_dict, tgt_dict_path, cfg.checkpoint)
    if model_cfg.share_all_embeddings and src_dict != tgt_dict:
        raise NmtError(f"{cfg.checkpoint} shares all embeddings but {src_dict_path} and {tgt_dict_path} differ")
    weights = convert_state_dict(loaded.weights, model_cfg, cfg.checkpoint)
    model = build_model(model_cfg, len(src_dict), len(tgt_dict))
    check_state_dict_fits(model, weights, cfg.checkpoint)
    model.load_state_dict(weights)
    if cfg.bpe_codes is not None and not cfg.bpe_codes.is_file():
        raise NmtError(f"BPE codes not found: {cfg.bpe_codes}")
    for path in (src_dict_path, tgt_dict_path):
        shutil.copyfile(path, _prepared(cfg.out_dir) / path.name)
    if cfg.bpe_codes is not None:
        shutil.copyfile(cfg.bpe_codes, cfg.out_dir / "bpe.codes")
    meta = run_meta(src_lang, tgt_lang, src_dict == tgt_dict, cfg.bpe_codes is not None, cfg.checkpoint)
    (cfg.out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    checkpoint_path = cfg.out_dir / "checkpoint.pt"
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "model_config": model_cfg.to_dict(),
            "model": model.state_dict(),
            "source_lang": src_lang,
            "target_lang": tgt_lang,
            "src_dict": src_dict,
            "tgt_dict": tgt_dict,
            "num_updates": loaded.num_updates,
            "epoch": 0,
        },
        checkpoint_path,
    )
    return checkpoint_path


def _prepared(directory: Path) -> Path:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise NmtError(f"cannot create {directory}: {error.strerror}") from None
    return directory


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
    embedding = weights.get(f"{side}.embed_tokens.weight")
    if embedding is None and side == "decoder":
        embedding = weights.get("encoder.embed_tokens.weight")  # shared, stored once
    if embedding is not None and embedding.size(0) != len(symbols):
        raise NmtError(
            f"{dict_path} has {len(symbols)} symbols (specials included) but the {side} embedding "
            f"of {ckpt} has {embedding.size(0)} rows: not the dictionary this model was trained with"
        )


def run_meta(src_lang: str, tgt_lang: str, joined: bool, has_codes: bool, origin: Path) -> dict[str, Any]:
    """meta.json of an imported run: fairseq's default Moses settings and subword-nmt BPE.

    fairseq's `--tokenizer moses` escapes XML characters and splits hyphens
    (`-a`) and does not normalize punctuation; WMT models were trained that way.
    """
    return {
        "format_version": FORMAT_VERSION,
        "source_lang": src_lang,
        "target_lang": tgt_lang,
        "joined_dictionary": joined,
        "tokenizer": {"name": "moses", "normalize_punctuation": False, "aggressive_dash_splits": True, "escape": True},
        "bpe": {"type": "subword_nmt", "codes": "bpe.codes", "separator": "@@"} if has_codes else None,
        "imported_from": {"toolkit": "fairseq", "checkpoint": origin.name},
    }
