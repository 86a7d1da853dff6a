"""Binarized corpora: token ids in a `.bin` file, sentence offsets in a `.idx` file.

`.bin` holds every sentence's ids back to back (uint16 when the vocabulary fits,
else int32, little-endian). `.idx` is a small header followed by int64 offsets
(n + 1 of them, in tokens). Both are memory-mapped, so opening a corpus costs O(1)
memory and sentence i is one slice away.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from nmt_cli.errors import NmtError

MAGIC = b"NMTIDX\x00\x01"
HEADER = struct.Struct("<8sBQ")  # magic, dtype code, number of sentences
DTYPES = {1: np.dtype("<u2"), 2: np.dtype("<i4")}


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The smallest id type that holds every id of a vocabulary."""
    return DTYPES[1] if vocab_size <= 2**16 else DTYPES[2]


def dataset_exists(prefix: str | Path) -> bool:
    return Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file()


class IndexedDatasetBuilder:
    """Writes a corpus sentence by sentence; `finalize()` writes the index."""

    def __init__(self, prefix: str | Path, vocab_size: int) -> None:
        self.prefix = Path(prefix)
        self.dtype = dtype_for_vocab(vocab_size)
        self._bin = open(f"{self.prefix}.bin", "wb")
        # A compact int64 array, not a list: 36M sentences cost 288 MB here, not ~1.3 GB.
        self._offsets = array("q", [0])

    def add(self, ids: Iterable[int]) -> None:
        values = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=self.dtype)
        self._bin.write(values.tobytes())
        self._offsets.append(self._offsets[-1] + len(values))

    def merge(self, other_prefix: str | Path) -> None:
        """Append a finished corpus (e.g. one worker's shard) of the same dtype."""
        other = IndexedDataset(other_prefix)
        if other.dtype != self.dtype:
            raise NmtError(f"cannot merge {other_prefix}: id type {other.dtype} != {self.dtype}")
        with open(f"{other_prefix}.bin", "rb") as f:
            while chunk := f.read(1 << 24):
                self._bin.write(chunk)
        base = self._offsets[-1]
        self._offsets.frombytes((base + np.asarray(other.offsets[1:], dtype=np.int64)).tobytes())

    def finalize(self) -> None:
        self._bin.flush()
        os.fsync(self._bin.fileno())
        self._bin.close()
        code = next(c for c, d in DTYPES.items() if d == self.dtype)
        with open(f"{self.prefix}.idx", "wb") as f:
            f.write(HEADER.pack(MAGIC, code, len(self._offsets) - 1))
            f.write(np.frombuffer(self._offsets, dtype=np.int64).astype("<i8").tobytes())
            f.flush()
            os.fsync(f.fileno())


class IndexedDataset:
    """Read-only random access to a binarized corpus: `ds[i]` is sentence i's ids."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        idx_path, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        for path in (idx_path, bin_path):
            if not path.is_file():
                raise NmtError(f"binarized data not found: {path}")
        with open(idx_path, "rb") as f:
            header = f.read(HEADER.size)
        if len(header) < HEADER.size or header[:8] != MAGIC:
            raise NmtError(f"not an nmt index file (bad header): {idx_path}")
        _, code, count = HEADER.unpack(header)
        if code not in DTYPES:
            raise NmtError(f"unknown id type {code} in {idx_path}")
        expected_idx = HEADER.size + 8 * (count + 1)
        if idx_path.stat().st_size != expected_idx:
            raise NmtError(f"index file is truncated or corrupt ({idx_path.stat().st_size} bytes, expected {expected_idx}): {idx_path}")
        self.dtype = DTYPES[code]
        self.offsets = np.memmap(idx_path, dtype="<i8", mode="r", offset=HEADER.size, shape=(count + 1,))
        self.sizes = _sentence_sizes(self.offsets, idx_path)
        expected_bin = int(self.offsets[-1]) * self.dtype.itemsize
        if bin_path.stat().st_size != expected_bin:
            raise NmtError(f"data file is truncated or corrupt ({bin_path.stat().st_size} bytes, expected {expected_bin}): {bin_path}")
        # np.memmap refuses empty files; an empty corpus is legal.
        self.data = np.memmap(bin_path, dtype=self.dtype, mode="r") if expected_bin else np.zeros(0, self.dtype)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return np.asarray(self.data[self.offsets[i] : self.offsets[i + 1]], dtype=np.int64)

    def id_range(self) -> tuple[int, int]:
        """The smallest and the largest id in the corpus ((0, -1) when it is empty)."""
        if not len(self.data):
            return 0, -1
        return int(self.data.min()), int(self.data.max())


def _sentence_sizes(offsets: np.ndarray, idx_path: Path) -> np.ndarray:
    """Length in tokens of every sentence (8 bytes a sentence), or NmtError unless the
    offsets start at 0 and never decrease: a swapped or negative offset would slice
    another sentence's ids (numpy counts negative positions from the end)."""
    if offsets[0] != 0:
        raise NmtError(f"index file is corrupt (its first offset is {int(offsets[0])}, not 0): {idx_path}")
    sizes = np.diff(np.asarray(offsets))
    decreasing = np.flatnonzero(sizes < 0)
    if len(decreasing):
        i = int(decreasing[0])
        raise NmtError(f"index file is corrupt (sentence {i + 1} ends at offset {int(offsets[i + 1])}, before it starts "
                       f"at {int(offsets[i])}): {idx_path}")
    return sizes
