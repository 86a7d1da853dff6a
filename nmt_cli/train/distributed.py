"""Process-group setup: which rank this is, which device it uses.

Under `torchrun`, or launched by hand on each node, the environment holds RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; with WORLD_SIZE > 1 the default
process group is initialised from it (NCCL on GPU, gloo on CPU). A plain `nmt train` is
a world of one and touches no process group.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from nmt_cli.errors import NmtError
from nmt_cli.machine import check_cuda_device, default_device


# After this long without rank 0, a waiting rank says what it waits for.
WAIT_NOTICE_SECONDS = 10.0
# The store key under which each rank says it has joined (one key per rank: JOINED_KEY/RANK).
JOINED_KEY = "nmt/joined"


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
    for every rank to join.

    Launched by hand (MASTER_ADDR and the rest set for each process), the ranks meet at rank
    0's store in `wait_for_ranks`, a wait in Python that Ctrl-C and SIGTERM end: torch's own
    wait for them retries in C++ through both signals. Under torchrun every rank starts
    once all nodes have met, in torchrun's agent, so torch's rendezvous has nothing to wait for.
    """
    timeout = timedelta(minutes=30)
    backend = "nccl" if device.type == "cuda" else "gloo"
    placement = {"device_id": device} if device.type == "cuda" else {}
    try:
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            wait_for_store(rank, world_size, timeout)
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, **placement)
            return
        if rank != 0:
            wait_for_store(rank, world_size, timeout)
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                              is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        wait_for_ranks(store, rank, world_size, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                                **placement)
    except dist.DistError as error:
        raise _launch_error(error, rank, world_size) from None


def wait_for_store(rank: int, world_size: int, timeout: timedelta) -> None:
    """Wait until MASTER_ADDR:MASTER_PORT takes connections: rank 0's store, or torchrun's.

    torch's own wait for it retries in C++ through signals: a rank started before rank 0
    took neither Ctrl-C nor SIGTERM, and printed a C++ stack at each. Waited for here,
    in Python, a signal ends the wait; torch then connects at once.
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


def wait_for_ranks(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
    """Mark this rank as joined in the store and wait, in Python, until every rank has.

    One key per rank, so a rank that is restarted while the others wait counts once.
    """
    keys = [f"{JOINED_KEY}/{other}" for other in range(world_size)]
    started = time.monotonic()
    noticed = False
    missing: list[int] = []

    def missing_ranks() -> list[int]:  # one request a key: only for the messages
        with _native_stderr_silenced():
            return [other for other, key in enumerate(keys) if not store.check([key])]

    try:
        with _native_stderr_silenced():
            store.set(keys[rank], "1")
        while True:
            with _native_stderr_silenced():
                if store.check(keys):  # one request for all the keys, however many ranks poll
                    return
            waited = time.monotonic() - started
            if waited > timeout.total_seconds():
                missing = missing_ranks()
                raise NmtError(f"rank {rank} of {world_size}: {_listed(missing)} did not join at MASTER_ADDR:"
                               f"MASTER_PORT within {waited / 60:.0f} minutes; are they running with the same "
                               "MASTER_ADDR, MASTER_PORT and WORLD_SIZE?")
            if waited > WAIT_NOTICE_SECONDS and not noticed:  # a silent half hour would look like a hang
                noticed, missing = True, missing_ranks()
                print(f"rank {rank} of {world_size}: waiting for {_listed(missing)} to join "
                      "(for up to 30 minutes)", file=sys.stderr, flush=True)
            time.sleep(0.2)
    except dist.DistError:
        waiting_for = f" while waiting for {_listed(missing)} to join" if missing else ""
        raise NmtError(f"rank {rank} of {world_size}: rank 0's store at MASTER_ADDR:MASTER_PORT "
                       f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} closed{waiting_for}; "
                       "did rank 0 stop?") from None


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Standard error closed to C++ for the block: torch's store logs a warning with a C++
    stack before it raises on a lost connection, which `wait_for_ranks` reports in one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _listed(ranks: list[int]) -> str:
    """"rank 3", "ranks 2, 3"."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


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
