"""Profile files: the `.npz` files `posprobe profiles` and `posprobe attention` write and `fit-tisa` reads.

The one module that reads them (`read_profile_file`); `ProfileResult` and `AttentionResult` write them through the
one `.npz` writer (`formats.arrays`, from their declared `ARRAYS`): arrays plus a JSON `metadata` entry with the
arrays' dimension names. A profiles file holds `profiles`
(L_sel, H, 2n-1) over `offsets` (2n-1,) (k = j - i, increasing), `layers`, `fhat_r2`, `sections` and
`section_rows`; an attention file holds `score_profiles` / `prob_profiles` (and `profiles`, a copy of the
score profiles) over `offsets`, plus its counts (see `AttentionResult.arrays`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posprobe.errors import PosprobeError
from posprobe.formats.writing import load_npz

_HINT = "pass a .npz written by `posprobe profiles`"


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
    causal: bool = False  # the model only uses k <= 0 (the profile at k > 0 is fitted too, but never used)
    stack: str | None = None  # of a T5-style encoder-decoder: which stack the profiles came from
    quantization: str | None = None  # a GGUF file's quantisation: the profiles came from de-quantised weights


def read_profile_file(path: Path, layers: list[int] | None = None, profile: str | None = None) -> ProfileSet:
    """The profiles of a .npz written by `posprobe profiles` or `posprobe attention` (`profile`: its 'score'
    (default) or 'prob' profiles), for `layers` (default: all it holds); every problem one `PosprobeError`."""
    if not path.is_file():
        raise PosprobeError(f"profile file '{path}' does not exist", "pass a .npz written by `posprobe profiles`")
    meta, arrays = load_npz(path)
    hint = _HINT
    empirical = _empirical_profiles(path, arrays, profile, bool(meta.get("causal", False)))
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
        bool(meta.get("causal", False)),
        meta.get("stack") if meta.get("stack") in ("encoder", "decoder") else None,
        meta.get("quantization") if isinstance(meta.get("quantization"), str) else None,
    )


def _empirical_profiles(path: Path, arrays: dict, profile: str | None, causal: bool = False) -> dict | None:
    """For a `posprobe attention` file: its score (default) or probability profiles as `profiles`, cut to the
    widest window -K..K in which every head has data (offsets no text reached are NaN; a hybrid's layers without
    attention and the heads a layer does not have, NaN throughout, do not narrow it); for a causal model, which has
    data at k <= 0 only, to -K..0.
    None for other files."""
    if "score_profiles" not in arrays:
        if profile is not None:
            raise PosprobeError(f"'{path}' has no empirical profiles", "--profile needs a `posprobe attention` .npz")
        return None
    if profile not in (None, "score", "prob"):
        raise PosprobeError(f"unknown --profile '{profile}'", "use score or prob")
    values = np.asarray(arrays[f"{profile or 'score'}_profiles"], dtype=np.float64)
    offsets = np.asarray(arrays["offsets"])
    centre = int(np.flatnonzero(offsets == 0)[0])
    counts = arrays.get("layer_pair_counts")  # (L, 2n-1); a hybrid's layers without attention have no pair
    attending = np.asarray(counts).sum(-1) > 0 if counts is not None and np.ndim(counts) == 2 else None
    if attending is None or attending.shape[0] != values.shape[0] or not attending.any():
        attending = np.ones(values.shape[0], dtype=bool)
    scored = ~np.isnan(values[attending]).all(-1)  # (layers, H): a head NaN throughout where another has data is
    lacking = (~scored & scored.any(-1, keepdims=True))[..., None]  # one its layer does not have (SPEC §9)
    finite = (np.isfinite(values[attending]) | lacking).all(axis=(0, 1))  # offsets every head reached
    reach = 0
    while (
        centre - reach - 1 >= 0
        and (causal or centre + reach + 1 < len(offsets))
        and finite[[centre - reach - 1] if causal else [centre - reach - 1, centre + reach + 1]].all()
    ):
        reach += 1
    if reach < 1 or not finite[centre]:
        where = "k = -1..0" if causal else "k = ±1"
        raise PosprobeError(
            f"'{path}' has no data at {where} for every head",
            "record more or longer texts with `posprobe attention`",
        )
    window = slice(centre - reach, centre + (0 if causal else reach) + 1)
    return {**arrays, "profiles": values[..., window], "offsets": offsets[window]}
