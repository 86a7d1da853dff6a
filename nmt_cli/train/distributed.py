"""Process-group setup for `torchrun`: which rank this is, which device it uses.

Under `torchrun` the environment holds RANK, LOCAL_RANK and WORLD_SIZE; with
WORLD_SIZE > 1 the default process group is initialised from it (NCCL on GPU, gloo on
CPU). A plain `nmt train` is a world of one and touches no process group.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from nmt_cli.errors import NmtError
from nmt_cli.machine import check_cuda_device, default_device


# After this long without rank 0, a waiting rank says what it waits for.
WAIT_NOTICE_SECONDS = 10.0


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise NmtError(f"environment variable {name}={value!r} is not an integer") from None


def check_launch(world_size: int, rank: int, local_rank: int) -> None:
    """The launcher's settings (torchrun's environment), checked before the process group
    waits for its peers: a rank outside the world would wait for them for 30 minutes, and
    a missing address fails deep inside torch."""
    if world_size < 1:
        raise NmtError(f"environment variable WORLD_SIZE={world_size} must be at least 1")
    if not 0 <= rank < world_size:
        raise NmtError(f"environment variable RANK={rank} is not one of the ranks 0..{world_size - 1} of WORLD_SIZE")
    if local_rank < 0:
        raise NmtError(f"environment variable LOCAL_RANK={local_rank} must be at least 0")
    if world_size > 1:
        if not os.environ.get("MASTER_ADDR"):
            raise NmtError("environment variable MASTER_ADDR is not set: launch several processes with torchrun, "
                           "which sets it (or set MASTER_ADDR and MASTER_PORT)")
        port = _env_int("MASTER_PORT", 0)
        if not 0 < port < 65536:
            raise NmtError(f"environment variable MASTER_PORT={os.environ.get('MASTER_PORT')!r} is not a port "
                           "(1-65535), or it is not set")


def choose_device(device: str, local_rank: int) -> torch.device:
    """`auto`: this rank's GPU when there is one, else the CPU."""
    if device == "auto":
        device = default_device(f"cuda:{local_rank}")
    elif device == "cuda":
        device = f"cuda:{local_rank}"
    chosen = torch.device(device)
    if chosen.type == "cuda":
        check_cuda_device(device)
        torch.cuda.set_device(chosen)
    return chosen


def setup(device: str) -> DistInfo:
    """Initialise the process group when launched with WORLD_SIZE > 1."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    check_launch(world_size, rank, local_rank)
    chosen = choose_device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        join_process_group(rank, world_size, chosen)
    return DistInfo(rank, world_size, local_rank, chosen)


def join_process_group(rank: int, world_size: int, device: torch.device) -> None:
    """Make the default process group (NCCL on GPU, gloo on CPU), waiting up to 30 minutes
    for every rank to join."""
    timeout = timedelta(minutes=30)
    if rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        wait_for_store(rank, world_size, timeout)
    try:
        if device.type == "cuda":
            dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timeout, device_id=device)
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
    except dist.DistError as error:
        raise _launch_error(error, rank, world_size) from None


def wait_for_store(rank: int, world_size: int, timeout: timedelta) -> None:
    """Wait until MASTER_ADDR:MASTER_PORT takes connections: rank 0's store, or torchrun's.

    torch's own wait for it retries in C++ through signals: a rank started before rank 0
    took neither Ctrl-C nor SIGTERM, and printed a C++ stack at each. Waited for here,
    in Python, a signal ends the wait; torch then connects at once. (Once connected,
    torch's wait for the other ranks is its own again.)
    """
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    started = time.monotonic()
    noticed = False
    while True:
        try:
            socket.create_connection(address, timeout=5).close()
            return
        except OSError as error:
            waited = time.monotonic() - started
            if waited > timeout.total_seconds():
                raise NmtError(f"rank {rank} of {world_size}: nothing listens at MASTER_ADDR:MASTER_PORT "
                               f"{address[0]}:{address[1]} after {waited / 60:.0f} minutes "
                               f"({error.strerror or error}); is rank 0 running?") from None
            if waited > WAIT_NOTICE_SECONDS and not noticed:  # a silent half hour would look like a hang
                noticed = True
                print(f"rank {rank} of {world_size}: waiting for rank 0 at MASTER_ADDR:MASTER_PORT "
                      f"{address[0]}:{address[1]} (for up to 30 minutes)", file=sys.stderr, flush=True)
            time.sleep(0.5)


def _launch_error(error: dist.DistError, rank: int, world_size: int) -> NmtError:
    """torch's failure to make the process group, as one line."""
    address = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    if "EADDRINUSE" in str(error):
        return NmtError(f"rank {rank} cannot listen on MASTER_PORT {os.environ.get('MASTER_PORT')}: the port is in "
                        "use (by another run?); choose another MASTER_PORT")
    reason = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return NmtError(f"rank {rank} of {world_size} could not join the process group at MASTER_ADDR:MASTER_PORT "
                    f"{address}: {reason}")


def teardown(info: DistInfo) -> None:
    if info.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum `tensor` over ranks (in place); a no-op in a world of one."""
    if info.world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor
