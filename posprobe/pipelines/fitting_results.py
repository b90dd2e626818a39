"""The results of `fit_tisa` (`posprobe.pipelines.fitting`): `TisaFit` (one number of kernels S) and `TisaFitResult`
(every S of one model, with the profiles they were fitted to): their JSON records, figures and `save()`, which
writes the kernels files (format: `posprobe.formats.tisa_kernels`) and figures.

Convention: k = j - i (query i, key j); a kernel with c > 0 scores later tokens. A causal model's fits use k <= 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from posprobe.analysis.tisa_window import POINTS_PER_PARAMETER, parameters, span, window_for
from posprobe.errors import ArgumentValueError
from posprobe.formats.save import OutputFile, Saves, figure_file
from posprobe.formats.tisa_kernels import (
    CONVENTION,
    FUNCTION,
    kernels_file_name,
    kernels_metadata,
    layers_suffix,
    official_kernels_writer,
    tisa_kernels_writer,
)
from posprobe.results import ResultMixin

NO_SUCH_HEAD = "no such head"  # the flag of a head a layer does not have (SPEC §9: Laguna): not fitted, NaN


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
        """Median over heads of the R² (a head a layer does not have, NaN, left out: SPEC §9)."""
        return float(np.nanmedian(self.r2))

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
            if self.flags[li][h] != NO_SUCH_HEAD  # a head the layer does not have (SPEC §9) is left out
        ]


@dataclass(frozen=True, repr=False)
class TisaFitResult(ResultMixin, Saves):
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
    quantization: str | None = None  # a GGUF file's quantisation: the profiles came from de-quantised weights

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
        from posprobe.plotting.fit import fit_figure

        return fit_figure(self, self.fits[0] if n_kernels is None else self.fit(n_kernels))

    def output_files(self, fmt: str, where: str | Path = "") -> list[OutputFile]:
        """Each fit's kernels file ('kernels') and figure ('figures'), in the order of the fits; file names carry S,
        and the fitted layers when not all were fitted (`kernels_file.kernels_file_name`). The arrays are checked
        here, before anything is written (a refusal names the file in folder `where`)."""
        from posprobe.plotting.fit import fit_figure

        files = []
        for fit in self.fits:
            name = kernels_file_name(self, fit)
            if self.orientation == "official":
                write = official_kernels_writer(fit, kernels_metadata(self, fit))
            else:
                write = tisa_kernels_writer(Path(where) / name, fit, kernels_metadata(self, fit))
            files.append(OutputFile(name, "kernels", write=write))
            files.append(figure_file(figure_file_name(self, fit, fmt), lambda fit=fit: fit_figure(self, fit)))
        return files

    def save(self, out_dir: str | Path, fmt: str = "png") -> TisaFitResult:
        """Write each fit's kernels file and figure into `out_dir` as one unit (`formats.save.save`, as `posprobe
        fit-tisa` does); returns the result with `kernels_file` and `figure` set on every fit."""
        from dataclasses import replace

        from posprobe.formats.save import check_format, save
        from posprobe.formats.writing import prepare_out_dir

        check_format(fmt)
        out = prepare_out_dir(out_dir)
        saved = save(self, out, fmt, where=out)
        kernels, figures = saved["kernels"], saved["figures"]
        return replace(
            self, fits=[replace(f, kernels_file=k, figure=g) for f, k, g in zip(self.fits, kernels, figures)]
        )

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
            "quantization": self.quantization,
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


def figure_file_name(result: TisaFitResult, fit: TisaFit, fmt: str = "png") -> str:
    """`tisa_fit_S{S}.{fmt}`, with the fitted layers in the name as for `kernels_file_name`."""
    return f"tisa_fit_S{fit.n_kernels}{layers_suffix(result)}.{fmt}"


def _finite_or_none(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
