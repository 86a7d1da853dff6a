"""fairseq's `.idx` files (its `MMapIndexedDataset` format), read into nmt's offsets.

`fairseq-preprocess` writes a `.bin` of ids back to back, as nmt does, and a `.idx` of
its own: the magic `MMIDIDX\\0\\0`, version 1 (uint64), an id type code (uint8), the
number of sentences n (uint64), then n int32 sizes and n int64 byte positions. nmt
reads the pair in place (no conversion): the sizes become the n + 1 token offsets that
`IndexedDataset` works with, and the positions must be those of sentences back to back,
as fairseq-preprocess writes them.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from nmt_cli.errors import NmtError

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQ")  # magic, version, id type code, number of sentences
# fairseq's codes (fairseq/data/indexed_dataset.py); the float types are never ids.
DTYPES = {1: np.dtype("u1"), 2: np.dtype("i1"), 3: np.dtype("<i2"), 4: np.dtype("<i4"), 5: np.dtype("<i8"),
          8: np.dtype("<u2"), 9: np.dtype("<u4"), 10: np.dtype("<u8")}


def is_fairseq_index(idx_path: Path) -> bool:
    with open(idx_path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def read_fairseq_index(idx_path: Path) -> tuple[np.dtype, np.ndarray]:
    """The id type and the n + 1 token offsets of a fairseq `.idx`, or NmtError naming the file."""
    with open(idx_path, "rb") as f:
        header = f.read(HEADER.size)
    if len(header) < HEADER.size:
        raise NmtError(f"fairseq index file is truncated (no complete header): {idx_path}")
    _, version, code, count = HEADER.unpack(header)
    if version != 1:
        raise NmtError(f"fairseq index file has version {version}; nmt reads version 1: {idx_path}")
    if code not in DTYPES:
        raise NmtError(f"fairseq index file has id type code {code}, not an integer type: {idx_path}")
    expected = HEADER.size + 12 * count
    if idx_path.stat().st_size < expected:
        raise NmtError(f"fairseq index file is truncated or corrupt ({idx_path.stat().st_size} bytes, "
                       f"expected {expected}): {idx_path}")
    dtype = DTYPES[code]
    sizes = np.memmap(idx_path, dtype="<i4", mode="r", offset=HEADER.size, shape=(count,)) if count else np.zeros(0, "<i4")
    if len(sizes) and int(sizes.min()) < 0:
        raise NmtError(f"fairseq index file is corrupt (a negative sentence size): {idx_path}")
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(sizes, dtype=np.int64, out=offsets[1:])
    if count:
        positions = np.memmap(idx_path, dtype="<i8", mode="r", offset=HEADER.size + 4 * count, shape=(count,))
        if not np.array_equal(positions, offsets[:-1] * dtype.itemsize):
            raise NmtError(f"fairseq index file does not describe sentences stored back to back (as "
                           f"fairseq-preprocess writes them): {idx_path}")
    return dtype, offsets
