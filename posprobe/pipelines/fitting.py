"""TISA kernel fitting of a checkpoint: head profiles -> batched least-squares fit -> kernels file + figure.

Convention everywhere: k = j - i (query i, key j); a kernel with c > 0 scores later tokens.

The kernels file (``tisa_kernels_S{S}.safetensors``) holds tensors ``a``, ``b``, ``c`` of shape
(L, H, S) and ``offset`` (L, H), float32, with L = the fitted layers in order, plus one metadata key
``posprobe`` whose value is a JSON object (model, mode, n_kernels, window, convention, layers,
per-head r2, shared_layers, ...). The offset is the constant softmax ignores; it is *not* part of the
kernels. The format (save, load, validation) lives in `posprobe.kernels_file`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from posprobe.analysis.tisa_fit import TisaKernelFitter
from posprobe.errors import PosprobeError
from posprobe.kernels_file import (  # noqa: F401  (the kernels-file format lives there; re-exported for callers)
    CONVENTION,
    FUNCTION,
    KERNELS_FORMAT,
    KERNELS_VERSION,
    load_tisa_kernels,
    read_kernels_file,
    save_tisa_kernels,
)


@dataclass(frozen=True)
class ProfileSet:
    """The profile input of a fit: `profiles` (L_sel, H, K) over integer `offsets` (K,), k = j - i."""

    model: str
    model_type: str
    mode: str
    layers: list[int]
    offsets: np.ndarray
    profiles: np.ndarray
    n_layers: int
    n_heads: int
    shared_layers: bool


@dataclass(frozen=True)
class TisaFit:
    """The fit for one number of kernels S: `a`, `b`, `c` (L_sel, H, S); `offset`, `r2` (L_sel, H)."""

    n_kernels: int
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    offset: np.ndarray
    r2: np.ndarray
    flags: list[list[str]]
    seconds: float
    kernels_file: Path | None = None
    figure: Path | None = None

    @property
    def median_r2(self) -> float:
        return float(np.median(self.r2))

    def heads_json(self, layers: list[int]) -> list[dict]:
        return [
            {
                "layer": int(layer),
                "head": h,
                "r2": float(self.r2[li, h]),
                "a": self.a[li, h].tolist(),
                "b": self.b[li, h].tolist(),
                "c": self.c[li, h].tolist(),
                "offset": float(self.offset[li, h]),
                "flags": self.flags[li][h],
            }
            for li, layer in enumerate(layers)
            for h in range(self.a.shape[1])
        ]


@dataclass(frozen=True)
class TisaFitResult:
    """Fits of one model for every requested S (in request order), with the profiles they were fitted to."""

    model: str
    model_type: str
    mode: str
    layers: list[int]
    n_layers: int
    n_heads: int
    shared_layers: bool
    window: int
    seed: int
    offsets: np.ndarray
    profiles: np.ndarray
    fits: list[TisaFit] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """Fitting time only (all S), excluding profile computation and file writing."""
        return float(sum(f.seconds for f in self.fits))

    def fit(self, n_kernels: int) -> TisaFit:
        for f in self.fits:
            if f.n_kernels == n_kernels:
                return f
        raise KeyError(n_kernels)

    def to_json(self) -> dict:
        """Single S: `kernels` is an int and `heads` the per-head list. Sweep (several S): `kernels` is
        the list of S and `fits` holds one {kernels, seconds, median_r2, kernels_file, figure, heads}
        per S. Both: model, model_type, mode, window, seconds (fitting only), layers, shared_layers,
        convention, function."""
        common = {
            "model": self.model,
            "model_type": self.model_type,
            "mode": self.mode,
            "window": self.window,
            "seconds": round(self.seconds, 4),
            "layers": self.layers,
            "n_heads": self.n_heads,
            "shared_layers": self.shared_layers,
            "seed": self.seed,
            "convention": CONVENTION,
            "function": FUNCTION,
        }

        def one(f: TisaFit) -> dict:
            return {
                "kernels": f.n_kernels,
                "seconds": round(f.seconds, 4),
                "median_r2": f.median_r2,
                "kernels_file": None if f.kernels_file is None else str(f.kernels_file),
                "figure": None if f.figure is None else str(f.figure),
                "heads": f.heads_json(self.layers),
            }

        if len(self.fits) == 1:
            return {**common, **one(self.fits[0]), "seconds": round(self.seconds, 4)}
        return {**common, "kernels": [f.n_kernels for f in self.fits], "fits": [one(f) for f in self.fits]}


# ---------------------------------------------------------------------------------------------- API
def fit_tisa(
    model: str | None,
    kernels: int | Sequence[int] = (5,),
    window: int | None = None,
    layers: list[int] | None = None,
    mode: str = "paper",
    seed: int = 0,
    allow_pickle: bool = False,
    out_dir: str | Path | None = None,
    fmt: str = "png",
    exhaustive: bool = False,
    profiles: ProfileSet | None = None,
) -> TisaFitResult:
    """Fit TISA kernels to every head profile of `model` for each S in `kernels`.

    `model`: hub id, folder, None (packaged MiniLM) or a `.npz` written by `posprobe profiles`.
    `layers`: None = all. `window`: fit half-width W (None = default, clipped to the offsets).
    With `out_dir`, writes ``tisa_kernels_S{S}.safetensors`` and ``tisa_fit_S{S}.{fmt}`` per S.
    ALBERT (shared layers): the one shared layer is fitted once and replicated at every depth.
    """
    from posprobe.outputs import FIGURE_FORMATS, prepare_out_dir

    kernel_list = _check_kernels(kernels)
    if fmt not in FIGURE_FORMATS:
        raise PosprobeError(f"unknown figure format '{fmt}'", f"use one of: {', '.join(FIGURE_FORMATS)}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1):
        raise PosprobeError(
            f"the fit window must be a whole number >= 1, got {window!r}", "pass e.g. --window 16 (fits k = -16..16)"
        )
    out_path = prepare_out_dir(out_dir) if out_dir is not None else None
    data = profiles if profiles is not None else load_profiles(model, layers, mode, allow_pickle)

    fits: list[TisaFit] = []
    used_window = None
    for s in kernel_list:
        fit = _fit_one(data, s, window, seed, exhaustive)
        used_window = fit[1]
        fits.append(fit[0])
    result = TisaFitResult(
        data.model,
        data.model_type,
        data.mode,
        list(data.layers),
        data.n_layers,
        data.n_heads,
        data.shared_layers,
        int(used_window),
        seed,
        data.offsets,
        data.profiles,
        fits,
    )
    if out_path is not None:
        result = replace(result, fits=[write_fit(result, f, out_path, fmt) for f in fits])
    return result


def fit_kernels_file(model: str | None, kernels: int, out_dir: str | Path, allow_pickle: bool = False) -> Path:
    """Fit S = `kernels` kernels to every head of `model` (paper mode, default window; the TISA paper's
    initialisation) and return the kernels file written into `out_dir` — what `--init fit` uses."""
    result = fit_tisa(model, kernels=[kernels], allow_pickle=allow_pickle, out_dir=out_dir)
    return Path(result.fits[0].kernels_file)


def load_profiles(
    model: str | None,
    layers: list[int] | None = None,
    mode: str = "paper",
    allow_pickle: bool = False,
    profile: str | None = None,
) -> ProfileSet:
    """Profiles from a checkpoint (via the analysis pipeline) or from a .npz file of `posprobe profiles` or
    `posprobe attention` (`profile` 'score' or 'prob' picks which empirical profile; default score)."""
    if model is not None and str(model).endswith(".npz"):
        return _profiles_from_npz(Path(model), layers, profile)
    if profile is not None:
        raise PosprobeError("--profile applies to a .npz written by `posprobe attention`", "drop --profile")
    from posprobe.pipelines.analysis import compute_profiles

    res = compute_profiles(model, layers, mode, allow_pickle)
    return ProfileSet(
        res.model,
        res.model_type,
        res.mode,
        list(res.layers),
        np.asarray(res.offsets),
        np.asarray(res.profiles, dtype=np.float64),
        int(res.n_layers),
        int(res.n_heads),
        bool(res.shared_layers),
    )


def write_fit(result: TisaFitResult, fit: TisaFit, out_dir: Path, fmt: str = "png") -> TisaFit:
    """Write the kernels file and the figure of `fit` into `out_dir` (atomically); return it with paths."""
    from posprobe.outputs import save_figure
    from posprobe.plotting_fit import tisa_fit_grid

    kernels_file = save_tisa_kernels(
        Path(out_dir) / f"tisa_kernels_S{fit.n_kernels}.safetensors", fit, _metadata(result, fit)
    )
    title = f"TISA fit, S={fit.n_kernels} — {result.model} ({result.mode} mode, |k| ≤ {result.window})"
    figure = tisa_fit_grid(
        result.offsets,
        result.profiles,
        fit.a,
        fit.b,
        fit.c,
        fit.offset,
        fit.r2,
        result.layers,
        result.window,
        title,
        result.shared_layers,
    )
    path = save_figure(figure, Path(out_dir) / f"tisa_fit_S{fit.n_kernels}.{fmt}", dpi=110)
    return replace(fit, kernels_file=kernels_file, figure=path)


# -------------------------------------------------------------------------------------- internals
def _check_kernels(kernels: int | Sequence[int]) -> list[int]:
    values = [kernels] if isinstance(kernels, (int, np.integer)) and not isinstance(kernels, bool) else list(kernels)
    if not values:
        raise PosprobeError("no numbers of kernels given", "pass e.g. --kernels 5 or --kernels 1,3,5")
    out: list[int] = []
    for s in values:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
            raise PosprobeError(
                f"the number of TISA kernels must be a whole number >= 1, got {s!r}",
                "pass e.g. --kernels 5 or --kernels 1,3,5",
            )
        if int(s) not in out:
            out.append(int(s))
    return out


def _fit_one(data: ProfileSet, s: int, window: int | None, seed: int, exhaustive: bool) -> tuple[TisaFit, int]:
    n_sel, n_heads, _ = data.profiles.shape
    # ALBERT: one shared layer -> fit it once, replicate at every depth.
    fit_rows = data.profiles[:1] if data.shared_layers else data.profiles
    flat = fit_rows.reshape(-1, fit_rows.shape[-1])
    fitter = TisaKernelFitter(s, window=window, seed=seed, exhaustive=exhaustive)
    start = time.perf_counter()
    fitter.fit(flat, data.offsets)
    seconds = time.perf_counter() - start
    rows = fit_rows.shape[0]

    def shaped(x: np.ndarray) -> np.ndarray:
        x = x.reshape((rows, n_heads) + x.shape[1:])
        return np.repeat(x, n_sel, axis=0) if data.shared_layers else x

    flags = [list(fitter.flags_[r * n_heads : (r + 1) * n_heads]) for r in range(rows)]
    if data.shared_layers:
        flags = [list(flags[0]) for _ in range(n_sel)]
    fit = TisaFit(
        s,
        shaped(fitter.a_),
        shaped(fitter.b_),
        shaped(fitter.c_),
        shaped(fitter.offset_),
        shaped(fitter.r2_),
        flags,
        seconds,
    )
    return fit, fitter.window_


def _metadata(result: TisaFitResult, fit: TisaFit) -> dict:
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
        "flags": fit.flags,
        "shapes": {"a": "(L, H, S)", "b": "(L, H, S)", "c": "(L, H, S)", "offset": "(L, H)"},
        "offset_note": "constant per head that softmax ignores; not part of f(k)",
    }


def _profiles_from_npz(path: Path, layers: list[int] | None, profile: str | None = None) -> ProfileSet:
    from posprobe.outputs import load_npz

    if not path.is_file():
        raise PosprobeError(f"profile file '{path}' does not exist", "pass a .npz written by `posprobe profiles`")
    meta, arrays = load_npz(path)
    hint = "pass a .npz written by `posprobe profiles`"
    empirical = _empirical_profiles(path, arrays, profile)
    if empirical is not None:
        arrays, meta = empirical, meta | {"mode": f"empirical-{profile or 'score'}"}
    for name in ("profiles", "offsets"):
        if name not in arrays:
            raise PosprobeError(f"'{path}' has no '{name}' array", hint)
    profiles = np.asarray(arrays["profiles"], dtype=np.float64)
    offsets = np.asarray(arrays["offsets"])
    if profiles.ndim != 3 or profiles.shape[-1] != offsets.shape[0]:
        raise PosprobeError(
            f"'{path}' has profiles of shape {profiles.shape} and offsets {offsets.shape}; expected (L, H, K) and (K,)",
            hint,
        )
    stored = [int(x) for x in np.asarray(arrays.get("layers", np.arange(profiles.shape[0]))).tolist()]
    if len(stored) != profiles.shape[0]:
        raise PosprobeError(f"'{path}' lists {len(stored)} layers for {profiles.shape[0]} profile rows", hint)
    if layers is not None:
        missing = [layer for layer in layers if layer not in stored]
        if missing:
            raise PosprobeError(
                f"layer(s) {missing} are not in '{path}' (it holds layers {stored})",
                "choose --layers among those, or recompute the profiles",
            )
        idx = [stored.index(layer) for layer in layers]
        profiles, stored = profiles[idx], list(layers)
    return ProfileSet(
        str(meta.get("model", path.stem)),
        str(meta.get("model_type", "unknown")),
        str(meta.get("mode", "unknown")),
        stored,
        offsets,
        profiles,
        int(meta.get("n_layers", len(stored))),
        int(profiles.shape[1]),
        bool(meta.get("shared_layers", False)),
    )


def _empirical_profiles(path: Path, arrays: dict, profile: str | None) -> dict | None:
    """For a `posprobe attention` file: its score (default) or probability profiles as `profiles`, cut to the
    widest window -K..K in which every head has data (offsets no text reached are NaN). None for other files."""
    if "score_profiles" not in arrays:
        if profile is not None:
            raise PosprobeError(f"'{path}' has no empirical profiles", "--profile needs a `posprobe attention` .npz")
        return None
    if profile not in (None, "score", "prob"):
        raise PosprobeError(f"unknown --profile '{profile}'", "use score or prob")
    values = np.asarray(arrays[f"{profile or 'score'}_profiles"], dtype=np.float64)
    offsets = np.asarray(arrays["offsets"])
    centre = int(np.flatnonzero(offsets == 0)[0])
    finite = np.isfinite(values).all(axis=(0, 1))
    reach = 0
    while (
        centre - reach - 1 >= 0
        and centre + reach + 1 < len(offsets)
        and finite[[centre - reach - 1, centre + reach + 1]].all()
    ):
        reach += 1
    if reach < 1 or not finite[centre]:
        raise PosprobeError(
            f"'{path}' has no data at k = ±1 (a causal model's profiles stop at k = 0)",
            "fit-tisa fits symmetric windows: use an encoder's profiles",
        )
    window = slice(centre - reach, centre + reach + 1)
    return {**arrays, "profiles": values[..., window], "offsets": offsets[window]}
