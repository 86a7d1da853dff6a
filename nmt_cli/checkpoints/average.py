"""`nmt average`: average the parameters of several checkpoints (Vaswani et al., 2017, section 6.1).

Semantics follow fairseq's `scripts/average_checkpoints.py`: explicit checkpoint
files, or the last N `checkpoint_{EPOCH}_{UPDATES}.pt` (by update count) or
`checkpoint{EPOCH}.pt` (by epoch) of a run directory. Checkpoints are read one at
a time into a float64 running sum, so memory holds the sum and one checkpoint
however many are averaged; the mean is cast back to each parameter's dtype.
Integer and bool buffers come from the newest checkpoint. Training state
(optimizer, scheduler, scaler, RNG, iterator) is dropped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nmt_cli.checkpoints.ema_weights import with_ema_as_model
from nmt_cli.checkpoints.format import (MODEL_KEYS, check_finite_weights, check_weights_fit_config, load_checkpoint,
                                        save_checkpoint)
from nmt_cli.checkpoints.names import EPOCH_PATTERN, UPDATE_PATTERN, epoch_of, is_training_checkpoint, updates_of
from nmt_cli.config import AverageConfig, ModelConfig
from nmt_cli.errors import NmtError, first_difference
from nmt_cli.files import refuse_overwriting_inputs

# Dropout rates may differ between checkpoints of one architecture (e.g. after fine-tuning).
IGNORED_CONFIG_FIELDS = ("dropout", "attention_dropout", "activation_dropout")


def last_n_checkpoints(directory: Path, n: int, update_based: bool, upper_bound: int | None = None) -> list[Path]:
    """The last `n` numbered checkpoints of a run directory, oldest first.

    `update_based`: `checkpoint_{EPOCH}_{UPDATES}.pt` ordered by UPDATES, else
    `checkpoint{EPOCH}.pt` ordered by EPOCH; `upper_bound` drops larger numbers.
    """
    if not directory.is_dir():
        raise NmtError(f"not a run directory: {directory}")
    number_of = updates_of if update_based else epoch_of
    entries = []
    for path in directory.iterdir():
        number = number_of(path.name)
        if number is not None and (upper_bound is None or number <= upper_bound):
            entries.append((number, path))
    if len(entries) < n:
        kind = UPDATE_PATTERN if update_based else EPOCH_PATTERN
        bound = f" up to {upper_bound}" if upper_bound is not None else ""
        raise NmtError(f"{directory}: found {len(entries)} {kind} files{bound}, need {n}")
    return [path for _, path in sorted(entries)[-n:]]


def select_checkpoints(cfg: AverageConfig) -> list[Path]:
    """The checkpoint files to average, oldest first (explicit files keep their command-line order)."""
    if cfg.num_last is None:
        return [Path(p) for p in cfg.inputs]
    return last_n_checkpoints(
        Path(cfg.inputs[0]), cfg.num_last, cfg.num_update_checkpoints is not None, cfg.checkpoint_upper_bound
    )


def fingerprint(state: dict[str, Any]) -> dict[str, Any]:
    """What must agree between checkpoints to average them (dropout rates may differ)."""
    weights = state["model"]
    return {
        # As the model reads it: fields an older nmt did not write take their defaults.
        "architecture": {k: v for k, v in ModelConfig.from_dict(state["model_config"]).to_dict().items()
                         if k not in IGNORED_CONFIG_FIELDS},
        "languages": (state.get("source_lang"), state.get("target_lang")),
        "src_dict": state["src_dict"],
        "tgt_dict": state["tgt_dict"],
        "parameters": {k: (tuple(v.shape), v.dtype) for k, v in weights.items()},
        "tied": tied_keys(weights),
    }


def _difference_text(a: dict[str, Any], b: dict[str, Any]) -> str:
    """`key: a's value vs b's value` for two dicts that differ."""
    key, mine, theirs = first_difference(a, b) or ("?", None, None)
    return f"{key}: {mine!r} vs {theirs!r}"


def check_compatible(reference: dict[str, Any], reference_path: Path, other: dict[str, Any], path: Path) -> None:
    """One NmtError line unless two fingerprints agree; it names both files and the first difference."""
    if reference == other:
        return
    if reference["architecture"] != other["architecture"]:
        problem = f"different architectures ({_difference_text(reference['architecture'], other['architecture'])})"
    elif reference["languages"] != other["languages"]:
        pairs = ["-".join(map(str, fp["languages"])) for fp in (reference, other)]
        problem = f"different languages ({pairs[0]} vs {pairs[1]})"
    elif reference["src_dict"] != other["src_dict"] or reference["tgt_dict"] != other["tgt_dict"]:
        side = "src_dict" if reference["src_dict"] != other["src_dict"] else "tgt_dict"
        problem = f"different dictionaries ({side})"
    elif reference["parameters"] != other["parameters"]:
        problem = f"different parameters ({_difference_text(reference['parameters'], other['parameters'])})"
    else:
        problem = "different weight tying"
    raise NmtError(f"cannot average {reference_path} with {path}: {problem}")  # values in the files' order


def tied_keys(weights: dict[str, torch.Tensor]) -> dict[str, str]:
    """key -> earlier key holding the same tensor (tied embeddings), to keep them tied in the average."""
    first_by_storage: dict[tuple, str] = {}
    aliases = {}
    for key, tensor in weights.items():
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if identity in first_by_storage:
            aliases[key] = first_by_storage[identity]
        else:
            first_by_storage[identity] = key
    return aliases


def average_checkpoints(paths: Sequence[Path], use_ema: bool = False) -> dict[str, Any]:
    """The averaged checkpoint of `paths` (oldest first), loading one file at a time;
    `use_ema`: of their EMA weights (`nmt train --ema-decay`) instead of their weights."""
    if not paths:
        raise NmtError("no checkpoints to average")
    sums: dict[str, torch.Tensor] = {}  # float64 running sums of the floating-point tensors
    reference: dict[str, Any] = {}
    state: dict[str, Any] = {}
    for i, path in enumerate(paths):
        state = load_checkpoint(path)
        if use_ema:
            state = with_ema_as_model(state, path)
        current = fingerprint(state)
        if i == 0:
            reference = current
        check_compatible(reference, paths[0], current, path)
        check_finite_weights(state["model"], path)
        for key, tensor in state["model"].items():
            if key in current["tied"] or not tensor.is_floating_point():
                continue
            if key in sums:
                sums[key] += tensor.to(torch.float64)
            else:
                sums[key] = tensor.to(torch.float64, copy=True)
    # `state` is now the newest checkpoint: its integer/bool buffers and metadata are kept.
    averaged: dict[str, torch.Tensor] = {}
    for key, tensor in state["model"].items():
        if key in reference["tied"]:
            averaged[key] = averaged[reference["tied"][key]]
        elif key in sums:
            averaged[key] = sums.pop(key).div_(len(paths)).to(tensor.dtype)
        else:
            averaged[key] = tensor.clone()
    # The model keys come from the newest checkpoint; its training state is dropped.
    result = {k: state[k] for k in MODEL_KEYS if k in state}
    result["model"] = averaged
    result["averaged_checkpoints"] = [str(p) for p in paths]
    return result


def average(cfg: AverageConfig) -> list[Path]:
    """Average the checkpoints that `cfg` selects and write the result to `cfg.output`; return the inputs."""
    paths = select_checkpoints(cfg)
    # realpath, unlike Path.resolve, does not raise on a loop of links (loading says so).
    real = [os.path.realpath(p) for p in paths]
    repeated = next((p for p, r in zip(paths, real) if real.count(r) > 1), None)
    if repeated is not None:
        raise NmtError(f"--inputs names {repeated} more than once; it would count double in the average")
    if os.path.realpath(cfg.output) in real:
        raise NmtError(f"--output {cfg.output} is one of the checkpoints to average; write the average to a new file")
    # Nor any training checkpoint of the runs read: an average (no optimizer state) written
    # over RUN/checkpoint_last.pt would end the run's resumability.
    refuse_overwriting_inputs(cfg.output, [("--inputs", p) for p in [*paths, *_run_checkpoints(cfg, paths)]])
    averaged = average_checkpoints(paths, cfg.use_ema)
    # The inputs agreed with each other, but maybe not with their architecture (a damaged
    # file, copied): an average that `info` and `translate` would refuse is not written.
    check_weights_fit_config(averaged, paths[-1])  # the newest, whose model_config is kept
    save_checkpoint(averaged, cfg.output)
    return paths


def _run_checkpoints(cfg: AverageConfig, paths: Sequence[Path]) -> list[Path]:
    """The training checkpoints (last, best, numbered) of the run directories that `paths` come from."""
    directories = {Path(cfg.inputs[0])} if cfg.num_last is not None else {path.parent for path in paths}
    return [path for directory in sorted(directories) if directory.is_dir()
            for path in sorted(directory.iterdir()) if is_training_checkpoint(path.name)]
