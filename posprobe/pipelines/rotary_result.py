"""The result of `posprobe rotary` (SPEC §15): `RotaryBandsResult`, its .npz arrays, JSON record and figure.

Dimensions: L_sel analysed layers, H query heads, H_kv key heads, F = r/2 bands (r rotated dims of d_h).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from posprobe.analysis.rotary_bands import long_band_share, wavelengths
from posprobe.formats.save import OutputFile, Saves, arrays_file, figure_file
from posprobe.results import ResultMixin


@dataclass(frozen=True, repr=False)
class RotaryBandsResult(ResultMixin, Saves):
    """Band norms per layer and head: `q_band_norm` (L_sel, H, F), `k_band_norm` (L_sel, H_kv, F), mean over real
    tokens of each token's ||(q_{a_f}, q_{b_f})|| (with texts) or of the content-free query (without);
    `frequencies` (L_sel, F) theta_f in radians per token and `wavelengths` 2 pi / theta_f in tokens, as the
    family's rotary module gives them for `n_positions` tokens (rope_scaling included); `rotary_scale` the factor
    the module multiplies its cos and sin by (yarn / longrope; 1 otherwise: the rotated part of a score is
    scale² * sum_f |q_f||k_f| cos(...)); `q_unrotated_norm` / `k_unrotated_norm` (L_sel, H / H_kv) the mean norm of
    the dims a partial rotary leaves alone (0 when every dim rotates). `pairing` says how bands pair a head's dims.
    `texts`: None (content-free) or what was averaged (`n_texts`, `n_tokens`, `max_length`, `longest_text`,
    `text`). Index i of the first axis is model layer `layers[i]`. `layer_windows`: the tokens a layer with a
    sliding window sees (window + 1), None for a global layer; `layer_contexts` reads each layer against
    min(its window, `context`). `budget`: critical dimension, extrapolation limit and each variant's wavelengths
    against the trained length (SPEC §17). `layer_kinds` how each layer of `layers` attends
    (`FhatResult.layer_kind`: NoPE layers apply no rotation, their band norms weigh nothing positional);
    `latent_split` says, for multi-head latent attention (DeepSeek), which dims are the rotary part (empty else)."""

    model: str
    model_type: str
    layers: list[int]
    n_layers: int
    head_dim: int
    rotated_dims: int
    pairing: str
    frequencies: np.ndarray
    rotary_scale: float
    q_band_norm: np.ndarray
    k_band_norm: np.ndarray
    q_unrotated_norm: np.ndarray
    k_unrotated_norm: np.ndarray
    n_positions: int
    max_positions: int | None
    texts: dict | None = None
    quantization: str | None = None  # a GGUF file's quantisation: the weights analysed were de-quantised from it
    layer_windows: list[int | None] | None = None  # tokens each layer sees (sliding window + 1); None: no window
    budget: dict | None = None  # the rotary budget (SPEC §17), from the config
    layer_kinds: list[str] | None = None
    latent_split: str = ""

    _repr_fields = ("model", "mode", "layers", "rotated_dims", "context", "q_band_norm", "k_band_norm", "wavelengths")
    ARRAYS = {  # rotary.npz (formats.arrays); `layer` indexes `layers`, `band` the frequency bands
        "q_band_norm": ("layer", "head", "band"),
        "k_band_norm": ("layer", "kv_head", "band"),
        "frequencies": ("layer", "band"),
        "wavelengths": ("layer", "band"),
        "q_unrotated_norm": ("layer", "head"),
        "k_unrotated_norm": ("layer", "kv_head"),
        "layers": ("layer",),
    }

    @property
    def mode(self) -> str:
        """'content-free' (the SPEC §9 input) or 'text' (averaged over real tokens)."""
        return "content-free" if self.texts is None else "text"

    @property
    def wavelengths(self) -> np.ndarray:
        """(L_sel, F) 2 pi / theta_f in tokens."""
        return wavelengths(self.frequencies)

    @property
    def partial(self) -> bool:
        """True when only the first `rotated_dims` of the `head_dim` dims rotate (partial rotary)."""
        return self.rotated_dims < self.head_dim

    @property
    def context(self) -> int:
        """The context the bands are read against: the longest analysed text, else the model's maximum positions
        (else the positions the angles were computed for)."""
        if self.texts is not None:
            return int(self.texts["longest_text"])
        return int(self.max_positions or self.n_positions)

    @property
    def layer_contexts(self) -> list[int]:
        """The context each analysed layer is read against: what it can see, min(its sliding window, `context`)
        for a layer with a window, else `context`."""
        windows = self.layer_windows or [None] * len(self.layers)
        return [self.context if w is None else min(int(w), self.context) for w in windows]

    def long_band_share(self, which: str = "q", context: float | None = None) -> np.ndarray:
        """(L_sel, H or H_kv): share of the summed band norms of queries (`which` 'q') or keys ('k') in bands whose
        wavelength exceeds `context` tokens (default: each layer's own, `layer_contexts`), bands that turn less
        than once over it."""
        norms = self.q_band_norm if which == "q" else self.k_band_norm
        contexts = self.layer_contexts if context is None else [context] * len(self.layers)
        return np.stack([long_band_share(norms[i], self.wavelengths[i], contexts[i]) for i in range(len(self.layers))])

    def long_band_fraction(self, context: float | None = None) -> np.ndarray:
        """(L_sel,): the share of bands whose wavelength exceeds `context` (default: each layer's own context):
        what `long_band_share` would be if every band had the same norm (the reference to read it against)."""
        contexts = np.asarray(self.layer_contexts if context is None else [context] * len(self.layers), dtype=float)
        return (self.wavelengths > contexts[:, None]).mean(-1)

    def note(self) -> str:
        """What the bands are and are not, in words (partial rotary said)."""
        what = (
            "content-free input (the average word embedding at the embedding level, SPEC §9)"
            if self.texts is None
            else f"mean over {self.texts['n_tokens']} real tokens of {self.texts['n_texts']} texts"
        )
        partial = (
            f"; partial rotary: only {self.rotated_dims} of {self.head_dim} dims rotate and form bands, the other "
            f"{self.head_dim - self.rotated_dims} add a term that does not depend on position (q/k_unrotated_norm)"
            if self.partial
            else ""
        )
        nope = [layer for layer, kind in zip(self.layers, self.layer_kinds or [], strict=False) if "NoPE" in kind]
        nope_words = f"; NoPE layers {nope} do not rotate: their bands carry no position" if nope else ""
        latent = f"; {self.latent_split}" if self.latent_split else ""
        return f"band norms of the pre-rotation queries and keys (after q/k norms), {what}{partial}{latent}{nope_words}"

    def arrays(self) -> dict[str, np.ndarray]:
        """The .npz arrays."""
        return {
            "q_band_norm": self.q_band_norm,
            "k_band_norm": self.k_band_norm,
            "frequencies": self.frequencies,
            "wavelengths": self.wavelengths,
            "q_unrotated_norm": self.q_unrotated_norm,
            "k_unrotated_norm": self.k_unrotated_norm,
            "layers": np.asarray(self.layers),
        }

    def metadata(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "mode": self.mode,
            "layers": self.layers,
            "n_layers": self.n_layers,
            "n_heads": int(self.q_band_norm.shape[1]),
            "n_kv_heads": int(self.k_band_norm.shape[1]),
            "head_dim": self.head_dim,
            "rotated_dims": self.rotated_dims,
            "partial_rotary": self.partial,
            "pairing": self.pairing,
            "rotary_scale": self.rotary_scale,
            "n_positions": self.n_positions,
            "max_positions": self.max_positions,
            "context": self.context,
            "layer_contexts": self.layer_contexts,
            "texts": self.texts,
            "quantization": self.quantization,
            "layer_kinds": self.layer_kinds,
            "note": self.note(),
            "budget": self.budget,
        }

    def command_record(self, saved) -> dict:
        """`rotary --json`: `to_dict()` with the `.npz` path and the figure's."""
        return self.to_dict() | {"npz": str(saved["npz"]), "figure": str(saved["figures"][0])}

    def to_dict(self) -> dict:
        q_share, k_share = self.long_band_share("q"), self.long_band_share("k")
        fraction = self.long_band_fraction()
        per_layer = []
        for i, layer in enumerate(self.layers):
            lengths = self.wavelengths[i]
            per_layer.append(
                {
                    "layer": layer,
                    "q_long_band_share": _number(np.nanmean(q_share[i])),
                    "k_long_band_share": _number(np.nanmean(k_share[i])),
                    "long_band_fraction": _number(fraction[i]),
                    "q_peak_wavelength": _number(lengths[np.argmax(self.q_band_norm[i].mean(0))]),
                    "k_peak_wavelength": _number(lengths[np.argmax(self.k_band_norm[i].mean(0))]),
                }
            )
        return self.metadata() | {
            "wavelengths": [[_number(x) for x in row] for row in self.wavelengths],
            "summary": per_layer,
        }

    def output_files(self, fmt: str) -> list[OutputFile]:
        """`rotary.npz` (arrays and JSON metadata) and `rotary_bands.<fmt>`."""
        return [
            arrays_file("rotary.npz", self),
            figure_file(f"rotary_bands.{fmt}", self.plot),
        ]

    def plot(self):
        """Band norm against wavelength (log x), one panel per layer, the context lengths marked."""
        from posprobe.plotting.rotary import band_norm_figure

        return band_norm_figure(self)


def _number(value) -> float | None:
    """A float for JSON (None for NaN or infinity)."""
    value = float(value)
    return value if math.isfinite(value) else None
