"""What a run directory already holds when training starts, and whether it may go on.

Before the first update: an unfinished save is completed, an earlier run that cannot be
resumed (checkpoints or a log, but no checkpoint_last.pt) is refused unless --reset-run
asks to start over, and a checkpoint_best.pt that is not the run's best (written by an
earlier version, killed between two of its files) is repaired from the checkpoint that
holds the best model. A resume on another data-bin than the run's is refused too.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt_cli.checkpoints.names import BEST, LAST, is_numbered, is_scored_best
from nmt_cli.config import ModelConfig, TrainConfig
from nmt_cli.data.pairs import DataBin, PairDataset
from nmt_cli.errors import NmtError
from nmt_cli.staging import remove_stale_temp_files_in, replace_atomically
from nmt_cli.train.log import LOG_NAME
from nmt_cli.train.saving import finish_pending_save, run_config

# Bytes of each end of a split's .bin read into the data fingerprint (with its size and every offset).
FINGERPRINT_EDGE_BYTES = 1 << 20


def recover_run_dir(save_dir: Path, cfg: TrainConfig, model_cfg: ModelConfig, warn: Callable[[str], None]) -> None:
    """Bring `save_dir` to a state training can start from (rank 0 only, before resuming)."""
    reset_run, finetune_from = cfg.reset_run, cfg.finetune_from
    finish_pending_save(save_dir)
    history = run_history(save_dir)
    if history == [LOG_NAME] and _recorded_config(save_dir) == run_config(cfg, model_cfg):
        history = []  # this very run, killed before its first checkpoint: its log is written again
    if reset_run and finetune_from and any(_same_file(save_dir / name, Path(finetune_from)) for name in history):
        raise NmtError(f"--finetune-from {finetune_from} is one of the files of --save-dir {save_dir} that "
                       "--reset-run deletes; copy it elsewhere first")
    if reset_run and history:
        for name in history:
            (save_dir / name).unlink(missing_ok=True)
        warn(f"--reset-run: removed {describe(history)} of the earlier run in {save_dir}")
    elif history and LAST not in history:
        raise NmtError(f"--save-dir {save_dir} holds an earlier run ({describe(history)}) but no {LAST} "
                       "to resume from; training would overwrite it. Choose another --save-dir, or pass "
                       "--reset-run to delete those files and start over")
    # A run killed while writing left a temporary file as large as a checkpoint;
    # replacing a file sweeps only its own, and a numbered checkpoint (or the log,
    # cut only on some resumes) may never be written again.
    remove_stale_temp_files_in(save_dir)
    repair_best_checkpoint(save_dir, warn)


def _recorded_config(save_dir: Path) -> Any:
    try:
        return json.loads((save_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def run_history(save_dir: Path) -> list[str]:
    """The files of `save_dir` that training writes: checkpoints and the metrics log, sorted."""
    if not save_dir.is_dir():
        return []
    names = [p.name for p in save_dir.iterdir()]
    return sorted(n for n in names if n in (LAST, BEST, LOG_NAME) or is_numbered(n) or is_scored_best(n))


def describe(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def repair_best_checkpoint(save_dir: Path, warn: Callable[[str], None]) -> None:
    """Make checkpoint_best.pt the model of the run's best validation, as checkpoint_last.pt
    records it, when it is not (missing, or from another validation)."""
    last = _progress_of(save_dir / LAST)
    best_metric = last.get("best_metric") if last else None
    if best_metric is None:
        return
    best = _progress_of(save_dir / BEST)
    if best is not None and best.get("best_metric") == best_metric:
        return
    condition = "stale" if (save_dir / BEST).exists() else "missing"
    numbered = [n for n in run_history(save_dir) if is_numbered(n) or is_scored_best(n)]
    for name in [LAST, *numbered]:
        progress = last if name == LAST else _progress_of(save_dir / name)
        if progress is not None and _is_best_save(progress, best_metric):
            replace_atomically(save_dir / BEST, partial(shutil.copyfile, save_dir / name))
            warn(f"{save_dir / BEST} was {condition} (the run's best valid value is {best_metric:g}); "
                 f"replaced by a copy of {name}, which holds that model")
            return
    warn(f"{save_dir / BEST} is {condition}: the run's best valid value is {best_metric:g}, but no checkpoint "
         "of the run holds that model; the next improvement rewrites it")


def _is_best_save(progress: dict[str, Any], best_metric: float) -> bool:
    """Whether a checkpoint was written right after the validation that set `best_metric`."""
    validated_at = progress.get("validated_at")
    return (progress.get("best_metric") == best_metric and progress.get("patience_counter") == 0
            and validated_at is not None and validated_at == progress.get("num_updates"))


def _progress_of(path: Path) -> dict[str, Any] | None:
    """The progress values of a checkpoint, read without loading its tensors (None: unreadable)."""
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - unreadable is "not a usable best"; resuming reports a bad last
        return None
    if not isinstance(state, dict):
        return None
    return {key: state.get(key) for key in ("best_metric", "patience_counter", "validated_at", "num_updates")}


def data_fingerprint(data: DataBin, train_split: PairDataset) -> str:
    """Identifies the data a run trains on: its dictionaries and its training split (every
    sentence offset, the size and both ends of the token data)."""
    digest = hashlib.sha256()
    digest.update(json.dumps([list(data.src_dict.symbols), list(data.tgt_dict.symbols)]).encode("utf-8"))
    for dataset in (train_split.src, train_split.tgt):
        tokens = np.asarray(dataset.data)
        digest.update(f"{dataset.dtype.str} {len(dataset)} {len(tokens)}".encode())
        digest.update(np.ascontiguousarray(dataset.offsets).tobytes())
        edge = FINGERPRINT_EDGE_BYTES // dataset.dtype.itemsize
        digest.update(tokens[:edge].tobytes())
        digest.update(tokens[-edge:].tobytes())
    return digest.hexdigest()


def check_same_data(state: dict[str, Any], path: Path, fingerprint: str, data_path: Path) -> None:
    """Refuse to resume `path` on data other than the run's (older checkpoints record none)."""
    recorded = state.get("data_fingerprint")
    if isinstance(recorded, str) and recorded != fingerprint:
        raise NmtError(f"{path} was trained on other data than {data_path} (its dictionaries or training split "
                       "differ); resume it on its own data-bin, start a new run from its weights with "
                       "--finetune-from and another --save-dir, or pass --reset-run to start over")
