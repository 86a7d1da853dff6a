"""Binarized corpora: token ids in a `.bin` file, sentence offsets in a `.idx` file.

`.bin` holds every sentence's ids back to back (uint16 when the vocabulary fits,
else int32, little-endian). `.idx` is a small header followed by int64 offsets
(n + 1 of them, in tokens); a `.idx` written by fairseq-preprocess is read too
(`fairseq_index.py`). Both are memory-mapped, so opening a corpus costs O(1)
memory and sentence i is one slice away.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from nmt_cli.data.fairseq_index import is_fairseq_index, read_fairseq_index
from nmt_cli.errors import NmtError

MAGIC = b"NMTIDX\x00\x01"
HEADER = struct.Struct("<8sBQ")  # magic, dtype code, number of sentences
DTYPES = {1: np.dtype("<u2"), 2: np.dtype("<i4")}
OFFSETS_CHUNK = 1 << 16  # offsets a builder holds before writing them out


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The smallest id type that holds every id of a vocabulary."""
    return DTYPES[1] if vocab_size <= 2**16 else DTYPES[2]


def dataset_exists(prefix: str | Path) -> bool:
    return Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file()


class IndexedDatasetBuilder:
    """Writes a corpus sentence by sentence; `finalize()` completes the index.

    Offsets go to the `.idx` file as they come, behind a header whose sentence count
    `finalize()` fills in, so memory stays the same whatever the corpus size (a file
    left by a killed run has a count of 0 and fails IndexedDataset's size check).
    """

    def __init__(self, prefix: str | Path, vocab_size: int) -> None:
        self.prefix = Path(prefix)
        self.dtype = dtype_for_vocab(vocab_size)
        self._code = next(c for c, d in DTYPES.items() if d == self.dtype)
        self._bin = open(f"{self.prefix}.bin", "wb")
        self._idx = open(f"{self.prefix}.idx", "wb")
        self._idx.write(HEADER.pack(MAGIC, self._code, 0))
        self._pending = array("q", [0])  # offsets not yet written
        self._count = 0  # sentences
        self._end = 0  # tokens

    def add(self, ids: Iterable[int]) -> None:
        values = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=self.dtype)
        self._bin.write(values.tobytes())
        self._end += len(values)
        self._pending.append(self._end)
        self._count += 1
        if len(self._pending) >= OFFSETS_CHUNK:
            self._write_pending()

    def merge(self, other_prefix: str | Path) -> None:
        """Append a finished corpus (e.g. one worker's shard) of the same dtype."""
        other = IndexedDataset(other_prefix)
        if other.dtype != self.dtype:
            raise NmtError(f"cannot merge {other_prefix}: id type {other.dtype} != {self.dtype}")
        with open(f"{other_prefix}.bin", "rb") as f:
            while chunk := f.read(1 << 24):
                self._bin.write(chunk)
        self._write_pending()
        for start in range(1, len(other) + 1, OFFSETS_CHUNK):
            chunk = np.asarray(other.offsets[start : start + OFFSETS_CHUNK], dtype=np.int64)
            self._idx.write((self._end + chunk).astype("<i8").tobytes())
        self._count += len(other)
        self._end += int(other.offsets[-1])

    def _write_pending(self) -> None:
        self._idx.write(np.frombuffer(self._pending, dtype=np.int64).astype("<i8").tobytes())
        self._pending = array("q")

    def finalize(self) -> None:
        self._bin.flush()
        os.fsync(self._bin.fileno())
        self._bin.close()
        self._write_pending()
        self._idx.seek(0)
        self._idx.write(HEADER.pack(MAGIC, self._code, self._count))
        self._idx.flush()
        os.fsync(self._idx.fileno())
        self._idx.close()


SIZES_CHUNK = 1 << 20  # sentences at a time: the int64 differences stay a few MiB


