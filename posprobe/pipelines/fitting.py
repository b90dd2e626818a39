"""TISA kernel fitting of a checkpoint: head profiles -> batched least-squares fit -> kernels file + figure.

Convention everywhere: k = j - i (query i, key j); a kernel with c > 0 scores later tokens.

Fitting returns a `TisaFitResult` and writes nothing; its `save()` writes the kernels files (format:
`posprobe.kernels_file`) and figures.
The kernels file (``tisa_kernels_S{S}.safetensors``; ``..._layers0,2`` when only some layers were
fitted) holds tensors ``a``, ``b``, ``c`` of shape
(L, H, S) and ``offset`` (L, H), float32, with L = the fitted layers in order, plus one metadata key
``posprobe`` whose value is a JSON object (model, mode, n_kernels, window, convention, layers,
per-head r2, shared_layers, ...). The offset is the constant softmax ignores; it is *not* part of the
kernels. The format (save, load, validation) lives in `posprobe.kernels_file`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from posprobe.analysis.tisa_fit import TisaKernelFitter
from posprobe.analysis.tisa_window import (
    POINTS_PER_PARAMETER,
    check_points,
    default_window,
    holdout_offsets,
    parameters,
    span,
    window_for,
)
from posprobe.errors import ArgumentError, ArgumentValueError, PosprobeError
from posprobe.kernels_file import (
    CONVENTION,
    FUNCTION,
    ORIENTATIONS,
    kernels_file_name,
    kernels_metadata,
    layers_suffix,
    save_official_kernels,
    save_tisa_kernels,
)
from posprobe.profile_files import ProfileSet, read_profile_file
from posprobe.results import ResultMixin
from posprobe.validation import as_bool, as_int, as_int_list

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class _NotFitted(ArgumentValueError, KeyError):
    """`TisaFitResult.fit(S)` for an S that was not fitted."""

    __str__ = ArgumentValueError.__str__


@dataclass(frozen=True, repr=False)
class TisaFit(ResultMixin):
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
    holdout_r2: np.ndarray | None = None  # (L_sel, H) R² on the held-out offsets; NaN where undefined
    n_points: int = 0  # profile points in the fit window
    few_points: bool = False  # fewer than twice as many points as parameters: a good R² means little

    _repr_fields = ("n_kernels", "median_r2", "median_holdout_r2", "few_points", "a", "b", "c", "r2", "kernels_file")

    @property
    def median_r2(self) -> float:
        return float(np.median(self.r2))

    @property
    def n_parameters(self) -> int:
        """Free numbers of each head's fit: a, b, c per kernel and the offset."""
        return parameters(self.n_kernels)

    @property
    def median_holdout_r2(self) -> float | None:
        """Median over heads of the held-out R² (None where it is undefined for every head)."""
        values = np.asarray(self.holdout_r2, dtype=np.float64) if self.holdout_r2 is not None else np.empty(0)
        values = values[np.isfinite(values)]
        return float(np.median(values)) if values.size else None

    def warning(self, window: int, causal: bool) -> str | None:
        """A line for fits with fewer than twice as many points as parameters, else None."""
        if not self.few_points:
            return None
        better = window_for(POINTS_PER_PARAMETER * self.n_parameters, causal)
        points = f"{self.n_points} points ({span(window, causal)})"
        return (
            f"S = {self.n_kernels} fits {self.n_parameters} parameters to {points}, fewer than twice as many: so "
            f"close to interpolating, a high R² says little; judge the fit by its held-out R², or use a window of "
            f"{better} or more (or fewer kernels)"
        )

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
                "holdout_r2": _finite_or_none(self.holdout_r2[li, h]) if self.holdout_r2 is not None else None,
                "flags": self.flags[li][h],
            }
            for li, layer in enumerate(layers)
            for h in range(self.a.shape[1])
        ]


@dataclass(frozen=True, repr=False)
class TisaFitResult(ResultMixin):
    """Fits of one model for every requested S (in request order), with the profiles they were fitted to.

    `profiles` (L_sel, H, K) over `offsets` (K,), k = j - i, for model layers `layers`; `fits` one `TisaFit`
    per S (`fit(S)` picks one). `plot(S)` draws each head's profile against its fitted function. The fits use
    k = -window..window, or k = -window..0 for a causal model; `holdout_offsets` are the next offsets beyond (as
    far as the profiles reach), on which each head's `holdout_r2` is measured.
    """

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
    orientation: str = "posprobe"  # of the kernels files to write: posprobe (k = j - i) or official (i - j - 1)
    causal: bool = False  # profiles of a causal model: only k <= 0 is used by it, and only k <= 0 is fitted
    stack: str | None = None  # which stack of an encoder-decoder model (T5-style) the profiles came from
    holdout_offsets: tuple[int, ...] = ()  # the offsets beyond the window each fit is scored on (held out)

    _repr_fields = ("model", "mode", "layers", "n_heads", "window", "kernels", "median_r2", "profiles")

    @property
    def kernels(self) -> list[int]:
        return [f.n_kernels for f in self.fits]

    @property
    def median_r2(self) -> dict[int, float]:
        """{S: median R^2 over heads}."""
        return {f.n_kernels: f.median_r2 for f in self.fits}

    def plot(self, n_kernels: int | None = None):
        """Profiles (dots) against the fitted functions at integer k, one panel per head, for S = `n_kernels`
        (default: the first fitted S); a matplotlib Figure."""
        from posprobe.plotting_fit import fit_figure

        return fit_figure(self, self.fits[0] if n_kernels is None else self.fit(n_kernels))

    def save(self, out_dir: str | Path, fmt: str = "png") -> TisaFitResult:
        """Write each fit's kernels file and figure into `out_dir` (as `posprobe fit-tisa` does); returns the
        result with `kernels_file` and `figure` set on every fit. File names carry S, and the fitted layers when
        not all were fitted (`kernels_file.kernels_file_name`)."""
        from dataclasses import replace

        from posprobe.outputs import FIGURE_FORMATS, prepare_out_dir, save_figure
        from posprobe.plotting_fit import fit_figure

        if fmt not in FIGURE_FORMATS:
            raise PosprobeError(f"unknown figure format '{fmt}'", f"use one of: {', '.join(FIGURE_FORMATS)}")
        out = prepare_out_dir(out_dir)
        fits = []
        for fit in self.fits:
            save = save_official_kernels if self.orientation == "official" else save_tisa_kernels
            kernels = save(out / kernels_file_name(self, fit), fit, kernels_metadata(self, fit))
            figure = save_figure(fit_figure(self, fit), out / figure_file_name(self, fit, fmt))
            fits.append(replace(fit, kernels_file=kernels, figure=figure))
        return replace(self, fits=fits)

    @property
    def seconds(self) -> float:
        """Fitting time only (all S), excluding profile computation and file writing."""
        return float(sum(f.seconds for f in self.fits))

    def fit(self, n_kernels: int) -> TisaFit:
        """The fit with S = `n_kernels` (a KeyError, also an ArgumentValueError, if it was not fitted)."""
        for f in self.fits:
            if f.n_kernels == n_kernels:
                return f
        raise _NotFitted("n_kernels", f"S = {n_kernels} was not fitted (fitted: {self.kernels})")

    def to_dict(self) -> dict:
        """Single S: `kernels` is an int and `heads` the per-head list. Sweep (several S): `kernels` is
        the list of S and `fits` holds one {kernels, seconds, median_r2, median_holdout_r2, points, parameters,
        few_points, warnings, kernels_file, figure, heads} per S. Both: model, model_type, mode, window,
        fitted_offsets [lo, hi], holdout_offsets, seconds (fitting only), layers, shared_layers, convention,
        function, causal, stack."""
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
            "orientation": self.orientation,
            "causal": self.causal,
            "stack": self.stack,
            "fitted_offsets": [-self.window, 0 if self.causal else self.window],
            "holdout_offsets": list(self.holdout_offsets),
        }

        def one(f: TisaFit) -> dict:
            warning = f.warning(self.window, self.causal)
            return {
                "kernels": f.n_kernels,
                "seconds": round(f.seconds, 4),
                "median_r2": f.median_r2,
                "median_holdout_r2": f.median_holdout_r2,
                "points": f.n_points,
                "parameters": f.n_parameters,
                "few_points": f.few_points,
                "warnings": [warning] if warning else [],
                "kernels_file": None if f.kernels_file is None else str(f.kernels_file),
                "figure": None if f.figure is None else str(f.figure),
                "heads": f.heads_json(self.layers),
            }

        if len(self.fits) == 1:
            return {**common, **one(self.fits[0]), "seconds": round(self.seconds, 4)}
        return {**common, "kernels": [f.n_kernels for f in self.fits], "fits": [one(f) for f in self.fits]}


