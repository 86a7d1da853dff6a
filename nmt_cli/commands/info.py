"""`nmt info`: print an architecture or a checkpoint's model, with its parameter count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import torch

from nmt_cli.commands.model_options import model_options, overrides_from
from nmt_cli.config import ModelConfig
from nmt_cli.errors import NmtError
from nmt_cli.models.registry import ARCHITECTURES, build_model, matching_architecture, resolve_config
from nmt_cli.models.size import parameter_counts

# Vocabulary size used to build a model when none is given; its embeddings are not reported.
_PLACEHOLDER_VOCAB = 8


def describe(cfg: ModelConfig, src_vocab_size: int | None, tgt_vocab_size: int | None) -> dict[str, Any]:
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


def _format_text(info: dict[str, Any]) -> str:
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


def _vocab_sizes(vocab_size: int | None, src: int | None, tgt: int | None) -> tuple[int | None, int | None]:
    if vocab_size is not None:
        if src is not None or tgt is not None:
            raise click.UsageError("give either --vocab-size or --src-vocab-size/--tgt-vocab-size, not both")
        return vocab_size, vocab_size
    if (src is None) != (tgt is None):
        raise click.UsageError("--src-vocab-size and --tgt-vocab-size go together")
    return src, tgt


def _from_checkpoint(path: Path) -> dict[str, Any]:
    from nmt_cli.checkpoints.format import check_state_dict_fits, load_checkpoint

    state = load_checkpoint(path, map_location="meta")
    cfg = ModelConfig.from_dict(state["model_config"])
    try:
        info = describe(cfg, len(state["src_dict"]), len(state["tgt_dict"]))
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


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--arch", type=click.Choice(list(ARCHITECTURES)), help="A named architecture preset.")
@click.option("--path", "checkpoint", type=click.Path(path_type=Path),
              help="A checkpoint file: describe the model stored in it.")
@click.option("--vocab-size", type=click.IntRange(min=2), default=None,
              help="One (joined) vocabulary size for source and target.")
@click.option("--src-vocab-size", type=click.IntRange(min=2), default=None, help="Source vocabulary size.")
@click.option("--tgt-vocab-size", type=click.IntRange(min=2), default=None, help="Target vocabulary size.")
@model_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def info(arch: str | None, checkpoint: Path | None, vocab_size: int | None, src_vocab_size: int | None,
         tgt_vocab_size: int | None, as_json: bool, **model_flags: Any) -> None:
    """Print an architecture or a checkpoint's model: its settings and parameter count.

    \b
    Examples:
      nmt info --arch transformer_base --vocab-size 37000 --share-all-embeddings
      nmt info --arch transformer_small --encoder-layers 4
      nmt info --path run/checkpoint_best.pt

    Without vocabulary sizes, only the parameters outside the embeddings are counted.
    """
    overrides = overrides_from(model_flags)
    if (arch is None) == (checkpoint is None):
        raise click.UsageError("give exactly one of --arch and --path")
    if checkpoint is not None:
        if overrides or vocab_size or src_vocab_size or tgt_vocab_size:
            raise click.UsageError("--path takes no vocabulary sizes or model options (the checkpoint has them)")
        result = _from_checkpoint(checkpoint)
    else:
        src, tgt = _vocab_sizes(vocab_size, src_vocab_size, tgt_vocab_size)
        result = describe(resolve_config(arch, overrides), src, tgt)
        changed = ", ".join(f"{k}={v}" for k, v in overrides.items())
        result["architecture"] = f"{arch} with {changed}" if changed else arch
    click.echo(json.dumps(result, indent=2) if as_json else _format_text(result))
