"""What the machine has: the CPUs this process may use and the CUDA devices it sees.

Counts that start threads or processes (`--threads`, `--workers`) are bounded by the
CPUs: beyond them nothing runs faster, and a huge count exhausts memory or process
slots (OpenMP crashes starting 10^5 threads; a thousand workers each load a model).
The worker processes themselves end with the process that started them (`exit_with_parent`).
"""

from __future__ import annotations

import os
import re
import threading
import time

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


# How often a worker looks for its parent: a worker left behind ends within this time.
PARENT_CHECK_SECONDS = 0.25


def exit_with_parent(parent: int) -> None:
    """In a worker process: end it at once, quietly, when its parent `parent` (the pid the
    parent recorded when it started the worker) is gone.

    A parent killed by SIGKILL (the OOM killer, `kill -9`) or by a signal it does not
    handle (a lone SIGHUP) stops nothing, and its workers, reparented, would live on (a
    pool's wait forever on queues whose write ends they hold themselves). A daemon thread
    checks os.getppid(): a worker's parent pid changes to its new reaper's when the parent
    dies, and never comes back. One system call every PARENT_CHECK_SECONDS costs nothing
    measurable.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)  # no cleanup: the parent that would read the results is gone

    threading.Thread(target=watch, name="nmt exit with parent", daemon=True).start()


# What the resource tracker says when it removes a dead process's semaphores.
_TRACKER_WARNINGS = "ignore:resource_tracker:UserWarning:multiprocessing.resource_tracker"


def start_resource_tracker_quietly() -> None:
    """Start multiprocessing's resource tracker, unless it runs already, with its warnings
    about leftovers off.

    A worker pool's queues lock with POSIX semaphores (files in /dev/shm), which the
    tracker, a helper process, removes when the process that made them dies without doing
    it. After a SIGKILL of the main process it does so once the workers have ended, and
    warns of "leaked semaphore objects" on the user's terminal: nothing anyone need act on.
    The tracker takes its warning filters from PYTHONWARNINGS when it starts.
    """
    from multiprocessing import resource_tracker

    saved = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = f"{saved},{_TRACKER_WARNINGS}" if saved else _TRACKER_WARNINGS
    try:
        resource_tracker.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = saved
