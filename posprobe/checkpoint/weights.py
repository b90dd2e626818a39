"""Read single tensors from a checkpoint folder, lazily, as float64 numpy arrays (no torch on this path).

Safetensors files are read with plain file reads at the offsets their JSON header gives, not memory-mapped:
only the bytes of the tensors asked for are read, and a vocabulary-sized embedding can be averaged a chunk
of rows at a time without ever being resident. Handles one `model.safetensors`, sharded safetensors with an
index, and (only when the caller allowed pickle) `pytorch_model.bin` through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posprobe.errors import PosprobeError

_CORRUPT_HINT = "the file is damaged or incomplete; re-download or re-save the checkpoint"
_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


class WeightReader:
    """Maps tensor names to files and reads only the tensors asked for.

    `keys()` lists every stored name; `get(name)` returns a float64 array; `row_mean(name)` the mean of a
    2-D tensor's rows; `find_suffix(suffix)` the shortest stored name ending in `suffix` (so that
    'bert.embeddings...' and 'embeddings...' both match).
    """

    def __init__(self, folder: Path, weight_format: str = "safetensors"):
        self.folder = Path(folder)
        self._pickle_state: dict | None = None
        if weight_format == "safetensors":
            self._entries = self._index_safetensors()
            self._names = list(self._entries)
        else:
            self._entries = {}
            self._names = list(self._load_pickle())

    # -- index -------------------------------------------------------------------------------------
    def _index_safetensors(self) -> dict[str, _Entry]:
        index_files = sorted(self.folder.glob("*.safetensors.index.json"))
        if index_files:
            try:
                files = sorted(set(json.loads(index_files[0].read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise PosprobeError(f"'{index_files[0]}' is not a valid safetensors index", _CORRUPT_HINT) from err
            paths = [self.folder / f for f in files]
        else:
            paths = sorted(self.folder.glob("*.safetensors"))
        entries: dict[str, _Entry] = {}
        for path in paths:
            if not path.is_file():
                raise PosprobeError(f"the safetensors index names '{path.name}', which is missing", _CORRUPT_HINT)
            entries.update(_read_header(path))
        return entries

    def _load_pickle(self) -> dict:
        import torch

        file = self.folder / "pytorch_model.bin"
        if not file.is_file():
            raise PosprobeError(
                f"'{self.folder}' holds sharded pickle weights, which posprobe does not read",
                "convert the checkpoint to safetensors (load it and `save_pretrained` it)",
            )
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:
            raise PosprobeError(f"cannot read '{file}': {_short(err)}", _CORRUPT_HINT) from err
        self._pickle_state = state
        return state

    # -- access ------------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._names)

    def __contains__(self, key: str) -> bool:
        return key in self._names

    def find_suffix(self, suffix: str) -> str | None:
        matches = [k for k in self._names if k == suffix or k.endswith("." + suffix)]
        return min(matches, key=len) if matches else None

    def get(self, key: str) -> np.ndarray:
        """Tensor `key` as a float64 array."""
        if key not in self._names:
            raise PosprobeError(f"checkpoint in '{self.folder}' has no tensor '{key}'", _CORRUPT_HINT)
        if self._pickle_state is not None:
            return _finite(self._pickle_state[key].double().numpy(), key, self.folder)
        entry = self._entries[key]
        return _finite(_read_rows(entry, 0, entry.shape[0] if entry.shape else 1), key, entry.file)

    def row_mean(self, key: str, chunk_rows: int = 1024) -> np.ndarray:
        """Mean over the rows of 2-D tensor `key` (float64), reading `chunk_rows` rows at a time."""
        if self._pickle_state is not None or key not in self._entries or len(self._entries[key].shape) != 2:
            return self.get(key).mean(axis=0)
        entry = self._entries[key]
        rows, cols = entry.shape
        total = np.zeros(cols, dtype=np.float64)
        for start in range(0, rows, chunk_rows):
            total += _read_rows(entry, start, min(start + chunk_rows, rows)).sum(axis=0)
        return _finite(total / rows, key, entry.file)


def _read_header(path: Path) -> dict[str, _Entry]:
    """Parse and check a safetensors header: 8-byte little-endian length, then a JSON table of tensors."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if not 2 <= length <= min(_MAX_HEADER, size - 8):
                raise ValueError("header length out of range")
            header = json.loads(fh.read(length))
        entries = {}
        data_start = 8 + length
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, (start, end) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
            if dtype not in _DTYPES:
                raise ValueError(f"tensor '{name}' has unsupported dtype {dtype}")
            if end - start != math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize or data_start + end > size:
                raise ValueError(f"tensor '{name}' lies outside the file or has the wrong byte size")
            entries[name] = _Entry(path, dtype, shape, data_start + start, data_start + end)
        return entries
    except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError) as err:
        raise PosprobeError(
            f"cannot read '{path}': not a valid safetensors file ({_short(err)})", _CORRUPT_HINT
        ) from err


def _read_rows(entry: _Entry, start: int, stop: int) -> np.ndarray:
    """Rows start..stop-1 of a tensor (its first axis) as float64."""
    shape = entry.shape or (1,)
    row_items = math.prod(shape[1:])
    itemsize = np.dtype(_DTYPES[entry.dtype]).itemsize
    with open(entry.file, "rb") as fh:
        fh.seek(entry.start + start * row_items * itemsize)
        raw = np.frombuffer(fh.read((stop - start) * row_items * itemsize), dtype=_DTYPES[entry.dtype])
    if entry.dtype == "BF16":  # numpy has no bfloat16: widen the 16-bit words to float32 (exact)
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    out = raw.astype(np.float64).reshape((stop - start, *shape[1:]))
    return out if entry.shape else out.reshape(())


def _finite(array: np.ndarray, key: str, where) -> np.ndarray:
    if not np.all(np.isfinite(array)):
        raise PosprobeError(
            f"tensor '{key}' in '{where}' contains NaN or infinite values", "the checkpoint is broken; use another one"
        )
    return array


def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
