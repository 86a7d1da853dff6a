"""Host memory: how much the machine has, and how the process's C library hands it out,
tuned for CPU training and decoding."""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# The largest block glibc lets the heap serve instead of mmap (HEAP_MAX_SIZE / 2 on 64-bit).
LARGEST_HEAP_BLOCK = 32 * 2**20
# The largest value mallopt takes (a C int): up to 2 GiB of free heap stays with the process.
NEVER_TRIM_BELOW = 2**31 - 1


def keep_freed_memory() -> bool:
    """Have glibc's malloc reuse freed blocks of up to 32 MiB instead of returning them.

    Training and beam search allocate and free tensors of the same sizes (activations,
    log-probabilities) at every step. By default glibc serves blocks above a threshold
    from fresh pages (mmap) and unmaps them when freed, so every step pays the page
    faults of touching them again. With the threshold at its maximum and trimming out of
    reach, such blocks come from the heap and are reused; larger ones (the per-batch
    decoding caches) stay mmap'd, which keeps peak memory where it was (turning mmap off
    altogether fragments the heap). Returns False, changing nothing, where the C
    library is not glibc. (Its effect on speed and memory: benchmarks/HISTORY.md.)
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process already uses
    except (OSError, AttributeError):
        return False  # e.g. musl, which has no mallopt
    return bool(mallopt(M_MMAP_THRESHOLD, LARGEST_HEAP_BLOCK)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM_BELOW))


def release_freed_memory() -> bool:
    """Give the memory that malloc holds free back to the system (glibc's malloc_trim).

    For one-off garbage that keep_freed_memory would otherwise keep for the process's
    life: loading a model frees its checkpoint's tensors and the weights that packing or
    quantization replaced, more than the model itself for a large model. Returns False,
    changing nothing, where the C library is not glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim(0)
    return True


# Entries kept by each of oneDNN's two caches of compiled kernels: its primitive cache and
# ideep's (torch's oneDNN wrapper) computation cache. Both are keyed by the product's shape,
# and decoding's row counts (a batch's tokens, its sentences x beam) take thousands of
# values: at their default of 1024 entries each they hold some 400 MB once full. A batch's
# steps reuse a handful of shapes, which this many entries keep.
ONEDNN_CACHE_ENTRIES = 256


def bound_onednn_caches(entries: int = ONEDNN_CACHE_ENTRIES) -> None:
    """Cap oneDNN's kernel caches at `entries` each, unless the environment already sets them.

    Both read their capacity from the environment once, when first used: this must run
    before the process's first oneDNN product (the packing of a model's weights is one)."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(entries))


def physical_memory_bytes() -> int | None:
    """The machine's physical memory in bytes, or None where the system does not say
    (no os.sysconf on Windows, names unknown to some systems, -1 when undetermined)."""
    try:
        page_size, pages = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    if page_size <= 0 or pages <= 0:
        return None
    return page_size * pages