# ---------------------------------------------------------------------------------------------- API
#: progress(stage, done, total): called as a fit advances (the CLI draws a progress bar from it).
Progress = Callable[[str, int, int], None]


def fit_tisa(
    model: str | PathLike | PreTrainedModel | None = None,
    kernels: int | Sequence[int] = (5,),
    window: int | None = None,
    layers: list[int] | None = None,
    mode: str = "paper",
    seed: int = 0,
    allow_pickle: bool = False,
    exhaustive: bool = False,
    profiles: ProfileSet | None = None,
    progress: Progress | None = None,
    orientation: str = "posprobe",
    positions: int | None = None,
    stack: str = "encoder",
) -> TisaFitResult:
    """Fit TISA kernels to every head profile of `model` for each S in `kernels`; writes nothing.

    `model`: hub id, folder, None (packaged MiniLM), a loaded transformers model, or a `.npz` written by
    `posprobe profiles`. `kernels`: S, one number or a list (a sweep). `layers`: None = all (-1 = last).
    `window`: fit half-width W: k = -W..W, or k = -W..0 for a causal model (which never uses k > 0); None = the
    default of `posprobe.analysis.tisa_window.default_window` (16; for a causal model at least twice as many points
    as the largest S has parameters, 31 for S = 5), clipped to the offsets. An S whose 3·S + 1 parameters exceed
    the window's points is refused before any profile is computed (the model's causality and positions are read
    from its config first), with advice that is accepted when followed; fits with fewer than twice as many points
    as parameters are flagged (`few_points`). Each head is also scored on the next offsets beyond the window
    (`holdout_r2`).
    ALBERT (shared layers): the one shared layer is fitted once and replicated at every depth.
    Save the result with `result.save(out_dir)` (kernels file and figure per S).
    `orientation`: of the kernels file `save()` writes: "posprobe" (what `retrofit` reads) or
    "official" (the official TISA code's indexing, ``..._official.safetensors``; see `official_orientation`).
    `positions`, `stack`: as for `profiles` (n analysed; 'decoder' for the decoder stack of T5-style models).
    """
    from posprobe.validation import as_choice

    orientation = as_choice(orientation, "orientation", ORIENTATIONS)
    kernel_list = _check_kernels(kernels)
    if window is not None:
        window = as_int(window, "window", minimum=1, hint="pass e.g. {arg} 16 (fits k = -16..16)")
    seed = as_int(seed, "seed", minimum=0)
    exhaustive = as_bool(exhaustive, "exhaustive")
    planned = profiles if profiles is not None else plan_profiles(model, layers, mode, allow_pickle, positions, stack)
    causal, available = planned.causal, _available(planned.offsets, planned.causal)
    used_window = _resolve_window(window, kernel_list, causal, available)
    check_points(kernel_list, used_window, causal, available, asked=window is not None)
    data = planned.load() if isinstance(planned, PlannedProfiles) else planned

    fits = [_fit_one(data, s, used_window, seed, exhaustive, progress) for s in kernel_list]
    return TisaFitResult(
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
        orientation,
        data.causal,
        data.stack,
        tuple(int(k) for k in holdout_offsets(_fitted_side(data.offsets, causal), used_window, causal)),
    )


