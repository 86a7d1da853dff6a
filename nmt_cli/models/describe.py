"""What `nmt info` prints: a model's settings, sizes and parameter counts, for an
architecture preset (with overrides) or for the model a checkpoint holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nmt_cli.config import InfoConfig, ModelConfig
from nmt_cli.errors import NmtError
from nmt_cli.models.registry import build_model, matching_architecture, resolve_config
from nmt_cli.models.size import parameter_counts

# Vocabulary size used to build a model when none is given; its embeddings are not reported.
_PLACEHOLDER_VOCAB = 8


def describe_config(cfg: ModelConfig, src_vocab_size: int | None, tgt_vocab_size: int | None) -> dict[str, Any]:
    """Architecture, sizes and parameter counts, counted from the config: no model is
    built, so any size is described at once."""
    parameters = parameter_counts(cfg, src_vocab_size or _PLACEHOLDER_VOCAB, tgt_vocab_size or _PLACEHOLDER_VOCAB)
    if src_vocab_size is None:
        parameters = {"without_embeddings": parameters["encoder"] + parameters["decoder"]}
    return {
        "architecture": matching_architecture(cfg),
        "src_vocab_size": src_vocab_size,
        "tgt_vocab_size": tgt_vocab_size,
        "config": cfg.to_dict(),
        "parameters": parameters,
    }


def format_table(info: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = [("architecture", info["architecture"] or "(custom)")]
    for key in ("checkpoint", "source_lang", "target_lang", "num_updates", "epoch", "best_metric"):
        if key in info:
            rows.append((key, str(info[key])))
    rows += [(key, str(value)) for key, value in info["config"].items()]
    if info["src_vocab_size"] is not None:
        rows += [("src_vocab_size", str(info["src_vocab_size"])), ("tgt_vocab_size", str(info["tgt_vocab_size"]))]
    for part, count in info["parameters"].items():
        label = "parameters" if part == "total" else f"parameters ({part.replace('_', ' ')})"
        short = f"{count / 1e6:.1f}M" if count >= 100_000 else f"{count / 1e3:.1f}k"
        rows.append((label, f"{count:,} ({short})"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def describe_checkpoint(path: Path) -> dict[str, Any]:
    from nmt_cli.checkpoints.format import check_state_dict_fits, load_checkpoint

    state = load_checkpoint(path, map_location="meta")
    cfg = ModelConfig.from_dict(state["model_config"])
    try:
        info = describe_config(cfg, len(state["src_dict"]), len(state["tgt_dict"]))
        # Built on the meta device, for the names and shapes of its weights. build_model
        # still refuses a model too big for this machine: that model cannot be used here,
        # and one of 10^8 layers would take long to build even so.
        with torch.device("meta"):
            model = build_model(cfg, len(state["src_dict"]), len(state["tgt_dict"]))
    except NmtError as error:
        raise NmtError(f"{path}: {error}") from None
    check_state_dict_fits(model, state["model"], path)
    info["checkpoint"] = str(path)
    for key in ("source_lang", "target_lang", "num_updates", "epoch", "best_metric"):
        if key in state:
            info[key] = state[key]
    return info


def describe(cfg: InfoConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """The description `cfg` asks for; `overrides` are ModelConfig fields replacing the preset's."""
    if cfg.checkpoint is not None:
        if overrides:
            raise NmtError("--path takes no model options (the checkpoint has them)")
        return describe_checkpoint(Path(cfg.checkpoint))
    result = describe_config(resolve_config(cfg.arch, overrides), cfg.src_vocab, cfg.tgt_vocab)
    changed = ", ".join(f"{k}={v}" for k, v in overrides.items())
    result["architecture"] = f"{cfg.arch} with {changed}" if changed else cfg.arch
    return result
