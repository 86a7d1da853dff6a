"""Timing a benchmark step on its device, how busy the device is during it (kernel
time against wall time), and the rate of the device's matrix units.

A step whose kernels keep the GPU busy for a small part of its wall time is bound by
the host launching them, not by the GPU. Needs torch; imported only by the processes
that measure nmt or torch itself.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import torch
from torch.autograd import DeviceType


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(run: Callable[[], None], steps: int, warmup: int, device: torch.device) -> float:
    """Wall time of one call of `run`, the mean of `steps` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        run()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        run()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def matrix_rate_tflops(device: torch.device, dtype: torch.dtype) -> tuple[float, int]:
    """TFLOP/s of one large square matrix product in `dtype`, timed here, and its size.

    What the device's matrix units reach on a product shaped for them: the measured
    limit for a model's products, where a data sheet's peak may not be reachable at all.
    """
    size = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    out = torch.empty(size, size, device=device, dtype=dtype)
    steps = 20 if device.type == "cuda" else 5
    seconds = seconds_per_call(lambda: torch.mm(a, b, out=out), steps, 2, device)
    return 2 * size**3 / seconds / 1e12, size


def device_busy_line(run: Callable[[], None], repeats: int, unit: str, device: torch.device) -> str:
    """Time `repeats` calls of `run`, then profile as many: one summary line (returned)
    and the top operators by device time (stderr). The wall time comes from the
    unprofiled calls, since profiling slows the host down."""
    wall = seconds_per_call(run, repeats, 1, device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(repeats):
            run()
        synchronize(device)
    events = prof.key_averages()
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(events.table(sort_by=sort_by, row_limit=25), file=sys.stderr)
    if device.type != "cuda":
        return f"# profile per {unit}: wall {wall * 1e3:.2f} ms (CPU: no device time)"
    print_copies_by_shape(prof, repeats, unit)
    # Kernel events only, as torch's own table totals them (operators would count twice).
    busy_us = sum(e.self_device_time_total for e in events
                  if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False))
    busy = busy_us / 1e6 / repeats
    return f"# profile per {unit}: wall {wall * 1e3:.2f} ms, device busy {busy * 1e3:.2f} ms ({busy / wall:.0%})"


def print_copies_by_shape(prof: torch.profiler.profile, repeats: int, unit: str, rows: int = 15) -> None:
    """The costliest copies (dtype casts, making tensors contiguous, concatenation) by
    input shapes (stderr): the shapes tell activations from weights."""
    copies = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in ("aten::copy_", "aten::cat")]
    copies.sort(key=lambda e: -e.self_device_time_total)
    print(f"costliest copies, device ms per {unit}:", file=sys.stderr)
    for e in copies[:rows]:
        ms = e.self_device_time_total / 1e3 / repeats
        print(f"  {ms:7.3f}  {e.count // repeats:4d} calls  {e.key}  {e.input_shapes}", file=sys.stderr)
