"""Read single tensors from a checkpoint folder, lazily, as float64 numpy arrays (no torch on this path).

Handles one `model.safetensors`, sharded safetensors with an index, and (only when the caller allowed
pickle) `pytorch_model.bin` through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from posprobe.errors import PosprobeError

_CORRUPT_HINT = "the file is damaged or incomplete; re-download or re-save the checkpoint"


class WeightReader:
    """Maps tensor names to files and reads only the tensors asked for.

    `keys()` lists every stored name; `get(name)` returns a float64 array; `find_suffix(suffix)` returns the
    shortest stored name ending in `suffix` (so 'bert.embeddings...' and 'embeddings...' both match).
    """

    def __init__(self, folder: Path, weight_format: str = "safetensors"):
        self.folder = Path(folder)
        self.weight_format = weight_format
        self._handles: dict[Path, object] = {}
        self._pickle_state: dict | None = None
        if weight_format == "safetensors":
            self._key_to_file = self._index_safetensors()
        else:
            self._key_to_file = {k: Path("pytorch_model.bin") for k in self._load_pickle()}

    # -- index -------------------------------------------------------------------------------------
    def _index_safetensors(self) -> dict[str, Path]:
        from safetensors import safe_open

        index_files = sorted(self.folder.glob("*.safetensors.index.json"))
        if index_files:
            try:
                weight_map = json.loads(index_files[0].read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as err:
                raise PosprobeError(f"'{index_files[0]}' is not a valid safetensors index", _CORRUPT_HINT) from err
            return {k: self.folder / v for k, v in weight_map.items()}
        mapping: dict[str, Path] = {}
        for file in sorted(self.folder.glob("*.safetensors")):
            try:
                handle = safe_open(str(file), framework="np")
            except Exception as err:  # SafetensorError, OSError
                raise PosprobeError(f"cannot read '{file}': {_short(err)}", _CORRUPT_HINT) from err
            self._handles[file] = handle
            for key in handle.keys():
                mapping[key] = file
        return mapping

    def _load_pickle(self) -> dict:
        import torch

        file = self.folder / "pytorch_model.bin"
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:
            raise PosprobeError(f"cannot read '{file}': {_short(err)}", _CORRUPT_HINT) from err
        self._pickle_state = state
        return state

    # -- access ------------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._key_to_file)

    def __contains__(self, key: str) -> bool:
        return key in self._key_to_file

    def find_suffix(self, suffix: str) -> str | None:
        matches = [k for k in self._key_to_file if k == suffix or k.endswith("." + suffix)]
        return min(matches, key=len) if matches else None

    def get(self, key: str) -> np.ndarray:
        """Tensor `key` as a float64 array."""
        if key not in self._key_to_file:
            raise PosprobeError(f"checkpoint in '{self.folder}' has no tensor '{key}'", _CORRUPT_HINT)
        if self._pickle_state is not None:
            return self._pickle_state[key].double().numpy()
        file = self._key_to_file[key]
        try:
            handle = self._open(file)
            dtype = handle.get_slice(key).get_dtype()
            array = _read_bfloat16(file, key) if dtype == "BF16" else handle.get_tensor(key)
        except PosprobeError:
            raise
        except Exception as err:
            raise PosprobeError(f"cannot read tensor '{key}' from '{file}': {_short(err)}", _CORRUPT_HINT) from err
        array = np.asarray(array, dtype=np.float64)
        if not np.all(np.isfinite(array)):
            raise PosprobeError(f"tensor '{key}' in '{file}' contains NaN or infinite values",
                                "the checkpoint is broken; use another one")
        return array

    def _open(self, file: Path):
        from safetensors import safe_open

        if file not in self._handles:
            if not file.is_file():
                raise PosprobeError(f"the safetensors index names '{file.name}', which is missing", _CORRUPT_HINT)
            try:
                self._handles[file] = safe_open(str(file), framework="np")
            except Exception as err:
                raise PosprobeError(f"cannot read '{file}': {_short(err)}", _CORRUPT_HINT) from err
        return self._handles[file]


def _read_bfloat16(file: Path, key: str) -> np.ndarray:
    """numpy has no bfloat16: read the raw 16-bit words and widen them to float32 (exact)."""
    with open(file, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(header_len))
        entry = header[key]
        start, end = entry["data_offsets"]
        fh.seek(8 + header_len + start)
        raw = np.frombuffer(fh.read(end - start), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
