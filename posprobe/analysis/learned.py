"""Learned positional functions of a retrofitted model (SPEC §11): mechanism parameters in, functions of k out.

Pure numpy; how each mechanism's parameters read over k is its own (`posprobe.mechanisms.reading`, named by its
catalogue entry): this module only asks and assembles. Dimension legend: L attention depths, H heads, d_h head size,
d = H*d_h channels, K offsets, r clip radius (tables have 2r+1 rows, row `kc + r`), S TISA kernels. Offsets
are `k = j - i` (query i, key j; positive = the key is to the right), increasing. A mechanism is one or more *parts*
(`composite` is one part with a fixed and a dynamic table; `fixed+shaw-values` two parts); each part's parameters
are stacked over depths: `{name: (L, ...)}` with the names of the torch module (`a`, `beta`, `dynamic.w`, ...).

Arrays produced (each also with an initial twin when the initial parameters are known: `initial` for
`functions`, `{name}_initial` for the others):

* `functions` (L, H, K): the static score bias each head adds at offset k — TISA `f_h(k)`, fixed
  `beta[h, clip(k)]`, composite's fixed part; the sum when several parts add one (each part then also as
  `{part}_functions`);
* `dynamic_norms` / `key_dynamic_norms` / `shaw_values_norms` (L, K): `|| table row of k ||`;
* with mean vectors of real text: `dynamic_scores` (L, H, K) = `q_mean[h] . w[clip(k)] / sqrt(d_h)`;
  `key_dynamic_scores` = `k_mean[h] . u[clip(-k)] / sqrt(d_h)` (the key-based table is indexed by `i - j`);
  `shaw_values_scores` = `a_V[clip(k)] . v_mean[h] / ||v_mean[h]||` (how far offset k pushes the output
  along the head's average value);
* `depthwise` (L, K, d): the per-channel weight `beta[clip(k), c]` applied to the value at offset k;
* `cat_filters` / `conv_qkv_filters` (L, 3, d, K): the query/key/value filter taps (zero beyond r).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from posprobe.mechanisms.catalogue import CATALOGUE
from posprobe.mechanisms.reading import KINDS, tisa_functions

__all__ = ["KINDS", "ROLES", "LearnedFunctions", "correlation_per_head", "initial_name", "learned_functions",
           "part_functions", "tisa_functions"]  # fmt: skip

ROLES = ("query", "key", "value")


@dataclass(frozen=True)
class LearnedFunctions:
    """What a retrofitted model's mechanism does as a function of `k = j - i`.

    `arrays`: name -> array (see the module docstring); `initial_known`: whether the `_initial` twins are there.
    """

    mechanism: str
    parts: tuple[str, ...]
    offsets: np.ndarray  # (K,) int, increasing
    arrays: dict[str, np.ndarray] = field(repr=False)
    initial_known: bool = False

    def kind(self, name: str) -> str:
        """'head' (L, H, K), 'layer' (L, K), 'channels' (L, K, d) or 'filters' (L, 3, d, K)."""
        return KINDS.get(name.removesuffix("_initial"), "head")

    @property
    def learned_names(self) -> list[str]:
        """The arrays that are not initial twins, in a stable order."""
        return [n for n in self.arrays if n != "initial" and not n.endswith("_initial")]

    def initial(self, name: str) -> np.ndarray | None:
        """The initial twin of `arrays[name]`, or None when the initial values are unknown."""
        return self.arrays.get(initial_name(name))

    def change(self, name: str) -> np.ndarray | None:
        """`arrays[name]` minus its initial twin, or None when the initial values are unknown."""
        initial = self.initial(name)
        return None if initial is None else self.arrays[name] - initial


def initial_name(name: str) -> str:
    """The name of the initial twin of array `name`: `initial` for `functions` (the issue's npz contract)."""
    return "initial" if name == "functions" else f"{name}_initial"


# ------------------------------------------------------------------------------------------- evaluation
def part_functions(
    part: str, params: Mapping[str, np.ndarray], offsets: np.ndarray, means: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """The arrays of one mechanism part from its parameters stacked over depths (see the module docstring): the
    part's catalogue entry reads them (`MechanismInfo.read_over_k`; each mechanism owns its reading over k).

    `means`: role ("query", "key", "value") -> `(L, H, d_h)` mean vectors of real text, or None.
    """
    if part not in CATALOGUE:
        raise ValueError(f"unknown mechanism part {part!r}")
    return CATALOGUE[part].read_over_k(params, offsets, means)


def learned_functions(
    mechanism: str,
    parts: Sequence[tuple[str, Mapping[str, np.ndarray]]],
    offsets: np.ndarray,
    initial: Sequence[Mapping[str, np.ndarray]] | None = None,
    means: Mapping[str, np.ndarray] | None = None,
) -> LearnedFunctions:
    """All arrays of a mechanism: `parts` = [(part name, {param: (L, ...)})], `initial` = the same parameters
    as initialised (one dict per part) or None. Static score biases of several parts are summed in
    `functions` and also kept per part."""
    offsets = np.asarray(offsets, dtype=np.int64)
    arrays: dict[str, np.ndarray] = {}
    statics = [name for name, _ in parts if CATALOGUE[name].static_bias]
    for twin, sets in ((False, [p for _, p in parts]), (True, initial)):
        if sets is None:
            continue
        for (name, _), params in zip(parts, sets):
            for key, value in part_functions(name, params, offsets, means).items():
                if key == "functions" and len(statics) > 1:
                    own = f"{name.replace('-', '_')}_functions"
                    arrays[initial_name(own) if twin else own] = value
                    total = initial_name(key) if twin else key
                    arrays[total] = arrays.get(total, 0) + value
                else:
                    arrays[initial_name(key) if twin else key] = value
    twins = {initial_name(n) for n in arrays}
    order = sorted(arrays, key=lambda n: (n in twins, list(arrays).index(n)))
    return LearnedFunctions(
        mechanism, tuple(n for n, _ in parts), offsets, {n: arrays[n] for n in order}, initial is not None
    )


# ------------------------------------------------------------------------------------------- comparison
def correlation_per_head(
    x: np.ndarray, x_offsets: np.ndarray, y: np.ndarray, y_offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Pearson correlation over the offsets both have, per (layer, head): x `(L, H, Kx)`, y `(L, H, Ky)`.

    Returns (`(L, H)` correlations, NaN where either side is constant over the shared offsets; the shared
    offsets). L and H must match.
    """
    common = np.intersect1d(np.asarray(x_offsets), np.asarray(y_offsets))
    xi = np.searchsorted(np.asarray(x_offsets), common)
    yi = np.searchsorted(np.asarray(y_offsets), common)
    a = np.asarray(x, dtype=np.float64)[..., xi]
    b = np.asarray(y, dtype=np.float64)[..., yi]
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    denom = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(denom > 0, (a * b).sum(-1) / denom, np.nan)
    return r, common