def fit_kernels_file(model: str | None, kernels: int, out_dir: str | Path, allow_pickle: bool = False) -> Path:
    """Fit S = `kernels` kernels to every head of `model` (paper mode, default window; the TISA paper's
    initialisation) and return the kernels file written into `out_dir` — what `--init fit` uses."""
    result = fit_tisa(model, kernels=[kernels], allow_pickle=allow_pickle).save(out_dir)
    return Path(result.fits[0].kernels_file)


def figure_file_name(result: TisaFitResult, fit: TisaFit, fmt: str = "png") -> str:
    """`tisa_fit_S{S}.{fmt}`, with the fitted layers in the name as for `kernels_file_name`."""
    return f"tisa_fit_S{fit.n_kernels}{layers_suffix(result)}.{fmt}"


@dataclass(frozen=True)
class PlannedProfiles:
    """Profiles of a model not computed yet, with what the fit needs to know first: `causal` and `offsets` (the
    k = j - i the profiles will cover). `load()` computes them (a `ProfileSet`)."""

    causal: bool
    offsets: np.ndarray
    load: Callable[[], ProfileSet]


def plan_profiles(
    model,
    layers: list[int] | None = None,
    mode: str = "paper",
    allow_pickle: bool = False,
    positions: int | None = None,
    stack: str = "encoder",
) -> ProfileSet | PlannedProfiles:
    """The profiles `fit_tisa` will fit: a `.npz` is read at once (a `ProfileSet`); for a model, only its config
    is read now (causality, positions: what the window check needs), the profiles when `load()` is called."""
    if isinstance(model, (str, PathLike)) and str(model).endswith(".npz"):
        return load_profiles(model, layers, mode, allow_pickle, positions=positions, stack=stack)
    from posprobe.analysis.fhat import MODES
    from posprobe.analysis.toeplitz import offsets as offsets_of
    from posprobe.pipelines.analysis import ScoreReader, open_model, profiles_from
    from posprobe.validation import as_choice

    mode = as_choice(mode, "mode", MODES)
    layers = as_int_list(layers, "layers")
    reader = ScoreReader(open_model(model, allow_pickle, mode=mode), positions, stack)
    return PlannedProfiles(reader.causal, offsets_of(reader.n), lambda: _profile_set(profiles_from(reader, layers)))


def load_profiles(
    model: str | None,
    layers: list[int] | None = None,
    mode: str = "paper",
    allow_pickle: bool = False,
    profile: str | None = None,
    positions: int | None = None,
    stack: str = "encoder",
) -> ProfileSet:
    """Profiles from a checkpoint (via the analysis pipeline) or from a .npz file of `posprobe profiles` or
    `posprobe attention` (`profile` 'score' or 'prob' picks which empirical profile; default score)."""
    if isinstance(model, (str, PathLike)) and str(model).endswith(".npz"):
        if positions is not None or stack != "encoder":
            raise PosprobeError(
                "positions and stack choose what is computed from a model; a .npz holds profiles already computed",
                "drop them, or pass the model itself",
            )
        return read_profile_file(Path(model), layers, profile)
    if profile is not None:
        raise PosprobeError("--profile applies to a .npz written by `posprobe attention`", "drop --profile")
    from posprobe.pipelines.analysis import profiles as compute_profiles

    return _profile_set(compute_profiles(model, layers, mode, allow_pickle, positions=positions, stack=stack))


def _profile_set(res) -> ProfileSet:
    """The `ProfileSet` of a `ProfileResult`."""
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
        bool(res.causal),
        res.stack,
    )