def sentence_sizes(offsets: np.ndarray) -> np.ndarray:
    """`np.diff(offsets)` in int16 (int32, int64 when a sentence is longer), chunk by chunk."""
    count = len(offsets) - 1
    longest = 0
    for start in range(0, count, SIZES_CHUNK):
        longest = max(longest, int(np.diff(offsets[start : start + SIZES_CHUNK + 1]).max()))
    dtype = next(np.dtype(t) for t in (np.int16, np.int32, np.int64) if longest <= np.iinfo(t).max)
    sizes = np.empty(max(count, 0), dtype=dtype)
    for start in range(0, count, SIZES_CHUNK):
        sizes[start : start + SIZES_CHUNK] = np.diff(offsets[start : start + SIZES_CHUNK + 1])
    return sizes


class IndexedDataset:
    """Read-only random access to a binarized corpus: `ds[i]` is sentence i's ids."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        idx_path, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        for path in (idx_path, bin_path):
            if not path.is_file():
                raise NmtError(f"binarized data not found: {path}")
        # A `.idx` written by fairseq-preprocess is read as it is (the `.bin` is the same format).
        if is_fairseq_index(idx_path):
            self.dtype, self.offsets = read_fairseq_index(idx_path)
        else:
            self.dtype, self.offsets = read_nmt_index(idx_path)
        expected_bin = int(self.offsets[-1]) * self.dtype.itemsize
        if bin_path.stat().st_size != expected_bin:
            raise NmtError(f"data file is truncated or corrupt ({bin_path.stat().st_size} bytes, expected {expected_bin}): {bin_path}")
        # np.memmap refuses empty files; an empty corpus is legal.
        self.data = np.memmap(bin_path, dtype=self.dtype, mode="r") if expected_bin else np.zeros(0, self.dtype)
        self._sizes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return np.asarray(self.data[self.offsets[i] : self.offsets[i + 1]], dtype=np.int64)

    @property
    def sizes(self) -> np.ndarray:
        """Length in tokens of every sentence, computed once in the smallest signed type
        that holds the longest (int16: 2 bytes a sentence, for any real corpus)."""
        if self._sizes is None:
            self._sizes = sentence_sizes(self.offsets)
        return self._sizes

    def id_range(self) -> tuple[int, int]:
        """The smallest and the largest id in the corpus ((0, -1) when it is empty)."""
        if not len(self.data):
            return 0, -1
        return int(self.data.min()), int(self.data.max())


def read_nmt_index(idx_path: Path) -> tuple[np.dtype, np.ndarray]:
    """The id type and the (memory-mapped) n + 1 token offsets of an nmt `.idx`."""
    with open(idx_path, "rb") as f:
        header = f.read(HEADER.size)
    if len(header) < HEADER.size or header[:8] != MAGIC:
        older = " (fairseq's cached/lazy format: rebinarize with fairseq-preprocess --dataset-impl mmap)" \
            if header[:8] == b"TNTIDX\x00\x00" else ""
        raise NmtError(f"not an nmt index file (bad header){older}: {idx_path}")
    _, code, count = HEADER.unpack(header)
    if code not in DTYPES:
        raise NmtError(f"unknown id type {code} in {idx_path}")
    expected_idx = HEADER.size + 8 * (count + 1)
    if idx_path.stat().st_size != expected_idx:
        raise NmtError(f"index file is truncated or corrupt ({idx_path.stat().st_size} bytes, expected {expected_idx}): {idx_path}")
    offsets = np.memmap(idx_path, dtype="<i8", mode="r", offset=HEADER.size, shape=(count + 1,))
    check_offsets(offsets, idx_path)
    return DTYPES[code], offsets


def check_offsets(offsets: np.ndarray, idx_path: Path) -> None:
    """NmtError unless the offsets start at 0 and never decrease (read chunk by chunk): a
    swapped or negative offset would slice another sentence's ids (numpy counts negative
    positions from the end)."""
    if offsets[0] != 0:
        raise NmtError(f"index file is corrupt (its first offset is {int(offsets[0])}, not 0): {idx_path}")
    for start in range(0, len(offsets) - 1, SIZES_CHUNK):
        decreasing = np.flatnonzero(np.diff(offsets[start : start + SIZES_CHUNK + 1]) < 0)
        if len(decreasing):
            i = start + int(decreasing[0])
            raise NmtError(f"index file is corrupt (sentence {i + 1} ends at offset {int(offsets[i + 1])}, before it "
                           f"starts at {int(offsets[i])}): {idx_path}")
