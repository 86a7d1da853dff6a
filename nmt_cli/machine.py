"""What the machine has: the CPUs this process may use and the CUDA devices it sees.

Counts that start threads or processes (`--threads`, `--workers`) are bounded by the
CPUs: beyond them nothing runs faster, and a huge count exhausts memory or process
slots (OpenMP crashes starting 10^5 threads; a thousand workers each load a model).
"""

from __future__ import annotations

import os
import re

from nmt_cli.errors import NmtError

# cpu, cuda (the current GPU) or cuda:N, with an index that torch can parse.
_DEVICE = re.compile(r"cpu|cuda(:(0|[1-9][0-9]{0,5}))?")


def default_device(cuda: str = "cuda") -> str:
    """`cuda` (a CUDA device string) when torch sees a GPU, else the CPU: the device of a
    command whose --device is not given."""
    import torch

    return cuda if torch.cuda.is_available() else "cpu"


def decoding_device(device: str | None, precision: str) -> str:
    """The device of translate and serve: --device as given, else a GPU when torch sees one,
    but the CPU for --precision int8 (a CPU-only precision)."""
    return device or ("cpu" if precision == "int8" else default_device())


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_cpu_count(flag: str, value: int) -> None:
    """NmtError unless 1 <= value <= the usable CPUs."""
    if value < 1:
        raise NmtError(f"{flag} must be >= 1 (got {value})")
    cpus = usable_cpus()
    if value > cpus:
        raise NmtError(f"{flag} {value} is more than the {cpus} CPU(s) this machine lets the process use; "
                       f"give at most {cpus}")


def check_device_string(device: str, flag: str = "--device", also: tuple[str, ...] = ()) -> None:
    """NmtError unless `device` is cpu, cuda, cuda:N or one of `also` (e.g. auto)."""
    if device in also or _DEVICE.fullmatch(device):
        return
    names = ", ".join((*also, "cpu", "cuda")) + " or cuda:N"
    raise NmtError(f"{flag} must be {names} (got {device!r})")


def check_cuda_device(device: str, flag: str = "--device") -> None:
    """NmtError unless the CUDA device `device` (cuda or cuda:N) exists on this machine."""
    import torch

    if not torch.cuda.is_available():
        raise NmtError(f"{flag} {device}: no CUDA device is available (use --device cpu)")
    index = torch.device(device).index
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise NmtError(f"{flag} {device}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")


def workers_cannot_start(error: OSError, need: str = "") -> NmtError:
    """The one error for worker processes (`--workers N`) that the OS will not start:
    the machine's state (`need` says what they need that it lacks), not any file's."""
    reason = error.strerror or str(error)
    needs = f" ({need})" if need else ""
    return NmtError(f"cannot start the --workers processes: {reason}{needs}; --workers 1 works in this process alone")
