"""Checkpoints: atomic save, safe load (`weights_only=True`), model rebuild.

A checkpoint is a dict of plain values and tensors; its keys are listed in
docs/FORMATS.md. Saving writes a temporary file next to the target, fsyncs it and
renames it over the target, so a crash or a full disk never leaves a truncated
checkpoint behind and never damages the previous one.
"""

from __future__ import annotations

import io
import os
import re
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

from nmt_cli.config import ModelConfig
from nmt_cli.errors import NmtError
from nmt_cli.field_types import has_type
from nmt_cli.models.registry import build_model
from nmt_cli.models.transformer import Transformer
from nmt_cli.staging import check_file_name, fsync_path, replace_atomically

FORMAT_VERSION = 1
# What every checkpoint holds: the model and what decoding it needs (docs/FORMATS.md).
# A training checkpoint adds its training state; an average keeps only these.
MODEL_KEYS = (
    "format_version", "model_config", "model", "source_lang", "target_lang", "src_dict", "tgt_dict", "num_updates", "epoch"
)


def model_checkpoint(model_cfg: ModelConfig, weights: dict[str, torch.Tensor], source_lang: str | None,
                     target_lang: str | None, src_dict: Sequence[str], tgt_dict: Sequence[str],
                     num_updates: int, epoch: int) -> dict[str, Any]:
    """The `MODEL_KEYS` of a checkpoint of `weights` (symbol lists by id, specials first)."""
    return {
        "format_version": FORMAT_VERSION,
        "model_config": model_cfg.to_dict(),
        "model": weights,
        "source_lang": source_lang,
        "target_lang": target_lang,
        "src_dict": list(src_dict),
        "tgt_dict": list(tgt_dict),
        "num_updates": num_updates,
        "epoch": epoch,
    }