# -------------------------------------------------------------------------------------- internals
def _check_kernels(kernels: int | Sequence[int]) -> list[int]:
    """S as one whole number >= 1 or a list of them (order kept, duplicates dropped)."""
    hint = "e.g. {arg=5} (several: 1,3,5 on the command line, a list in Python)"
    try:
        if isinstance(kernels, (int, np.integer)) and not isinstance(kernels, bool):
            return [as_int(kernels, "kernels", minimum=1, hint=hint)]
        values = as_int_list(kernels, "kernels", minimum=1, allow_none=False, hint=hint)
    except ArgumentError as err:
        err.hint = err.hint or hint
        raise
    return values


def _fitted_side(offsets: np.ndarray, causal: bool) -> np.ndarray:
    """The offsets a fit may use: all of them, or k <= 0 for a causal model."""
    offsets = np.asarray(offsets)
    return offsets[offsets <= 0] if causal else offsets


def _available(offsets: np.ndarray, causal: bool) -> int:
    """The largest W the profiles cover: |k| <= W on both sides, or k >= -W for a causal model."""
    offsets = np.asarray(offsets)
    if not offsets.size:
        return 0
    return int(-offsets.min()) if causal else int(min(-offsets.min(), offsets.max()))


def _resolve_window(window: int | None, kernels: list[int], causal: bool, available: int) -> int:
    """The half-width W actually fitted: `window`, or the default for `kernels` (clipped to the offsets)."""
    if available < 1:
        raise PosprobeError(
            "the profiles do not cover offsets k = -1..1", "pass profiles over k = -(n-1)..n-1 with n >= 2"
        )
    if window is None:
        return default_window(kernels, causal, available)
    window = as_int(window, "window", minimum=1, hint=f"pass {{arg}} between 1 and {available}")
    if window > available:
        raise ArgumentValueError(
            "window",
            f"the fit {{arg}} {window} is larger than the available offsets (|k| <= {available})",
            f"pass {{arg}} between 1 and {available}",
        )
    return window


def _fit_one(
    data: ProfileSet, s: int, window: int, seed: int, exhaustive: bool, progress: Progress | None = None
) -> TisaFit:
    """Fit S kernels to every head. With `progress`, heads are fitted in about 10 chunks (a head's fit does
    not depend on which heads share its batch, so the result is the same) and progress is reported."""
    n_sel, n_heads, _ = data.profiles.shape
    # ALBERT: one shared layer -> fit it once, replicate at every depth.
    fit_rows = data.profiles[:1] if data.shared_layers else data.profiles
    flat = fit_rows.reshape(-1, fit_rows.shape[-1])
    offsets = data.offsets
    if data.causal:  # SPEC §9: a causal model only uses k <= 0; what its scores would be at k > 0 is not fitted
        flat, offsets = flat[:, offsets <= 0], offsets[offsets <= 0]
    m = flat.shape[0]
    chunk = m if progress is None else max(8, -(-m // 10))
    parts = []
    start = time.perf_counter()
    for lo in range(0, m, chunk):
        if progress is not None:
            progress(f"S = {s}", lo, m)
        fitter = TisaKernelFitter(s, window=window, seed=seed, exhaustive=exhaustive)
        parts.append(fitter.fit(flat[lo : lo + chunk], offsets))
    if progress is not None:
        progress(f"S = {s}", m, m)
    seconds = time.perf_counter() - start
    rows = fit_rows.shape[0]

    def joined(name: str) -> np.ndarray:
        x = np.concatenate([getattr(p, name) for p in parts], axis=0)
        x = x.reshape((rows, n_heads) + x.shape[1:])
        return np.repeat(x, n_sel, axis=0) if data.shared_layers else x

    all_flags = [note for p in parts for note in p.flags_]
    flags = [list(all_flags[r * n_heads : (r + 1) * n_heads]) for r in range(rows)]
    if data.shared_layers:
        flags = [list(flags[0]) for _ in range(n_sel)]
    arrays = [joined(name) for name in ("a_", "b_", "c_", "offset_", "r2_")]
    first = parts[0]
    return TisaFit(s, *arrays, flags, seconds, holdout_r2=joined("holdout_r2_"), n_points=first.n_points_,
                   few_points=first.few_points_)  # fmt: skip


def _finite_or_none(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
