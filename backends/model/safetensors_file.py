"""The tensors of a Hugging Face checkpoint's safetensors files, memory-mapped: one `model.safetensors`, or the
shards its `model.safetensors.index.json` lists.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and byte
range) and the data. The header is read here rather than through the `safetensors` library: its NumPy view has
no bfloat16, and it gives no byte offsets to map, while the loader needs each tensor's bytes as stored (the
CPU kernels read float16 and bfloat16 matrices as they are).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from backends.model.config import ModelLoadError

Q = GGMLQuantizationType
DTYPES = {"F32": Q.F32, "F16": Q.F16, "BF16": Q.BF16}  # the ones served; GGUF's types of the same layout
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER = 100 * 2**20  # the format's own limit


@dataclass(frozen=True)
class StoredTensor:
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    data: np.ndarray  # the tensor's bytes, a view of its file's map


def read_tensors(directory: Path) -> dict[str, StoredTensor]:
    """Every tensor of the checkpoint in `directory`, by its name there."""
    tensors: dict[str, StoredTensor] = {}
    for shard in _shards(directory):
        tensors.update(_read_file(shard))
    return tensors


def _shards(directory: Path) -> list[Path]:
    index = directory / INDEX
    if not index.is_file():
        if not (directory / SINGLE).is_file():
            raise ModelLoadError(f"{directory}: no {SINGLE} or {INDEX}")
        return [directory / SINGLE]
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise ModelLoadError(f"{index}: not a safetensors index ({exc})") from None
    missing = [n for n in names if not (directory / n).is_file()]
    if missing:
        raise ModelLoadError(f"{directory}: shard {missing[0]} listed in {INDEX} is missing")
    return [directory / n for n in names]


def _read_file(path: Path) -> dict[str, StoredTensor]:
    data = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        length = int.from_bytes(bytes(data[:8]), "little")
        if length > min(MAX_HEADER, data.shape[0] - 8):
            raise ValueError("header length past the file")
        header = json.loads(bytes(data[8 : 8 + length]))
        return {name: _tensor(path, name, entry, data, 8 + length)
                for name, entry in header.items() if name != "__metadata__"}
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{path}: not a safetensors file ({exc})") from None


def _tensor(path: Path, name: str, entry: dict[str, object], data: np.ndarray, start: int) -> StoredTensor:
    dtype = str(entry["dtype"])
    if dtype not in DTYPES:
        raise ModelLoadError(f"{path}: tensor '{name}' has dtype {dtype} (served: {', '.join(DTYPES)})")
    shape = tuple(int(d) for d in entry["shape"])  # type: ignore[attr-defined]
    begin, end = (int(x) for x in entry["data_offsets"])  # type: ignore[attr-defined]
    width = 4 if dtype == "F32" else 2
    if end - begin != width * int(np.prod(shape)) or start + end > data.shape[0]:
        raise ModelLoadError(f"{path}: tensor '{name}' does not fit its byte range")
    return StoredTensor(shape, DTYPES[dtype], data[start + begin : start + end])