# The optional keys of a checkpoint (docs/FORMATS.md) and the types their values may have.
OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {
    "source_lang": (str,), "target_lang": (str,), "num_updates": (int,), "epoch": (int,),
    "best_metric": (float, int, type(None)), "patience_counter": (int,), "validated_at": (int, type(None)),
    "log_records": (int,), "train_config": (dict,), "optimizer": (dict,), "scheduler": (dict,),
    "scaler": (dict, type(None)), "iterator": (dict,), "rng": (dict,), "log_window": (dict,),
    "averaged_checkpoints": (list, tuple),
    "ema": (dict,),
}


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Write `state` to `path` atomically; on failure the previous file at `path` is intact."""
    check_file_name(path, "checkpoint")  # before Path drops a trailing `/`
    path = Path(path)
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file stands where a directory of the path should be
            raise NmtError(f"cannot write checkpoint {path}: a part of its directory is a file") from None
        replace_atomically(path, partial(_save, state))
    except (OSError, RuntimeError) as error:
        raise NmtError(f"cannot write checkpoint {path}: {write_failure_reason(error)}") from None


def serialise_checkpoint(state: dict[str, Any], tmp: Path, path: Path) -> None:
    """Write `state` into the temporary file `tmp` and sync it, for a caller that renames it
    to `path` itself (with other files of the same save); errors name `path`."""
    try:
        _save(state, tmp)
        fsync_path(tmp)
    except (OSError, RuntimeError) as error:
        tmp.unlink(missing_ok=True)
        raise NmtError(f"cannot write checkpoint {path}: {write_failure_reason(error)}") from None


def write_failure_reason(error: OSError | RuntimeError) -> str:
    """Why a file could not be written, in a few words ("No space left on device").

    torch reports a failure to write (inside its zip writer) as a RuntimeError about
    positions in the file; writing through a Python file, as `save_file` does, the
    OSError that caused it is its context, and says why."""
    if isinstance(error, RuntimeError) and isinstance(error.__context__, OSError) and error.__context__.strerror:
        error = error.__context__
    return error.strerror if isinstance(error, OSError) and error.strerror else _first_line(error)


def save_file(value: Any, path: Path) -> None:
    """torch.save `value` into a new file `path`; failing to write it (a full disk) is
    OSError, whatever torch raised, whose text says why (`write_failure_reason`)."""
    try:
        _save(value, path)
    except RuntimeError as error:
        raise OSError(write_failure_reason(error)) from None


def _save(state: dict[str, Any], tmp: Path) -> None:
    with open(tmp, "wb") as f:
        torch.save(state, f)


# The objects a fairseq checkpoint holds besides tensors: its arguments (fairseq < 0.10) or
# its omegaconf configuration (later).
FAIRSEQ_OBJECTS = ("argparse.Namespace", "omegaconf.", "fairseq.")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _load_failure_reason(error: Exception, path: Path) -> str:
    """A short reason for torch.load's (long, multi-line) complaints about the file `path`."""
    message = str(error)
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", message)
    if found and found.group(1).startswith(FAIRSEQ_OBJECTS):
        return (f"it looks like a fairseq checkpoint: convert it with `nmt import-fairseq {path} --dict-dir DIR "
                "--out RUN`, DIR holding its dict.SRC.txt and dict.TGT.txt, and use RUN/checkpoint.pt")
    if found:
        return (f"it holds a Python object ({found.group(1)}) besides tensors and plain values; "
                "refused, as loading it could run code")
    if isinstance(error, EOFError) or "zip archive" in message or "central directory" in message:
        return "the file is truncated or corrupt"
    found = re.search(r"WeightsUnpickler error:\s*(.+)", message)
    if found:
        return f"not a PyTorch checkpoint file; a safe load refused it: {found.group(1).strip()}"
    return "not a PyTorch checkpoint file"


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint`; never runs code stored in the file."""
    path = Path(path)
    if path.is_dir():
        raise NmtError(f"{path} is a directory, not a checkpoint file (e.g. {path / 'checkpoint_best.pt'})")
    if not path.is_file():
        raise NmtError(f"checkpoint not found: {path}")
    return _load_and_check(path, path, map_location)


def load_checkpoint_file(file: BinaryIO, path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint read from `file`, the open file `path`, checked as `load_checkpoint`
    checks a file: what is loaded is the file that was opened, even if another is renamed
    over `path` meanwhile."""
    return _load_and_check(file, Path(path), "cpu")


def load_checkpoint_bytes(data: bytes, path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint received as the bytes of the file `path` (e.g. from another rank),
    checked as `load_checkpoint` checks a file."""
    return load_checkpoint_file(io.BytesIO(data), path)


def _load_and_check(source: Path | BinaryIO, path: Path, map_location: str | torch.device) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")  # noise before the refusal
            state = torch.load(source, map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 - any failure here means "not a readable checkpoint"
        raise NmtError(f"not a readable nmt checkpoint: {path} ({_load_failure_reason(error, path)})") from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise NmtError(f"not an nmt checkpoint (no format_version): {path}")
    if state["format_version"] != FORMAT_VERSION:
        raise NmtError(
            f"checkpoint {path} has format_version {state['format_version']!r}; "
            f"this version of nmt reads format_version {FORMAT_VERSION}"
        )
    for key in ("model_config", "model", "src_dict", "tgt_dict"):
        if key not in state:
            raise NmtError(f"checkpoint {path} lacks {key!r}")
    if not isinstance(state["model"], dict):
        raise NmtError(f"checkpoint {path}: 'model' is not a dict of weights")
    check_weight_types(state["model"], path)
    for key, allowed in OPTIONAL_FIELDS.items():
        if key in state and not has_type(state[key], allowed):
            names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            raise NmtError(f"checkpoint {path}: {key!r} is a {type(state[key]).__name__}, not {names}")
    for key in ("src_dict", "tgt_dict"):
        if not isinstance(state[key], (list, tuple)) or not all(isinstance(s, str) for s in state[key]):
            raise NmtError(f"checkpoint {path}: {key!r} is not a list of symbols")
    try:
        ModelConfig.from_dict(state["model_config"])
    except NmtError as error:
        raise NmtError(f"checkpoint {path}: {error}") from None
    return state


def check_weight_types(weights: dict, source: str | os.PathLike) -> None:
    """NmtError naming the first entry of `weights` that is not a tensor under a string
    name. (Whether a tensor must hold floating-point numbers is the model's to say, in
    `check_state_dict_fits`: a state dict may hold integer buffers, which averaging keeps.)"""
    for key, value in weights.items():
        if not isinstance(key, str):
            raise NmtError(f"{source}: the weights hold a name that is not a string ({key!r})")
        if not isinstance(value, torch.Tensor):
            raise NmtError(f"{source}: weight {key} is a {type(value).__name__}, not a tensor")


def model_from_checkpoint(state: dict[str, Any], source: str | os.PathLike = "checkpoint") -> Transformer:
    """Rebuild the model of a loaded checkpoint (on the CPU) and load its weights.

    `source` names the checkpoint in error messages.
    """
    model = _untrained_model(state, source)
    weights = state["model"]
    check_state_dict_fits(model, weights, source)
    check_finite_weights(weights, source)
    model.load_state_dict(weights)
    return model


def check_weights_fit_config(state: dict[str, Any], source: str | os.PathLike) -> None:
    """NmtError unless a loaded checkpoint's weights are those of its model_config's
    architecture (checked on a model built on the meta device, which holds no memory)."""
    with torch.device("meta"):
        model = _untrained_model(state, source)
    check_state_dict_fits(model, state["model"], source)


def _untrained_model(state: dict[str, Any], source: str | os.PathLike) -> Transformer:
    """The architecture of a checkpoint's model_config, its weights not initialised
    (they are all loaded, or only their shapes are wanted)."""
    cfg = ModelConfig.from_dict(state["model_config"])
    try:
        return build_model(cfg, len(state["src_dict"]), len(state["tgt_dict"]), initialise=False)
    except NmtError as error:
        raise NmtError(f"{source}: {error}") from None


def check_finite_weights(weights: dict[str, torch.Tensor], source: str | os.PathLike) -> None:
    """NmtError naming the first tensor of `weights` that holds NaN or inf: such a model
    translates every line to nothing (a diverged run, or a damaged file)."""
    for key, tensor in weights.items():
        if tensor.is_floating_point() and not all_finite(tensor):
            raise NmtError(f"{source}: weight {key} holds NaN or infinite values (a diverged run or a damaged file)")


def all_finite(tensor: torch.Tensor) -> bool:
    """No entry of a floating-point tensor is NaN or infinite.

    A sum is NaN or infinite when an entry is, and it is one pass with nothing written,
    where `isfinite(...).all()` writes a byte per entry and reads it again: loading a
    large model checks every weight, so the cheap pass comes first. Finite entries can
    overflow a sum too, so only a sum that is not finite asks the exact question.
    """
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def check_state_dict_fits(model: nn.Module, weights: dict[str, torch.Tensor], source: str | os.PathLike) -> None:
    """NmtError, in one line, when `weights` is not a state dict of `model`'s architecture."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    wrong = [k for k in expected if k in weights and tuple(weights[k].shape) != tuple(expected[k].shape)]
    if not (missing or unexpected or wrong):
        for key, tensor in expected.items():
            if tensor.is_floating_point() and not weights[key].is_floating_point():
                raise NmtError(f"{source}: weight {key} is a tensor of {weights[key].dtype}, not of floating-point numbers")
        return
    details = []
    if missing:
        details.append(f"{len(missing)} missing (e.g. {missing[0]})")
    if unexpected:
        details.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
    if wrong:
        k = wrong[0]
        details.append(
            f"{len(wrong)} of another shape (e.g. {k}: {tuple(weights[k].shape)} in the file, "
            f"{tuple(expected[k].shape)} in the model)"
        )
    raise NmtError(f"{source}: the weights are not those of the architecture in its model_config: {'; '.join(details)}")
