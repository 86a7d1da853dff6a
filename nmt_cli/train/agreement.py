"""Every rank starts from one training state, rank 0's, or training refuses.

Only global rank 0 writes checkpoints. With `--save-dir` on a shared filesystem every
rank reads the same `checkpoint_last.pt`; with node-local directories the other nodes
have none, and restarting them from update 0 while rank 0 resumes would silently train
a different model (and hang at the end, the ranks counting different updates). The rule:

* rank 0 holds `checkpoint_last.pt`: every rank without one receives rank 0's file, byte
  for byte, over the process group and resumes from it;
* a rank whose own `checkpoint_last.pt` holds another state than rank 0's (an old copy,
  another run's directory) is refused, never overridden: which of the two is the newer
  is not for `nmt train` to guess, and overriding could throw away the newer one;
* rank 0 holds none while another rank does (e.g. the node ranks were swapped between
  launches): refused too, since rank 0 would start over while that node has progress.

After restoring, `check_ranks_agree` compares every rank's `TrainingState` (update count,
data position, optimizer step, fingerprints of the weights and of the batch plan, the
training and model settings) with rank 0's and refuses with one line naming the ranks that differ. Failures while loading
are gathered too, so that one rank's error stops every rank instead of leaving the others
waiting in the next collective.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist

from nmt_cli.checkpoints.format import load_checkpoint, load_checkpoint_bytes
from nmt_cli.config import ModelConfig, TrainConfig
from nmt_cli.errors import NmtError
from nmt_cli.train.distributed import DistInfo
from nmt_cli.train.resume_state import Progress

# Settings that may differ from node to node: paths and devices.
LOCAL_SETTINGS = ("data", "save_dir", "device", "tensorboard_logdir")
BROADCAST_CHUNK = 64 * 2**20  # bytes per broadcast: bounds the extra memory on every rank
REMEDY = ("every rank must resume from rank 0's checkpoint: remove the other ranks' checkpoint_last.pt "
          "(rank 0's is then sent to them) or replace it with a copy of rank 0's")


@dataclass(frozen=True)
class ResumeState:
    """The checkpoint this rank resumes from (None: a fresh start) and where it came from."""

    state: dict[str, Any] | None
    origin: str  # e.g. "its own checkpoint_last.pt", "rank 0's checkpoint", "no checkpoint"


@dataclass(frozen=True)
class LocalCheckpoint:
    """What one rank found in its own --save-dir (gathered from every rank)."""

    error: str | None
    num_updates: int | None  # None: no checkpoint_last.pt


@dataclass(frozen=True)
class TrainingState:
    """What every rank must agree on before its first update."""

    num_updates: int
    epoch: int
    batches_done: int
    optimizer_step: int
    weights: str  # fingerprint of the model's parameters and buffers
    batch_plan: str  # fingerprint of the training batches: the data and the batching flags
    settings: tuple[tuple[str, str], ...]  # (flag, value) of every setting but LOCAL_SETTINGS
    ema: str = ""  # fingerprint of the EMA weights (--ema-decay), "" without

    def describe(self) -> str:
        return (f"update {self.num_updates}, epoch {self.epoch} batch {self.batches_done}, optimizer step "
                f"{self.optimizer_step}, weights {self.weights}, batch plan {self.batch_plan}"
                + (f", EMA {self.ema}" if self.ema else ""))


def gather(value: Any, dist: DistInfo) -> list[Any]:
    """`value` of every rank, in rank order (a list of one in a world of one)."""
    if dist.world_size == 1:
        return [value]
    values: list[Any] = [None] * dist.world_size
    torch_dist.all_gather_object(values, value)
    return values


def raise_if_any_failed(error: str | None, dist: DistInfo) -> None:
    """On every rank: NmtError naming each rank whose `error` is set (in a world of one,
    the error as it is)."""
    if dist.world_size == 1:
        if error is not None:
            raise NmtError(error)
        return
    errors = gather(error, dist)
    failed = [f"rank {rank}: {message}" for rank, message in enumerate(errors) if message is not None]
    if failed:
        raise NmtError("; ".join(failed))


def resume_state(path: Path, dist: DistInfo, check: Callable[[dict[str, Any], Path], None]) -> ResumeState:
    """The checkpoint every rank resumes from: its own `path` or rank 0's (see the module's rule).

    `check(state, path)` raises NmtError when the state cannot be resumed here (another
    data-bin or architecture); it runs on every rank, on what that rank will use.
    """
    if dist.world_size == 1:
        if not path.exists():
            return ResumeState(None, "no checkpoint")
        state = load_checkpoint(path)  # a corrupt file is an error, never a silent restart
        check(state, path)
        return ResumeState(state, f"its own {path}")
    state, error = None, None
    try:
        if path.exists():
            state = load_checkpoint(path)
            check(state, path)
    except NmtError as failure:
        error = str(failure)
    found = gather(LocalCheckpoint(error, None if state is None else int(state.get("num_updates", -1))), dist)
    failed = [f"rank {rank}: {local.error}" for rank, local in enumerate(found) if local.error is not None]
    if failed:  # on every rank, so that none waits for the others in a later collective
        raise NmtError("; ".join(failed))
    holders = [rank for rank, local in enumerate(found) if local.num_updates is not None]
    if found[0].num_updates is None:
        if holders:
            listed = ", ".join(f"rank {rank} (update {found[rank].num_updates})" for rank in holders)
            raise NmtError(f"rank 0 has no {path.name} in its --save-dir but {listed} has one: launch the node "
                           f"that holds the latest checkpoint as node rank 0, or remove the others' {path.name} "
                           "to start over")
        return ResumeState(None, "no checkpoint")
    if len(holders) == dist.world_size:
        return ResumeState(state, f"its own {path}")
    data = broadcast_file(path if dist.is_main else None, dist)
    if state is not None:  # this rank keeps its own; check_ranks_agree compares it with rank 0's
        raise_if_any_failed(None, dist)
        return ResumeState(state, f"its own {path}")
    error = None
    try:
        state = load_checkpoint_bytes(data, path)
        check(state, path)
    except NmtError as failure:
        error = str(failure)
    raise_if_any_failed(error, dist)
    return ResumeState(state, "rank 0's checkpoint")


def broadcast_file(path: Path | None, dist: DistInfo) -> bytes:
    """The bytes of rank 0's file `path` on every rank (`path` is read on rank 0 only)."""
    # NCCL moves only GPU tensors; gloo, CPU ones.
    device = dist.device if torch_dist.get_backend() == "nccl" else torch.device("cpu")
    data = path.read_bytes() if path is not None else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    torch_dist.broadcast(size, src=0)
    received = bytearray()
    for start in range(0, int(size.item()), BROADCAST_CHUNK):
        length = min(BROADCAST_CHUNK, int(size.item()) - start)
        if dist.is_main:
            chunk = torch.frombuffer(bytearray(data[start : start + length]), dtype=torch.uint8).to(device)
        else:
            chunk = torch.empty(length, dtype=torch.uint8, device=device)
        torch_dist.broadcast(chunk, src=0)
        if not dist.is_main:
            received += chunk.cpu().numpy().tobytes()
    return data if dist.is_main else bytes(received)


