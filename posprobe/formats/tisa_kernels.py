"""The TISA kernels file (``tisa_kernels_S{S}.safetensors``) and the `--init` setting that names one.

One module for both: the only one that writes (`save_tisa_kernels`, `save_official_kernels`, with
`kernels_metadata` and `kernels_file_name`) and reads (`read_kernels_file`) the file. `fit-tisa` writes it,
`retrofit` and `finetune` read it.

File format: tensors ``a``, ``b``, ``c`` of shape ``(L, H, S)`` and ``offset`` ``(L, H)``, float32, with
``L`` the fitted layers in order, plus one metadata key ``posprobe`` whose value is a JSON object (model,
mode, n_kernels, window, convention ``k = j - i``, layers, per-head r2, shared_layers, causal, fitted_offsets,
points, parameters, few_points, holdout_offsets, per-head holdout_r2, ...). The kernels
define ``f(k) = sum_s a_s exp(-|b_s| (k - c_s)^2)``; the offset is the per-head constant softmax ignores,
*not* part of the kernels. `read_kernels_file` is the one validation of a file (shapes, ``L, H, S >= 1``,
finite numbers, metadata consistent with the tensors) that every reader goes through.

`--init`: ``zero`` (no change), ``random``, ``fit`` (kernels fitted to the model's own head profiles, by
the caller) or ``fit:FILE`` (a kernels file); `parse_init` turns the text into an `InitSpec`.

Imports numpy and safetensors only (no torch).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from posprobe.errors import ArgumentTypeError, ArgumentValueError, PosprobeError

KERNELS_FORMAT = "posprobe-tisa-kernels"
KERNELS_VERSION = 1
CONVENTION = "k = j - i"
FUNCTION = "f(k) = sum_s a_s * exp(-|b_s| * (k - c_s)^2)"
INIT_KINDS = ("zero", "random", "fit")
_HINT = "pass a file written by `posprobe fit-tisa` (tisa_kernels_S*.safetensors)"


# ---------------------------------------------------------------------------------------------- --init
@dataclass(frozen=True)
class InitSpec:
    """A parsed `--init`: `kind` in zero | random | fit; `path` is the kernels file of ``fit:FILE``
    (None for a bare ``fit``, which fits kernels to the model's own profiles)."""

    kind: str
    path: Path | None = None

    def __str__(self) -> str:
        return f"fit:{self.path}" if self.path is not None else self.kind


def parse_init(init) -> InitSpec:
    """``'zero'`` | ``'random'`` | ``'fit'`` | ``'fit:FILE'`` -> `InitSpec` (an `InitSpec` passes through)."""
    if isinstance(init, InitSpec):
        return init
    if not isinstance(init, str):
        raise ArgumentTypeError("init", f"{{arg}} must be a string (zero, random, fit or fit:FILE), got {init!r}")
    if init in INIT_KINDS:
        return InitSpec(init)
    if init.startswith("fit:") and len(init) > 4:
        return InitSpec("fit", Path(init[4:]).expanduser())
    raise ArgumentValueError(
        "init",
        f"unknown {{arg}} '{init}'",
        "use zero, random, fit (kernels fitted to this model) or fit:FILE (a file written by `posprobe fit-tisa`)",
    )


# ------------------------------------------------------------------------------------------- the file
@dataclass(frozen=True)
class KernelsFile:
    """A validated kernels file: `a`, `b`, `c` `(L, H, S)` float64, `offset` `(L, H)` or None, `layers`
    (the model layer of each of the L rows), and the metadata dict."""

    path: Path
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    offset: np.ndarray | None
    layers: list[int]
    shared_layers: bool
    metadata: dict = field(repr=False)

    @property
    def n_kernels(self) -> int:
        """S, kernels per head."""
        return int(self.a.shape[2])

    @property
    def n_heads(self) -> int:
        return int(self.a.shape[1])

    def __repr__(self) -> str:
        L, H, S = self.a.shape
        return f"KernelsFile('{self.path}', layers={self.layers}, heads={H}, S={S})"


def save_tisa_kernels(path: str | Path, fit, metadata: dict) -> Path:
    """Write `fit.a`, `fit.b`, `fit.c` `(L, H, S)` and `fit.offset` `(L, H)` as float32 safetensors, with
    `metadata` as JSON under 'posprobe' (atomically). The arrays are validated as a reader would."""
    from posprobe.formats.writing import atomic_write

    return atomic_write(Path(path), tisa_kernels_writer(path, fit, metadata))


def tisa_kernels_writer(path: str | Path, fit, metadata: dict):
    """`save_tisa_kernels` as a `write_files` writer (`write(tmp_path)`), its arrays validated now (`path` names
    the file in the messages)."""
    from safetensors.numpy import save_file

    from posprobe.formats.writing import _json_default

    tensors = {name: np.ascontiguousarray(getattr(fit, name), dtype=np.float32) for name in ("a", "b", "c", "offset")}
    _check_arrays(Path(path), tensors, metadata)
    meta = {"posprobe": json.dumps(metadata, default=_json_default)}
    return lambda p: save_file(tensors, str(p), metadata=meta)


def read_kernels_file(path) -> KernelsFile:
    """Read and validate a kernels file; every problem is one `PosprobeError` naming the file."""
    from safetensors import safe_open

    if not isinstance(path, (str, os.PathLike)) or str(path) == "":
        raise ArgumentTypeError("path", f"the kernels file must be a path, got {path!r}")
    path = Path(path).expanduser()
    if not path.is_file():
        raise PosprobeError(f"TISA kernels file '{path}' does not exist", _HINT)
    try:
        with safe_open(str(path), framework="numpy") as fh:
            raw_meta = fh.metadata() or {}
            arrays = {name: fh.get_tensor(name) for name in fh.keys()}
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise PosprobeError(f"cannot read '{path}' as a safetensors file ({type(err).__name__}: {err})", _HINT) from err
    if "posprobe" not in raw_meta:
        raise PosprobeError(f"'{path}' has no posprobe metadata (not a TISA kernels file)", _HINT)
    try:
        metadata = json.loads(raw_meta["posprobe"])
    except ValueError as err:
        raise PosprobeError(f"the posprobe metadata in '{path}' is not valid JSON ({err})", _HINT) from err
    if not isinstance(metadata, dict):
        raise PosprobeError(f"the posprobe metadata in '{path}' is not a JSON object", _HINT)
    layers, shared = _check_arrays(path, arrays, metadata)
    a, b, c = (np.asarray(arrays[n], dtype=np.float64) for n in "abc")
    offset = np.asarray(arrays["offset"], dtype=np.float64) if "offset" in arrays else None
    return KernelsFile(path, a, b, c, offset, layers, shared, metadata)


def load_tisa_kernels(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Read a kernels file: (a, b, c) each (L, H, S) and the metadata dict (which also carries ``offset``
    (L, H) as an array when the file has it). Validated by `read_kernels_file`."""
    kf = read_kernels_file(path)
    metadata = dict(kf.metadata)
    if kf.offset is not None:
        metadata["offset"] = kf.offset
    return kf.a, kf.b, kf.c, metadata


def absent_heads(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(L, H) bool: the heads whose kernels (a, b, c, each (L, H, S)) are NaN throughout, heads their layer does
    not have (SPEC §9: a model with a query-head count per layer, Laguna); fit-tisa writes them so."""
    return np.isnan(a).all(-1) & np.isnan(b).all(-1) & np.isnan(c).all(-1)


def _check_arrays(path: Path, arrays: dict, metadata: dict) -> tuple[list[int], bool]:
    """The one validation of a kernels file's content; returns (layers, shared_layers)."""

    def bad(what: str, hint: str = _HINT):
        raise PosprobeError(f"'{path}' {what}", hint)

    missing = [n for n in ("a", "b", "c") if n not in arrays]
    if missing:
        bad(f"lacks the tensor(s) {', '.join(missing)}")
    a, b, c = arrays["a"], arrays["b"], arrays["c"]
    if any(not np.issubdtype(np.asarray(t).dtype, np.floating) for t in (a, b, c)):
        bad("holds kernel tensors that are not floating point")
    if a.ndim != 3 or a.shape != b.shape or a.shape != c.shape:
        bad(f"has kernel tensors of shapes {a.shape}, {b.shape}, {c.shape}; expected three equal (L, H, S) shapes")
    L, H, S = a.shape
    if min(L, H, S) < 1:
        bad(f"has kernel tensors of shape (L, H, S) = {a.shape}: every size must be at least 1 (S = 0 is no kernel)")
    absent = absent_heads(a, b, c)  # heads a layer does not have (SPEC §9, Laguna): NaN throughout
    if not all(np.all(np.isfinite(x[~absent])) for x in (a, b, c)):
        bad("holds NaN/inf kernel parameters", "refit with `posprobe fit-tisa`")
    if "offset" in arrays:
        offset = arrays["offset"]
        if offset.shape != (L, H):
            bad(f"has an offset of shape {offset.shape}, expected {(L, H)}")
        if not np.all(np.isfinite(offset[~absent])) or not np.isnan(offset[absent]).all():
            bad("holds NaN/inf offsets", "refit with `posprobe fit-tisa`")
    fmt = metadata.get("format", KERNELS_FORMAT)
    if fmt != KERNELS_FORMAT:
        bad(f"has format {fmt!r}, not {KERNELS_FORMAT!r}")
    version = metadata.get("version", KERNELS_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version > KERNELS_VERSION:
        bad(f"has format version {version!r}; this posprobe reads version {KERNELS_VERSION}", "upgrade posprobe")
    convention = metadata.get("convention", CONVENTION)
    if convention != CONVENTION:
        bad(f"uses the offset convention {convention!r}, posprobe uses {CONVENTION!r}")
    for key, size in (("n_kernels", S), ("n_heads", H)):
        value = metadata.get(key, size)
        if isinstance(value, bool) or not isinstance(value, int) or value != size:
            bad(f"says {key} = {value!r} but its tensors have {size}")
    layers = metadata.get("layers")
    if layers is None:
        layers = list(range(L))
    if (
        not isinstance(layers, list)
        or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in layers)
        or len(set(layers)) != len(layers)
    ):
        bad(f"has metadata layers {layers!r}; expected distinct layer numbers >= 0")
    if len(layers) != L:
        bad(f"lists {len(layers)} layers but holds {L}", "re-run `posprobe fit-tisa`")
    shared = metadata.get("shared_layers", False)
    if not isinstance(shared, bool):
        bad(f"has shared_layers = {shared!r}; expected true or false")
    return [int(x) for x in layers], shared


# ------------------------------------------------------------------------------ writing (fit-tisa)
def kernels_file_name(result, fit) -> str:
    """`tisa_kernels_S{S}.safetensors` for a fit of every layer; `..._layers0,2.safetensors` (the fitted
    layers in the name) when only some were fitted, so a partial fit never replaces a full one."""
    official = "_official" if result.orientation == "official" else ""
    return f"tisa_kernels_S{fit.n_kernels}{layers_suffix(result)}{official}.safetensors"


ORIENTATIONS = ("posprobe", "official")
OFFICIAL_CONVENTION = "official TISA: F[i, j] = f(i - j - 1)"


def official_orientation(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Kernels `(L, H, S)` for posprobe's `F[i, j] = f(j - i)` -> `(L, S, H)` for the official TISA code's
    `F[i, j] = f'(i - j - 1)`: with m = i - j - 1, j - i = -m - 1, so `(k - c)^2 = (m - (-c - 1))^2` and
    `c' = -c - 1` (a and b unchanged); per layer the arrays are transposed to (S, H)."""
    return tuple(np.swapaxes(np.asarray(x, dtype=np.float64), -1, -2) for x in (a, b, -np.asarray(c) - 1.0))


def save_official_kernels(path: Path, fit, metadata: dict) -> Path:
    """The official-orientation kernels file: ``a``, ``b``, ``c`` `(L, S, H)` float32 (no offset), its metadata
    naming that convention (so posprobe's own reader refuses it)."""
    from posprobe.formats.writing import atomic_write

    return atomic_write(path, official_kernels_writer(fit, metadata))


def official_kernels_writer(fit, metadata: dict):
    """`save_official_kernels` as a `write_files` writer (`write(tmp_path)`)."""
    from safetensors.numpy import save_file

    from posprobe.formats.writing import _json_default

    a, b, c = official_orientation(fit.a, fit.b, fit.c)
    tensors = {n: np.ascontiguousarray(x, dtype=np.float32) for n, x in zip("abc", (a, b, c))}
    meta = dict(metadata, convention=OFFICIAL_CONVENTION, orientation="official")
    meta["function"] = "f(m) = sum_s a_s * exp(-|b_s| * (m - c_s)^2), m = i - j - 1"
    meta["shapes"] = {"a": "(L, S, H)", "b": "(L, S, H)", "c": "(L, S, H)"}
    meta.pop("offset_note", None)
    text = {"posprobe": json.dumps(meta, default=_json_default)}
    return lambda p: save_file(tensors, str(p), metadata=text)


def kernels_metadata(result, fit) -> dict:
    """The JSON metadata stored under 'posprobe' in a kernels file of `fit` (a `TisaFit` of `result`)."""
    return {
        "format": KERNELS_FORMAT,
        "version": KERNELS_VERSION,
        "model": result.model,
        "model_type": result.model_type,
        "mode": result.mode,
        "n_kernels": fit.n_kernels,
        "window": result.window,
        "convention": CONVENTION,
        "function": FUNCTION,
        "layers": result.layers,
        "n_layers": result.n_layers,
        "n_heads": result.n_heads,
        "shared_layers": result.shared_layers,
        "seed": result.seed,
        "r2": np.round(fit.r2, 6).tolist(),
        "causal": bool(getattr(result, "causal", False)),
        "quantization": getattr(result, "quantization", None),
        "fitted_offsets": [-result.window, 0 if getattr(result, "causal", False) else result.window],
        "points": int(getattr(fit, "n_points", 0)),
        "parameters": 3 * fit.n_kernels + 1,
        "few_points": bool(getattr(fit, "few_points", False)),
        "holdout_offsets": [int(k) for k in getattr(result, "holdout_offsets", ())],
        "holdout_r2": _rounded_or_null(getattr(fit, "holdout_r2", None)),
        "flags": fit.flags,
        "shapes": {"a": "(L, H, S)", "b": "(L, H, S)", "c": "(L, H, S)", "offset": "(L, H)"},
        "offset_note": "constant per head that softmax ignores; not part of f(k)",
    }


def _rounded_or_null(values) -> list | None:
    """(L, H) numbers as nested lists rounded to 6 digits, NaN as None (JSON null); None stays None."""
    if values is None:
        return None
    values = np.asarray(values, dtype=np.float64)
    return [[round(float(v), 6) if np.isfinite(v) else None for v in row] for row in values]


def layers_suffix(result) -> str:
    """'' for every layer of the encoder (or only) stack; `_decoder` and `_layers0,2` say otherwise."""
    stack = "_decoder" if result.stack == "decoder" else ""
    if list(result.layers) == list(range(result.n_layers)):
        return stack
    return stack + "_layers" + ",".join(str(layer) for layer in result.layers)
