"""TISA kernel fitting of a checkpoint: head profiles -> batched least-squares fit -> kernels file + figure.

Convention everywhere: k = j - i (query i, key j); a kernel with c > 0 scores later tokens; a causal model's
profiles are fitted over k <= 0 only.

This module reads the profiles (a model's, computed by the analysis pipeline, or a .npz), checks the window against
them (`posprobe.analysis.tisa_window`) and runs the fitter; the results (`TisaFitResult`, `TisaFit`: records,
figures, `save()`) live in `posprobe.pipelines.fitting_results`. Fitting writes nothing; `save()` writes the
kernels files (format: `posprobe.formats.tisa_kernels`) and figures.
The kernels file (``tisa_kernels_S{S}.safetensors``; ``..._layers0,2`` when only some layers were
fitted) holds tensors ``a``, ``b``, ``c`` of shape
(L, H, S) and ``offset`` (L, H), float32, with L = the fitted layers in order, plus one metadata key
``posprobe`` whose value is a JSON object (model, mode, n_kernels, window, convention, layers,
per-head r2, shared_layers, ...). The offset is the constant softmax ignores; it is *not* part of the
kernels. The format (save, load, validation) lives in `posprobe.formats.tisa_kernels`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from posprobe.analysis.fhat import present_heads
from posprobe.analysis.tisa_fit import TisaKernelFitter
from posprobe.analysis.tisa_window import check_points, default_window, holdout_offsets
from posprobe.errors import ArgumentError, ArgumentValueError, PosprobeError
from posprobe.formats.profiles import ProfileSet, read_profile_file
from posprobe.formats.tisa_kernels import ORIENTATIONS
from posprobe.pipelines.defaults import FIT_TISA_KERNELS, FIT_TISA_ORIENTATION, FIT_TISA_SEED, MODE
from posprobe.pipelines.fitting_results import NO_SUCH_HEAD, TisaFit, TisaFitResult, figure_file_name
from posprobe.validation import as_bool, as_int, as_int_list

if TYPE_CHECKING:
    from transformers import PreTrainedModel


# ---------------------------------------------------------------------------------------------- API
#: progress(stage, done, total): called as a fit advances (the CLI draws a progress bar from it).
Progress = Callable[[str, int, int], None]


def fit_tisa(
    model: str | PathLike | PreTrainedModel | None = None,
    kernels: int | Sequence[int] = FIT_TISA_KERNELS,
    window: int | None = None,
    layers: list[int] | None = None,
    mode: str = MODE,
    seed: int = FIT_TISA_SEED,
    allow_pickle: bool = False,
    exhaustive: bool = False,
    profiles: ProfileSet | None = None,
    progress: Progress | None = None,
    orientation: str = FIT_TISA_ORIENTATION,
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
    _check_scored_layers(data)

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
        data.quantization,
    )


def _check_scored_layers(data: ProfileSet) -> None:
    """Refuse in one line layers whose profiles are NaN throughout (a hybrid's recurrent / convolution layers: no
    positional score), naming the layers that have one."""
    empty = [layer for layer, rows in zip(data.layers, data.profiles) if np.isnan(rows).all()]
    if not empty:
        return
    scored = [layer for layer in data.layers if layer not in empty]
    raise ArgumentValueError(
        "layers",
        f"layer{'s' if len(empty) > 1 else ''} {', '.join(map(str, empty))} of '{data.model}' "
        f"{'have' if len(empty) > 1 else 'has'} no positional score to fit (a hybrid's layers without softmax "
        "attention)",
        f"pass {{arg}} {','.join(map(str, scored))}" if scored else "pass {arg} with its attention layers",
    )


def fit_kernels_file(model: str | None, kernels: int, out_dir: str | Path, allow_pickle: bool = False) -> Path:
    """Fit S = `kernels` kernels to every head of `model` (paper mode, default window; the TISA paper's
    initialisation) and return the kernels file written into `out_dir` — what `--init fit` uses."""
    result = fit_tisa(model, kernels=[kernels], allow_pickle=allow_pickle).save(out_dir)
    return Path(result.fits[0].kernels_file)


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
    mode: str = MODE,
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
    from posprobe.pipelines.weights import ScoreReader, open_model, profiles_from
    from posprobe.validation import as_choice

    mode = as_choice(mode, "mode", MODES)
    layers = as_int_list(layers, "layers")
    reader = ScoreReader(open_model(model, allow_pickle, mode=mode), positions, stack)
    return PlannedProfiles(reader.causal, offsets_of(reader.n), lambda: _profile_set(profiles_from(reader, layers)))


def load_profiles(
    model: str | None,
    layers: list[int] | None = None,
    mode: str = MODE,
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
    from posprobe.pipelines.weights import profiles as compute_profiles

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
        res.quantization,
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
    present = present_heads(fit_rows, 1).reshape(-1)  # heads a layer does not have (SPEC §9): not fitted, NaN
    fitted = flat[present]
    m = fitted.shape[0]
    chunk = m if progress is None else max(8, -(-m // 10))
    parts = []
    start = time.perf_counter()
    for lo in range(0, m, chunk):
        if progress is not None:
            progress(f"S = {s}", lo, m)
        fitter = TisaKernelFitter(s, window=window, seed=seed, exhaustive=exhaustive)
        parts.append(fitter.fit(fitted[lo : lo + chunk], offsets))
    if progress is not None:
        progress(f"S = {s}", m, m)
    seconds = time.perf_counter() - start
    rows = fit_rows.shape[0]

    def joined(name: str) -> np.ndarray:
        x = np.concatenate([getattr(p, name) for p in parts], axis=0)
        every = np.full((flat.shape[0],) + x.shape[1:], np.nan)
        every[present] = x
        every = every.reshape((rows, n_heads) + x.shape[1:])
        return np.repeat(every, n_sel, axis=0) if data.shared_layers else every

    notes = iter([note for p in parts for note in p.flags_])
    all_flags = [next(notes) if here else NO_SUCH_HEAD for here in present]
    flags = [list(all_flags[r * n_heads : (r + 1) * n_heads]) for r in range(rows)]
    if data.shared_layers:
        flags = [list(flags[0]) for _ in range(n_sel)]
    arrays = [joined(name) for name in ("a_", "b_", "c_", "offset_", "r2_")]
    first = parts[0]
    return TisaFit(s, *arrays, flags, seconds, holdout_r2=joined("holdout_r2_"), n_points=first.n_points_,
                   few_points=first.few_points_)  # fmt: skip


__all__ = [
    "PlannedProfiles",
    "ProfileSet",
    "Progress",
    "TisaFit",
    "TisaFitResult",
    "figure_file_name",
    "fit_kernels_file",
    "fit_tisa",
    "load_profiles",
    "plan_profiles",
]
