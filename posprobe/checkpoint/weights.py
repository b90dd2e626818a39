"""Read single tensors from a checkpoint folder, lazily, as float64 numpy arrays (no torch on this path).

`open_weights(source)` gives the reader of any resolved checkpoint (GGUF files: `gguf_weights`).

Safetensors files are read with plain file reads at the offsets their JSON header gives, not memory-mapped:
only the bytes of the tensors asked for are read, and a vocabulary-sized embedding can be averaged a chunk
of rows at a time without ever being resident. Handles one `model.safetensors`, sharded safetensors with an
index, and (only when the caller allowed pickle) `pytorch_model.bin` through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import zipfile
from pathlib import Path

import numpy as np

from posprobe.checkpoint.resolve import shortest_suffix
from posprobe.checkpoint.safetensors_format import CORRUPT_HINT as _CORRUPT_HINT
from posprobe.checkpoint.safetensors_format import TensorEntry as _Entry
from posprobe.checkpoint.safetensors_format import read_header as _read_header
from posprobe.errors import PosprobeError, first_line, strip_ansi

_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}  # dtypes posprobe can turn into float64 (the format knows more, e.g. F8_E4M3: refused when read)


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
        weight_map = _read_index(index_files[0]) if index_files else None
        if weight_map is not None:
            paths = [self.folder / f for f in sorted(set(weight_map.values()))]
        else:
            paths = sorted(self.folder.glob("*.safetensors"))
        entries: dict[str, _Entry] = {}
        for path in paths:
            if not path.is_file():
                raise PosprobeError(f"the safetensors index names '{path.name}', which is missing", _CORRUPT_HINT)
            for name, entry in _read_header(path).items():
                if name in entries:
                    raise PosprobeError(
                        f"tensor '{name}' is stored twice, in '{entries[name].file.name}' and '{path.name}'",
                        _CORRUPT_HINT,
                    )
                entries[name] = entry
        for name, file in (weight_map or {}).items():
            if name not in entries or entries[name].file.name != file:
                raise PosprobeError(
                    f"the safetensors index puts tensor '{name}' in '{file}', which does not hold it", _CORRUPT_HINT
                )
        return entries

    def _load_pickle(self) -> dict:
        import torch

        file = self.folder / "pytorch_model.bin"
        if not file.is_file():
            raise PosprobeError(
                f"'{self.folder}' holds sharded pickle weights, which posprobe does not read",
                "convert the checkpoint to safetensors (load it and `save_pretrained` it)",
            )
        try:  # weights_only: the unpickler builds tensors and containers only and never calls other code
            # mmap only for torch's zip format; a legacy (pre-1.6, non-zip) pickle is read whole
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
        except pickle.UnpicklingError as err:
            raise unpickling_refused(file, err) from err
        except Exception as err:
            raise PosprobeError(f"cannot read '{file}': {_short(err)}", _CORRUPT_HINT) from err
        if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
        ):
            raise PosprobeError(f"'{file}' does not hold a map of tensor names to tensors", _CORRUPT_HINT)
        self._pickle_state = state
        return state

    # -- access ------------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._names)

    def __contains__(self, key: str) -> bool:
        return key in self._names

    def find_suffix(self, suffix: str) -> str | None:
        return shortest_suffix(self._names, suffix)

    def stored_dtype(self, key: str) -> str | None:
        """The safetensors dtype tensor `key` is stored in ('F32', 'BF16', ...); None for pickle weights."""
        entry = self._entries.get(key)
        return None if entry is None else entry.dtype

    def shape(self, key: str) -> tuple[int, ...] | None:
        """The stored shape of tensor `key` (read from the header, no data); None for an unknown key."""
        if self._pickle_state is not None:
            return tuple(self._pickle_state[key].shape) if key in self._pickle_state else None
        entry = self._entries.get(key)
        return None if entry is None else tuple(entry.shape)

    def get(self, key: str) -> np.ndarray:
        """Tensor `key` as a float64 array."""
        if key not in self._names:
            raise PosprobeError(f"checkpoint in '{self.folder}' has no tensor '{key}'", _CORRUPT_HINT)
        if self._pickle_state is not None:
            tensor = self._pickle_state[key]
            if tensor.is_complex() or tensor.dtype.itemsize == 1 and tensor.is_floating_point():
                raise PosprobeError(f"tensor '{key}' has dtype {tensor.dtype}, which posprobe does not read")
            return _finite(tensor.double().numpy(), key, self.folder)
        entry = self._entries[key]
        return _finite(_read_rows(entry, 0, entry.shape[0] if entry.shape else 1), key, entry.file)

    def row_mean(self, key: str, chunk_rows: int = 1024) -> np.ndarray:
        """Mean over the rows of 2-D tensor `key` (float64), reading `chunk_rows` rows at a time."""
        if self._pickle_state is not None or key not in self._entries or len(self._entries[key].shape) != 2:
            return self.get(key).mean(axis=0)
        entry = self._entries[key]
        rows, cols = entry.shape
        if rows == 0:
            raise PosprobeError(f"tensor '{key}' in '{entry.file}' has no rows", "the checkpoint is malformed")
        total = np.zeros(cols, dtype=np.float64)
        for start in range(0, rows, chunk_rows):
            total += _read_rows(entry, start, min(start + chunk_rows, rows)).sum(axis=0)
        return _finite(total / rows, key, entry.file)


def _read_rows(entry: _Entry, start: int, stop: int) -> np.ndarray:
    """Rows start..stop-1 of a tensor (its first axis) as float64."""
    if entry.dtype not in _DTYPES:
        raise PosprobeError(
            f"tensor in '{entry.file}' has dtype {entry.dtype}, which posprobe does not read",
            f"re-save the checkpoint in one of {', '.join(_DTYPES)}",
        )
    shape = entry.shape or (1,)
    row_items = math.prod(shape[1:])
    itemsize = np.dtype(_DTYPES[entry.dtype]).itemsize
    want = (stop - start) * row_items * itemsize
    try:
        with open(entry.file, "rb") as fh:
            fh.seek(entry.start + start * row_items * itemsize)
            data = fh.read(want)
    except OSError as err:
        raise PosprobeError(f"cannot read '{entry.file}': {err.strerror or err}", _CORRUPT_HINT) from err
    if len(data) != want:  # the file shrank after its header was checked
        raise PosprobeError(f"'{entry.file}' ended before the tensor data did", _CORRUPT_HINT)
    raw = np.frombuffer(data, dtype=_DTYPES[entry.dtype])
    if entry.dtype == "BF16":  # numpy has no bfloat16: widen the 16-bit words to float32 (exact)
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    try:
        out = raw.astype(np.float64).reshape((stop - start, *shape[1:]))
    except ValueError as err:  # e.g. a (0, 2**60) shape: valid in the format, beyond numpy's index range
        raise PosprobeError(
            f"a tensor in '{entry.file}' has shape {list(entry.shape)}, which numpy cannot hold", _CORRUPT_HINT
        ) from err
    return out if entry.shape else out.reshape(())


def _read_index(file: Path) -> dict[str, str]:
    """`weight_map` of a sharded-safetensors index: tensor name -> shard file name in the same folder."""
    try:
        weight_map = json.loads(file.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PosprobeError(f"'{file}' is not a valid safetensors index", _CORRUPT_HINT) from err
    if not isinstance(weight_map, dict) or not all(
        isinstance(v, str) and v and Path(v).name == v and v not in (".", "..") for v in weight_map.values()
    ):
        raise PosprobeError(f"'{file}' is not a valid safetensors index (bad weight_map)", _CORRUPT_HINT)
    return weight_map


def open_weights(source):
    """The lazy tensor reader of a resolved checkpoint (`ModelSource`): a `WeightReader` for safetensors and
    pickle weights, a `GGUFWeightReader` (same interface, transformers' names) for a GGUF file. Inside
    `shared.shared_loads()` (a report) each checkpoint's reader is opened once."""
    from posprobe.checkpoint.shared import shared_reader

    return shared_reader(source, _open_weights)


def _open_weights(source):
    """`open_weights`' reader, opened anew."""
    from posprobe.runtime.phases import phase

    if source.weight_format == "gguf":  # says its phase when a tensor is first asked for (its name map costs seconds)
        from posprobe.checkpoint.gguf_weights import GGUFWeightReader

        return GGUFWeightReader(source.path, source.config, name=source.name)
    phase(f"reading the weights of {source.name}")
    return WeightReader(source.path, source.weight_format)


def check_finite_weights(source) -> None:
    """Refuse a checkpoint (a resolved `ModelSource`) with a NaN or infinite value in any tensor, reading one
    tensor at a time (a GGUF tensor de-quantised): the check a run makes before it reads data or builds the model."""
    if source.weight_format not in ("safetensors", "pickle", "gguf"):
        return
    reader = open_weights(source)
    for key in reader.keys():
        reader.get(key)  # raises the one-line error at the first non-finite tensor


def unpickling_refused(where, err: Exception) -> PosprobeError:
    """The pickle holds something other than tensors; torch's weights-only unpickler refused it unrun."""
    found = re.search(r"GLOBAL ([\w.]+)", strip_ansi(str(err)))
    what = f"'{found.group(1)}'" if found else "objects other than tensors"
    return PosprobeError(
        f"refused to load the pickle weights of '{where}': they reference {what}, which could run code",
        "nothing from the file was run (torch's weights-only loader); use a safetensors checkpoint you trust",
    )


def _finite(array: np.ndarray, key: str, where) -> np.ndarray:
    if not np.all(np.isfinite(array)):
        raise PosprobeError(
            f"tensor '{key}' in '{where}' contains NaN or infinite values", "the checkpoint is broken; use another one"
        )
    return array


def _short(err: Exception) -> str:
    return first_line(err, 200)
