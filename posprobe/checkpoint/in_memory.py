"""Models already in memory: read a loaded transformers model's tensors through the `WeightReader` interface.

`StateDictReader` offers what the lazy file reader offers (`keys`, `find_suffix`, `get`, `row_mean`, all
float64 numpy), over the model's `state_dict()`, so the analysis code is the same for a folder and an object.
`source_from_model` describes the object as a `ModelSource` (its config as a dict; no folder). torch is not
imported here: the tensors come from the caller's model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from posprobe.checkpoint.resolve import ModelSource, shortest_suffix
from posprobe.errors import PosprobeError

IN_MEMORY = "in-memory"  # ModelSource.weight_format of a model object


def is_model_object(model) -> bool:
    """True for a loaded transformers model (anything with `state_dict()` and a `config` with `to_dict()`)."""
    return callable(getattr(model, "state_dict", None)) and callable(
        getattr(getattr(model, "config", None), "to_dict", None)
    )


def source_from_model(model) -> ModelSource:
    """A `ModelSource` for a loaded model: its `config.to_dict()`, named by the checkpoint it came from."""
    config = model.config.to_dict()
    name = str(config.get("_name_or_path") or type(model).__name__)
    return ModelSource(name, Path(name), config, IN_MEMORY)


class StateDictReader:
    """The `WeightReader` interface over `model.state_dict()`: tensors converted to float64 on request.

    Names are the state_dict's (a task-head model's carry its prefix, e.g. 'bert.'); `find_suffix` finds
    the shortest name ending in a suffix, exactly as for files.
    """

    def __init__(self, model):
        self.name = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
        self._state = model.state_dict()
        self._names = list(self._state)

    def keys(self) -> list[str]:
        return list(self._names)

    def __contains__(self, key: str) -> bool:
        return key in self._state

    def find_suffix(self, suffix: str) -> str | None:
        return shortest_suffix(self._names, suffix)

    def stored_dtype(self, key: str) -> str | None:
        """The dtype of tensor `key` in safetensors' words ('F32', 'F16', 'BF16'; 'F64' otherwise), as the saved
        checkpoint would store it; None for an unknown key."""
        if key not in self._state:
            return None
        names = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16"}
        return names.get(str(self._state[key].dtype), "F64")

    def shape(self, key: str) -> tuple[int, ...] | None:
        """The shape of tensor `key`; None for an unknown key."""
        return tuple(self._state[key].shape) if key in self._state else None

    def get(self, key: str) -> np.ndarray:
        """Tensor `key` as a float64 array (a copy; the model is not touched)."""
        if key not in self._state:
            raise PosprobeError(f"model '{self.name}' has no tensor '{key}'", "pass a model of a supported family")
        tensor = self._state[key].detach().cpu()
        return _finite(tensor.double().numpy().copy(), key, self.name)

    def row_mean(self, key: str, chunk_rows: int = 1024) -> np.ndarray:
        """Mean over the rows of 2-D tensor `key` (float64), summed in the same chunks as the file reader, so
        that the result is bit-for-bit the same as for the saved checkpoint."""
        array = self.get(key)
        if array.ndim != 2:
            return array.mean(axis=0)
        rows, cols = array.shape
        if rows == 0:
            raise PosprobeError(f"tensor '{key}' of model '{self.name}' has no rows", "the model is malformed")
        total = np.zeros(cols, dtype=np.float64)
        for start in range(0, rows, chunk_rows):
            total += array[start : min(start + chunk_rows, rows)].sum(axis=0)
        return total / rows


def _finite(array: np.ndarray, key: str, name: str) -> np.ndarray:
    if not np.all(np.isfinite(array)):
        raise PosprobeError(
            f"tensor '{key}' of model '{name}' contains NaN or infinite values", "the model is broken; use another one"
        )
    return array
