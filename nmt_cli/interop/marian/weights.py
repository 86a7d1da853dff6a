"""The tensors of a Hugging Face model directory, read without running code stored in it.

`model.safetensors` (or the shards that `model.safetensors.index.json` lists) is parsed
here directly: an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the raw bytes. `pytorch_model.bin` is a pickle, read
with torch's `weights_only` unpickler, which builds tensors and nothing else.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import torch

from nmt_cli.errors import NmtError

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on the JSON header


def weight_files(directory: Path) -> list[Path]:
    """The files of the model in `directory`: model.safetensors, or model.safetensors.index.json
    and the shards it lists, or pytorch_model.bin."""
    single, index, pickled = (directory / name for name in
                              ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"))
    if single.is_file():
        return [single]
    if index.is_file():
        shards = [directory / name for name in sorted(set(_weight_map(index).values()))]
        missing = next((shard for shard in shards if not shard.is_file()), None)
        if missing is not None:
            raise NmtError(f"{index} lists the shard {missing.name}, which is not in {directory}")
        return [index, *shards]
    if pickled.is_file():
        return [pickled]
    raise NmtError(f"no model.safetensors, model.safetensors.index.json or pytorch_model.bin in {directory}")


def read_model_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor in the `weight_files` of a model, by its Hugging Face name."""
    weights: dict[str, torch.Tensor] = {}
    for path in files:
        if path.suffix == ".safetensors":
            weights.update(read_safetensors(path))
        elif path.suffix == ".bin":
            weights.update(read_pickled_weights(path))
    return weights


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file; a malformed file is an NmtError naming it."""
    try:
        with path.open("rb") as file:  # into writable memory, which torch.frombuffer wants
            data = bytearray(path.stat().st_size)
            file.readinto(data)
    except OSError as error:
        raise NmtError(f"cannot read {path}: {error.strerror or error}") from None
    if len(data) < 8:
        raise NmtError(f"{path} is not a safetensors file (shorter than its header length)")
    (header_length,) = struct.unpack("<Q", data[:8])
    if header_length > min(MAX_HEADER_BYTES, len(data) - 8):
        raise NmtError(f"{path} is not a safetensors file (header length {header_length} does not fit)")
    try:
        header = json.loads(data[8: 8 + header_length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise NmtError(f"{path} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise NmtError(f"{path} is not a safetensors file (its header is not a JSON object)")
    body = memoryview(data)[8 + header_length:]
    return {name: _tensor(path, name, entry, body) for name, entry in header.items() if name != "__metadata__"}


def _tensor(path: Path, name: str, entry: object, body: memoryview) -> torch.Tensor:
    """One header entry's tensor, checked against the body's size."""
    if not isinstance(entry, dict):
        raise NmtError(f"{path}: tensor {name}'s header entry is not a JSON object")
    dtype = SAFETENSORS_DTYPES.get(entry.get("dtype"))
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if dtype is None:
        raise NmtError(f"{path}: tensor {name} has dtype {entry.get('dtype')!r}, which nmt does not read")
    if not (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)):
        raise NmtError(f"{path}: tensor {name} has no valid shape")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(n, int) for n in offsets)
            and 0 <= offsets[0] <= offsets[1] <= len(body)):
        raise NmtError(f"{path}: tensor {name}'s data lies outside the file (a truncated file?)")
    count = 1
    for n in shape:
        count *= n
    itemsize = torch.empty((), dtype=dtype).element_size()
    if offsets[1] - offsets[0] != count * itemsize:
        raise NmtError(f"{path}: tensor {name} of shape {tuple(shape)} does not fill its {offsets[1] - offsets[0]} bytes")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(body, dtype=dtype, count=count, offset=offsets[0])
    return flat.reshape(shape).clone()  # a copy: the file's bytes are let go


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        weight_map = None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and "/" not in v for v in weight_map.values()):
        raise NmtError(f"{index} has no weight_map of tensor names to shard files in its directory")
    return weight_map


def read_pickled_weights(path: Path) -> dict[str, torch.Tensor]:
    """A `pytorch_model.bin` state dict, through torch's weights-only unpickler."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as error:
        raise NmtError(f"cannot read {path}: {error.strerror or error}") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError, TypeError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise NmtError(f"{path} is not a state dict that can be read without running its code ({first_line})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise NmtError(f"{path} does not hold a state dict of named tensors")
    return state
