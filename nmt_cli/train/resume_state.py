"""Training progress and RNG state: what a checkpoint must hold to resume exactly.

Besides the keys of docs/FORMATS.md a training checkpoint holds `patience_counter`
(validations without improvement), `validated_at` (the update of the latest validation,
so that a resumed run does not validate that update again at the end of its epoch),
`log_records` (lines of train_log.jsonl written so far, so that a resumed run rewrites
the log from exactly that point), `best_checkpoints` (the files of --keep-best-checkpoints
and their exact values, best first, as `[name, value]` pairs) and
`log_window` (the statistics gathered since the last log line, `Window.checkpoint_state`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt_cli.checkpoints.names import is_scored_best
from nmt_cli.config import ModelConfig
from nmt_cli.data.pairs import DataBin
from nmt_cli.errors import NmtError
from nmt_cli.train.best import ScoredCheckpoint

# Fields that may change between a run and its resumption; everything else shapes the weights.
RESUMABLE_MODEL_CHANGES = ("dropout", "attention_dropout", "activation_dropout")


@dataclass
class Progress:
    """Where training stands; `batches_done` counts batches of `epoch` already consumed."""

    num_updates: int = 0
    epoch: int = 1
    batches_done: int = 0
    best_metric: float | None = None
    patience_counter: int = 0
    validated_at: int | None = None
    log_records: int = 0
    best_checkpoints: list[ScoredCheckpoint] = field(default_factory=list)  # --keep-best-checkpoints, best first


def progress_to_checkpoint(progress: Progress, completed_epoch: int) -> dict[str, Any]:
    """The progress keys of a checkpoint; `completed_epoch` is what `epoch` reports."""
    return {
        "num_updates": progress.num_updates,
        "epoch": completed_epoch,
        "iterator": {"epoch": progress.epoch, "batches_done": progress.batches_done},
        "best_metric": progress.best_metric,
        "patience_counter": progress.patience_counter,
        "validated_at": progress.validated_at,
        "log_records": progress.log_records,
        "best_checkpoints": [[entry.name, entry.value] for entry in progress.best_checkpoints],
    }


def progress_from_checkpoint(state: dict[str, Any], path: Path) -> Progress:
    try:
        iterator = state["iterator"]
        return Progress(
            num_updates=int(state["num_updates"]),
            epoch=int(iterator["epoch"]),
            batches_done=int(iterator["batches_done"]),
            best_metric=None if state["best_metric"] is None else float(state["best_metric"]),
            patience_counter=int(state.get("patience_counter", 0)),
            validated_at=None if state.get("validated_at") is None else int(state["validated_at"]),
            log_records=int(state.get("log_records", 0)),
            best_checkpoints=_best_checkpoints(state.get("best_checkpoints", [])),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise NmtError(f"{path} is not a training checkpoint (no resumable progress: {error!r})") from None


def _best_checkpoints(entries: Any) -> list[ScoredCheckpoint]:
    """The kept-best list of a checkpoint; ValueError unless it is `[[NAME, VALUE], ...]`
    with fairseq's scored names (a file outside that pattern is never one to remove)."""
    if not isinstance(entries, list):
        raise ValueError(f"best_checkpoints is {type(entries).__name__}, not a list")
    kept = []
    for entry in entries:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str)
                and is_scored_best(entry[0]) and isinstance(entry[1], (int, float)) and math.isfinite(entry[1])):
            raise ValueError(f"best_checkpoints entry {entry!r:.80} is not [checkpoint.best_METRIC_SCORE.pt, value]")
        kept.append(ScoredCheckpoint(entry[0], float(entry[1])))
    return kept


@contextmanager
def restoring(part: str, path: Path) -> Iterator[None]:
    """Turn the failure to restore a checkpoint's `part` (a value of the wrong type or
    shape, a missing entry) into one NmtError naming the file: the structure of the
    optimizer and RNG states is torch's and Python's, checked by restoring them."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise NmtError(f"{path}: its {part} cannot be restored ({type(error).__name__}: {reason[:200]}); "
                       "not a training checkpoint written by nmt train") from None


def check_optimizer_state_fits(optimizer: torch.optim.Optimizer) -> None:
    """ValueError unless every per-parameter tensor of a loaded optimizer state (Adam's
    moments) has its parameter's shape: load_state_dict takes any, and the first step
    would fail on them."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            for name, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise ValueError(f"{name} of shape {tuple(value.shape)} for a parameter of shape {tuple(param.shape)}")


def capture_rng() -> dict[str, Any]:
    """RNG states as plain values and tensors (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(rng: dict[str, Any]) -> None:
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])


def seed_for_update(seed: int, num_updates: int, rank: int) -> None:
    """Seed torch's RNGs from (seed, update, rank): dropout masks then depend on nothing
    else, so a resumed run draws exactly the masks the uninterrupted run would have."""
    torch.manual_seed(int(np.random.SeedSequence([seed, num_updates, rank]).generate_state(1)[0]))


def check_compatible(state: dict[str, Any], path: Path, data: DataBin, model_cfg: ModelConfig) -> None:
    """NmtError unless the checkpoint was trained on this data-bin's languages and
    dictionaries, with this architecture (dropout rates may differ)."""
    pair = f"{state.get('source_lang')}-{state.get('target_lang')}"
    if (state.get("source_lang"), state.get("target_lang")) != (data.source_lang, data.target_lang):
        raise NmtError(f"{path} was trained on {pair}, the data-bin {data.path} is {data.source_lang}-{data.target_lang}")
    for key, dictionary, lang in (("src_dict", data.src_dict, data.source_lang), ("tgt_dict", data.tgt_dict, data.target_lang)):
        if list(state[key]) != dictionary.symbols:
            raise NmtError(f"{path} was trained with another {lang} dictionary than {data.path / f'dict.{lang}.txt'}")
    saved = ModelConfig.from_dict(state["model_config"])
    neutral = {name: 0.0 for name in RESUMABLE_MODEL_CHANGES}
    if dataclasses.replace(saved, **neutral) != dataclasses.replace(model_cfg, **neutral):
        differ = [f.name for f in dataclasses.fields(ModelConfig)
                  if f.name not in neutral and getattr(saved, f.name) != getattr(model_cfg, f.name)]
        details = ", ".join(f"{name}={getattr(saved, name)} (flags: {getattr(model_cfg, name)})" for name in differ)
        raise NmtError(f"{path} has another architecture than --arch and the model flags: {details}")