def fingerprint_tensors(tensors: dict[str, torch.Tensor]) -> str:
    """A short hash of the names, dtypes, shapes and exact bytes of `tensors`."""
    digest = hashlib.blake2b(digest_size=8)
    for name, tensor in tensors.items():
        value = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def fingerprint_batches(batches: list[np.ndarray]) -> str:
    """A short hash of the batch plan: which pairs, in which batches."""
    digest = hashlib.blake2b(digest_size=8)
    for batch in batches:
        digest.update(len(batch).to_bytes(8, "little"))
        digest.update(np.asarray(batch, dtype=np.int64).tobytes())
    return digest.hexdigest()


def optimizer_step(optimizer: torch.optim.Optimizer) -> int:
    """The optimizer's own count of steps taken (0 before the first)."""
    steps = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    return max(steps, default=0)


def shared_settings(cfg: TrainConfig, model_cfg: ModelConfig) -> tuple[tuple[str, str], ...]:
    """The settings every rank must share, as (flag, value) pairs."""
    values = {k: v for k, v in cfg.to_dict().items() if k not in LOCAL_SETTINGS} | model_cfg.to_dict()
    return tuple(sorted((f"--{name.replace('_', '-')}", repr(value)) for name, value in values.items()))


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, progress: Progress,
                   batches: list[np.ndarray], settings: tuple[tuple[str, str], ...],
                   ema_weights: dict[str, torch.Tensor] | None = None) -> TrainingState:
    return TrainingState(progress.num_updates, progress.epoch, progress.batches_done, optimizer_step(optimizer),
                         fingerprint_tensors(model.state_dict()), fingerprint_batches(batches), settings,
                         fingerprint_tensors(ema_weights) if ema_weights is not None else "")


def settings_differences(reference: TrainingState, other: TrainingState) -> str:
    """`--flag a (rank 0: b), ...` for the settings that differ, or ""."""
    theirs = dict(reference.settings)
    return ", ".join(f"{flag} {value} (rank 0: {theirs.get(flag)})" for flag, value in other.settings
                     if theirs.get(flag) != value)


def check_ranks_agree(mine: TrainingState, origin: str, dist: DistInfo) -> None:
    """On every rank: NmtError naming the ranks whose state differs from rank 0's."""
    if dist.world_size == 1:
        return
    states = gather((mine, origin), dist)
    reference, _ = states[0]
    differ = [rank for rank, (state, _) in enumerate(states) if state != reference]
    if not differ:
        return
    details = "; ".join(
        f"rank {rank} ({origin}): {state.describe()}"
        + (f", settings {changed}" if rank and (changed := settings_differences(reference, state)) else "")
        for rank, (state, origin) in enumerate(states) if rank == 0 or rank in differ)
    ranks = ", ".join(str(rank) for rank in differ)
    raise NmtError(f"rank(s) {ranks} disagree with rank 0 on the training state at start: {details}; {REMEDY}")
