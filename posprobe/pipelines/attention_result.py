"""What `posprobe attention` returns and writes: `AttentionResult` (the SPEC §10 arrays and the SPEC §14 sink
measures of every layer and head, the weights-based profiles beside them, the run's settings), its `.npz`
contents and JSON record, and `write_attention` (the `.npz` and the figures as one unit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from posprobe.analysis.empirical import EmpiricalProfiles
from posprobe.analysis.learned_sinks import LearnedSinkShares
from posprobe.analysis.sinks import SinkMeasures
from posprobe.formats.arrays import either, optional
from posprobe.formats.save import OutputFile, Saves, arrays_file, figure_file, save
from posprobe.pipelines.defaults import ATTENTION_WINDOW
from posprobe.results import ResultMixin

SINK_ARRAYS = (
    "first_token_mass",
    "special_token_mass",
    "distance_without_first",
    "sink_rate",
    "uniform_distance",
    "uniform_distance_without_first",
    "uniform_first_token_mass",
    "first_token_queries",
    "first_token_ratio",
)

# the sinks' references: (L,), or (L, H) where a layer's heads pick keys of their own (`SinkMeasures`)
SINK_REFERENCES = (
    "uniform_distance",
    "uniform_distance_without_first",
    "uniform_first_token_mass",
    "first_token_queries",
)

LEARNED_SINK_ARRAYS = ("learned_sink_share", "real_token_share")  # (L, H); only for models with learned sinks


@dataclass(frozen=True, repr=False)
class AttentionResult(ResultMixin, Saves):
    """Empirical profiles and attention sinks of every layer and head.

    profiles: SPEC §10 (`EmpiricalProfiles`: score_profiles, prob_profiles, prob_profiles_without_first
    (L, H, 2n-1), pair_counts, mean_distance (L, H), mean_scores, toeplitz_r2, ...; mean_scores, count_matrix and
    toeplitz_r2 None where the n x n sums were not kept, `mean_scores_note` says why); sinks: SPEC §14
    (`SinkMeasures`: first_token_mass, special_token_mass, distance_without_first, first_token_ratio (L, H),
    sink_rate, uniform_distance, uniform_distance_without_first, uniform_first_token_mass, first_token_queries (L,)).
    learned_sinks: for heads with learned sink logits (gpt-oss), the sink's own share of each query's attention and
    the share left to real tokens (`LearnedSinkShares`, (L, H) each); None for models without them. The profiles'
    probabilities are those of the real keys (rows sum to the share left to real tokens).
    weights_profiles (L, H, 2n-1): the weights-based profile (faithful-mode F̂_P diagonal means over the leading
    n x n positions) where the family has one, else None; weights_correlation (L, H): Pearson r between s(k) and it
    over the offsets with at least `min_pairs` pairs (NaN where undefined), or None.
    layer_kinds (L,): how each layer attends, in words (`families.windows.LayerKind.describe`: 'global', 'local
    |k| <= 511, ...', NoPE layers, chunks); a hybrid's layers without softmax attention say 'no positional score'
    and hold NaN in every per-layer array (counts 0); None for a model outside the family table.
    """

    model: str
    model_type: str
    n_texts: int
    max_length: int
    exclude_special: bool
    n_layers: int
    n_heads: int
    profiles: EmpiricalProfiles
    weights_profiles: np.ndarray | None
    weights_correlation: np.ndarray | None
    weights_note: str
    seconds: float
    text_source: str | None = None
    extra: dict = field(default_factory=dict)
    sinks: SinkMeasures | None = None
    min_pairs: int = 1
    quantization: str | None = None  # a GGUF file's quantisation: the model ran on weights de-quantised from it
    stack: str | None = None  # 'encoder' for an encoder-decoder (its encoder stack ran on the texts), else None
    learned_sinks: LearnedSinkShares | None = None  # learned per-head sink logits (gpt-oss), else None
    layer_kinds: list[str] | None = None
    edits: list[str] = field(default_factory=list)  # SPEC §20: the edits applied in every pass, as written

    @property
    def attention_layers(self) -> list[int]:
        """The layers with softmax attention (every layer but a hybrid's recurrent / convolution ones)."""
        from posprobe.families.windows import NO_SCORE

        kinds = self.layer_kinds or [""] * self.n_layers
        return [layer for layer, kind in enumerate(kinds) if NO_SCORE not in kind]

    mean_scores_note: str = "kept"  # whether the n x n mean score matrix was kept, and why not

    _repr_fields = ("model", "n_texts", "max_length", "n_layers", "n_heads", "causal", "mean_distance", "sink_rate")
    # attention.npz (formats.arrays; `formats.profiles` reads its profiles): `offset` k = j - i, `query` / `key` the
    # positions 0..n-1; the four references of the sinks are (layer, head) where a layer's heads pick their keys
    ARRAYS = {
        "score_profiles": ("layer", "head", "offset"),
        "prob_profiles": ("layer", "head", "offset"),
        "offsets": ("offset",),
        "pair_counts": ("offset",),
        "layer_pair_counts": ("layer", "offset"),
        "mean_distance": ("layer", "head"),
        "n_queries": ("layer",),
        "layers": ("layer",),
        "toeplitz_r2": optional("layer", "head"),
        "mean_scores": optional("layer", "head", "query", "key"),
        "count_matrix": optional("query", "key"),
        "prob_profiles_without_first": optional("layer", "head", "offset"),
        "layer_pair_counts_without_first": optional("layer", "offset"),
        "head_pair_counts": optional("layer", "head", "offset"),
        "weights_correlation": optional("layer", "head"),
        "weights_profiles": optional("layer", "head", "offset"),
        **{name: optional("layer", "head") for name in SINK_ARRAYS},
        "sink_rate": optional("layer"),
        **{name: either(("layer",), ("layer", "head"), optional=True) for name in SINK_REFERENCES},
        **{name: optional("layer", "head") for name in LEARNED_SINK_ARRAYS},
    }

    @property
    def mean_distance(self) -> np.ndarray:
        """(L, H) mean attention distance (SPEC §10)."""
        return self.profiles.mean_distance

    @property
    def toeplitz_r2(self) -> np.ndarray:
        """(L, H) Toeplitz R^2 of the mean score matrix; all NaN when the matrix was not kept."""
        r2 = self.profiles.toeplitz_r2
        return np.full((self.n_layers, self.n_heads), np.nan) if r2 is None else r2

    @property
    def first_token_mass(self) -> np.ndarray | None:
        """(L, H) mean attention on the first token over queries i >= 1 (SPEC §14)."""
        return None if self.sinks is None else self.sinks.first_token_mass

    @property
    def sink_rate(self) -> np.ndarray | None:
        """(L,) share of each layer's heads whose first-token mass exceeds the threshold (0.3)."""
        return None if self.sinks is None else self.sinks.sink_rate

    @property
    def causal(self) -> bool:
        """True when no counted pair looks right (k > 0): the model's mask is causal."""
        n = self.max_length
        counts = self.profiles.pair_counts
        return bool(counts[:, n:].sum() == 0 and counts[:, : n - 1].sum() > 0)

    def metadata(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "n_texts": self.n_texts,
            "max_length": self.max_length,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "exclude_special": self.exclude_special,
            "causal": self.causal,
            "text": self.text_source,
            "n_queries": int(self.profiles.n_queries[self._first]),
            "n_pairs": int(self.profiles.pair_counts[self._first].sum()),
            "weights_profile": self.weights_note,
            "weights_correlation_min_pairs": self.min_pairs,
            "layers": list(range(self.n_layers)),
            "layer_kinds": self.layer_kinds,
            "attention_layers": self.attention_layers,
            "mode": "empirical",
            "quantization": self.quantization,
            "edits": list(self.edits),
            "stack": self.stack,
            "mean_scores": self.mean_scores_note,
            "convention": "k = j - i (query i, key j); profiles over k = -(n-1)..n-1 increasing",
        } | self._sink_metadata()

    @property
    def _first(self) -> int:
        """The first attention layer (whose query and pair counts the metadata reports)."""
        return next(iter(self.attention_layers), 0)

    def _sink_metadata(self) -> dict:
        if self.sinks is None:
            return {}
        return {
            "sink_threshold": self.sinks.threshold,
            "n_sink_queries": self.sinks.n_queries,
            "n_special_tokens": self.sinks.n_special_tokens,
        }

    def arrays(self, profile: str = "score") -> dict[str, np.ndarray]:
        """The npz contents. `profiles` repeats `score_profiles` (or `prob_profiles`) so that `fit-tisa` reads it."""
        p = self.profiles
        out = {
            "score_profiles": p.score_profiles,
            "prob_profiles": p.prob_profiles,
            "offsets": p.offsets,
            "pair_counts": p.pair_counts[self._first],
            "layer_pair_counts": p.pair_counts,
            "mean_distance": p.mean_distance,
            "n_queries": p.n_queries,
            "layers": np.arange(self.n_layers),
        }
        if p.mean_scores is not None:  # the n x n sums were kept (see `mean_scores_note`)
            out |= {
                "toeplitz_r2": p.toeplitz_r2,
                "mean_scores": p.mean_scores.astype(np.float32),
                "count_matrix": p.count_matrix[self._first],
            }
        if p.prob_profiles_without_first is not None:
            out["prob_profiles_without_first"] = p.prob_profiles_without_first
            out["layer_pair_counts_without_first"] = p.pair_counts_without_first
        if p.head_pair_counts is not None:  # layers whose heads pick keys of their own: each head's pair counts
            out["head_pair_counts"] = p.head_pair_counts
        if self.weights_correlation is not None:
            out["weights_correlation"] = self.weights_correlation
            out["weights_profiles"] = self.weights_profiles
        if self.sinks is not None:
            out |= {name: getattr(self.sinks, name) for name in SINK_ARRAYS if getattr(self.sinks, name) is not None}
        if self.learned_sinks is not None:
            out |= {name: getattr(self.learned_sinks, name) for name in LEARNED_SINK_ARRAYS}
        return out

    @property
    def present_heads(self) -> np.ndarray:
        """(L, H) bool: False for a head its layer does not have (SPEC §9: fewer query heads than the model's most,
        Laguna; NaN throughout where another head of the layer has pairs), True otherwise."""
        from posprobe.analysis.fhat import present_heads

        return present_heads(self.profiles.prob_profiles, 1)

    def to_dict(self) -> dict:
        """The `--json` record without the output paths (NaN as None); a per-head (L, H) list leaves out the heads
        a layer does not have (`present_heads`), so layer l's list has its own H_l entries."""
        present = self.present_heads
        heads = lambda a: _nulls(np.asarray(a, dtype=np.float64), present)  # noqa: E731
        out = self.metadata() | {
            "mean_distance": heads(self.profiles.mean_distance),
            "toeplitz_r2": heads(self.toeplitz_r2),
            "weights_correlation": None if self.weights_correlation is None else heads(self.weights_correlation),
        }
        if self.sinks is not None:
            out |= {
                name: heads(getattr(self.sinks, name)) for name in SINK_ARRAYS if getattr(self.sinks, name) is not None
            }
        if self.learned_sinks is not None:
            out |= {name: heads(getattr(self.learned_sinks, name)) for name in LEARNED_SINK_ARRAYS}
            out["learned_sink_queries"] = self.learned_sinks.n_queries
        return out | {"seconds": round(self.seconds, 3)}

    def command_record(self, saved) -> dict:
        """The command's `--json` record once `saved` is written (`record` of its paths)."""
        return self.record(saved["npz"], saved["figures"])

    def record(self, npz: str | Path | None = None, figures: list | None = None) -> dict:
        """The CLI's `--json` record: `to_dict()` with the `.npz` path and the figure paths."""
        out = {"npz": None if npz is None else str(npz)} | self.to_dict()
        if figures is not None:
            out["figures"] = [str(f) for f in figures]
        return out

    def output_files(self, fmt: str, window: int = ATTENTION_WINDOW) -> list[OutputFile]:
        """`attention.npz` (`arrays()`, declared in `ARRAYS`), one profile figure per layer (k = -window ..
        window), `mean_distance.<fmt>`, with sinks `sinks.<fmt>` and with learned sinks (gpt-oss)
        `learned_sinks.<fmt>`."""
        from posprobe.plotting import attention as plots

        files = [arrays_file("attention.npz", self)]
        pages = plots.attention_pages(self, min(window, self.max_length - 1))  # laid out once, redrawn per layer
        for layer in range(self.n_layers):
            files.append(
                OutputFile(f"attention_profiles_layer{layer}.{fmt}", "figures", write=pages.writer(layer, fmt))
            )
        files.append(figure_file(f"mean_distance.{fmt}", lambda: plots.mean_distance_chart(self)))
        if self.sinks is not None:
            files.append(figure_file(f"sinks.{fmt}", lambda: plots.sink_chart(self)))
        if self.learned_sinks is not None:
            files.append(figure_file(f"learned_sinks.{fmt}", lambda: plots.learned_sink_chart(self)))
        return files

    def plot(self, layer: int | None = None):
        """With `layer`: that layer's profile grid; without: the sink figure (first-token mass per head and layer,
        sink rate per layer)."""
        from posprobe.plotting import attention as plots

        if layer is None:
            return plots.sink_chart(self)
        from posprobe.validation import as_index

        return plots.profile_grid(self, as_index(layer, "layer", self.n_layers))


def _nulls(a: np.ndarray, present: np.ndarray | None = None) -> list:
    """Nested lists with NaN as None (JSON null); with `present` (L, H) bool, an (L, H) array's row l keeps only
    the heads present in layer l (arrays of other shapes are unchanged)."""
    if present is not None and np.shape(a) == present.shape:
        return [_nulls(row[here]) for row, here in zip(a, present, strict=True)]
    return [_nulls(x) for x in a] if np.ndim(a) > 1 else [None if not np.isfinite(v) else float(v) for v in a]


def write_attention(
    result: AttentionResult, out_dir: str | Path, fmt: str = "png", window: int = ATTENTION_WINDOW
) -> dict:
    """Write `attention.npz`, one profile figure per layer, the mean-distance chart, the sink chart and (learned
    sinks) the learned-sink chart into `out_dir`, as one unit (`formats.save.save`: an interrupted or failed run
    leaves nothing, not even an `out_dir` it created); the profile figures show k = -W..W, W = `window` at most
    n - 1. Returns the paths ({"npz": path, "figures": [paths]})."""
    return save(result, out_dir, fmt, window=min(window, result.max_length - 1))
