"""What `posprobe states` returns and writes: `StatesResult` (SPEC §16's positional vectors, position probes and
massive activations of every hidden state, and the run's settings), its `.npz` contents and JSON record, and
`write_states` (the `.npz` and the two figures as one unit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from posprobe.analysis.massive import BINS_PER_OCTAVE, MEDIAN_RELATIVE_ERROR, MassiveActivations
from posprobe.analysis.position_probe import ALPHA_GRID, N_FOLDS, PositionProbes, baseline_words
from posprobe.analysis.positional_vectors import NOISE_MARGIN, PositionalVectors
from posprobe.formats.arrays import optional
from posprobe.formats.save import OutputFile, Saves, arrays_file, figure_file, save
from posprobe.results import ResultMixin

#: the per-hidden-state numbers (L+1,) of the JSON record and the checkpoint series, by their .npz name
PER_LAYER = (
    "probe_r2",
    "probe_r2_control",
    "probe_r2_control_std",
    "probe_mae",
    "probe_mae_control",
    "positional_toeplitz_r2",
    "positional_toeplitz_r2_null_mean",
    "positional_toeplitz_r2_null_std",
    "positional_toeplitz_r2_without_first",
    "positional_toeplitz_r2_without_first_null_mean",
    "positional_toeplitz_r2_without_first_null_std",
    "positional_norm_mean",
    "positional_norm_mean_without_first",
    "positional_positions_within_noise",
    "positional_positions_within_noise_without_first",
    "massive_max",
    "massive_position",
    "massive_channel",
    "massive_median",
    "massive_ratio",
    "massive_first_share",
    "massive_special_share",
)


@dataclass(frozen=True, repr=False)
class StatesResult(ResultMixin, Saves):
    """Position in the hidden states l = 0..L (l = 0 the embedding output, as `output_hidden_states` returns them).

    vectors: `PositionalVectors` (vectors (L+1, n, d), norms (L+1, n), gram, toeplitz_r2 (L+1,), counts, kept);
    probes: `PositionProbes` (r2, r2_control, mae, mae_control (L+1,), the chosen penalties, token counts);
    massive: `MassiveActivations` (max, position, channel, median, ratio (L+1,), the top tokens (L+1, K));
    top_tokens / top_delimiter (L+1, K): the top tokens as the tokenizer writes them and whether each is a
    delimiter (punctuation / white space), None without a tokenizer. References: null_r2, null_r2_without_first
    (draws, L+1), the Gram R² of permuted positions (`analysis.positional_vectors`); the probe's baseline and
    control draws in `probes`; the norms' noise floor in `vectors`. layer_kinds (L,): how layer l (whose output is
    hidden state l + 1) attends, in words (`families.windows.LayerKind.describe`: 'global', a local window, NoPE, a
    hybrid's layer without softmax attention: 'no positional score'); None for a model outside the family table.
    """

    model: str
    model_type: str
    n_texts: int
    max_length: int
    n_layers: int
    hidden_size: int
    vectors: PositionalVectors
    probes: PositionProbes
    massive: MassiveActivations
    top_tokens: list | None
    top_delimiter: list | None
    seconds: float
    text_source: str | None = None
    revision: str | None = None
    quantization: str | None = None  # a GGUF file's quantisation: the model ran on weights de-quantised from it
    null_r2: np.ndarray | None = None  # (draws, L+1): the Gram R² with positions 1.. permuted within each text
    null_r2_without_first: np.ndarray | None = None  # (draws, L+1): the same over positions i >= 1
    layer_kinds: list[str] | None = None  # (L,): layer l's kind; its output is hidden state l + 1
    edits: list[str] = field(default_factory=list)  # SPEC §20: the edits applied in every pass, as written

    _repr_fields = ("model", "n_texts", "max_length", "n_layers", "probe_r2", "probe_r2_control", "massive_ratio")
    # states.npz (formats.arrays): `state` the hidden states 0..L, `position` the positions 0..n-1, `kept` those
    # kept (`kept_without_first` less position 0), `top` the top activations, `fold` the probe's outer folds
    ARRAYS = {
        "positional_vectors": ("state", "position", "channel"),
        "positional_norms": ("state", "position"),
        "positional_gram": ("state", "kept", "kept"),
        "positional_norms_without_first": ("state", "position"),
        "positional_gram_without_first": ("state", "kept_without_first", "kept_without_first"),
        "position_counts": ("position",),
        "positions_kept": ("position",),
        "probe_alpha": ("state", "fold"),
        "probe_alpha_control": ("state", "fold"),
        "probe_layers": ("probed_state",),
        "probe_r2_baseline": (),
        "probe_r2_baseline_control": (),
        "probe_mae_baseline": (),
        "probe_baseline_inputs": ("baseline_input",),
        "massive_text": ("state",),
        **{f"massive_top_{name}": ("state", "top") for name in ("value", "position", "channel", "text", "token")},
        "massive_top_special": ("state", "top"),
        "layers": ("state",),
        "probe_r2_controls": optional("state", "control_draw"),
        "positional_noise_floor": optional("state", "position"),
        "positional_within_noise": optional("state", "position"),
        "positional_within_noise_without_first": optional("state", "position"),
        "positional_toeplitz_r2_null": optional("null_draw", "state"),
        "positional_toeplitz_r2_without_first_null": optional("null_draw", "state"),
        "massive_top_delimiter": optional("state", "top"),
        **{name: ("state",) for name in PER_LAYER},
        "massive_delimiter_share": optional("state"),
    }

    @property
    def n_states(self) -> int:
        return self.n_layers + 1

    @property
    def positional_vectors(self) -> np.ndarray:
        """(L+1, n, d) v_l(i), NaN rows where fewer than `min_texts` texts reach position i."""
        return self.vectors.vectors

    @property
    def probe_r2(self) -> np.ndarray:
        """(L+1,) held-out R² of the position probe (pooled over the 5 folds)."""
        return self.probes.r2

    @property
    def probe_r2_control(self) -> np.ndarray:
        """(L+1,) the same on positions permuted within each text."""
        return self.probes.r2_control

    @property
    def probe_mae(self) -> np.ndarray:
        """(L+1,) mean absolute error of the probe, in positions."""
        return self.probes.mae

    @property
    def massive_max(self) -> np.ndarray:
        """(L+1,) the largest |activation| over real tokens and channels."""
        return self.massive.max

    @property
    def massive_ratio(self) -> np.ndarray:
        """(L+1,) massive_max / the median |activation| of the hidden state."""
        return self.massive.ratio

    def per_layer(self) -> dict[str, np.ndarray]:
        """The per-hidden-state numbers (L+1,) by name (`PER_LAYER`, plus the delimiter share with a tokenizer)."""
        v, p, m = self.vectors, self.probes, self.massive
        kept = v.norms[:, v.kept]
        later = v.norms_without_first[:, v.kept & (np.arange(len(v.kept)) >= 1)]
        shares = m.shares(None if self.top_delimiter is None else np.array(self.top_delimiter, dtype=bool))
        nan = np.full(self.n_states, np.nan)
        within = nan if v.within_noise is None else v.within_noise.sum(1).astype(np.float64)
        within_later = nan if v.within_noise_without_first is None else v.within_noise_without_first.sum(1) * 1.0
        out = {
            "probe_r2": p.r2,
            "probe_r2_control": p.r2_control,
            "probe_r2_control_std": nan if p.r2_control_std is None else p.r2_control_std,
            "probe_mae": p.mae,
            "probe_mae_control": p.mae_control,
            "positional_toeplitz_r2": v.toeplitz_r2,
            "positional_toeplitz_r2_null_mean": _draw_stat(self.null_r2, np.mean, self.n_states),
            "positional_toeplitz_r2_null_std": _draw_stat(self.null_r2, _std, self.n_states),
            "positional_toeplitz_r2_without_first": v.toeplitz_r2_without_first,
            "positional_toeplitz_r2_without_first_null_mean": _draw_stat(
                self.null_r2_without_first, np.mean, self.n_states
            ),
            "positional_toeplitz_r2_without_first_null_std": _draw_stat(
                self.null_r2_without_first, _std, self.n_states
            ),
            "positional_norm_mean": _row_means(kept),
            "positional_norm_mean_without_first": _row_means(later),
            "positional_positions_within_noise": within,
            "positional_positions_within_noise_without_first": within_later,
            "massive_max": m.max,
            "massive_position": m.position,
            "massive_channel": m.channel,
            "massive_median": m.median,
            "massive_ratio": m.ratio,
            "massive_first_share": shares["first"],
            "massive_special_share": shares["special"],
        }
        if "delimiter" in shares:
            out["massive_delimiter_share"] = shares["delimiter"]
        return out

    def metadata(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "revision": self.revision,
            "quantization": self.quantization,
            "edits": list(self.edits),
            "n_texts": self.n_texts,
            "max_length": self.max_length,
            "n_layers": self.n_layers,
            "n_states": self.n_states,
            "layer_kinds": self.layer_kinds,
            "hidden_size": self.hidden_size,
            "text": self.text_source,
            "min_texts": self.vectors.min_texts,
            "n_positions_kept": self.vectors.n_kept,
            "n_tokens": self.probes.n_tokens,
            "probe_layers": self.probes.layers.tolist(),
            "probe_folds": N_FOLDS,
            "probe_fold_tokens": self.probes.fold_tokens.tolist(),
            "probe_alpha_grid": "10^-6 .. 10^2 times tr(C)/d (C: the centred Gram matrix of the hidden state)",
            "probe_alpha_relative": ALPHA_GRID.tolist(),
            "probe_mae_sample": self.probes.n_sample,
            "seed": self.probes.seed,
            "probe_r2_baseline": _number(self.probes.r2_baseline),
            "probe_r2_baseline_control": _number(self.probes.r2_baseline_control),
            "probe_mae_baseline": _number(self.probes.mae_baseline),
            "baseline_inputs": list(self.probes.baseline_inputs),
            "probe_baseline_features": f"{baseline_words(self.probes.baseline_inputs)} (no hidden state; same folds "
            "and fit; a causal model's position cannot see the text's length)",
            "probe_control_draws": None if self.probes.r2_controls is None else int(self.probes.r2_controls.shape[1]),
            "positional_null_draws": None if self.null_r2 is None else int(self.null_r2.shape[0]),
            "positional_null": "positions 1..len-1 permuted within each text (the first token stays at 0)",
            "positional_noise_margin": NOISE_MARGIN,
            "median_bins_per_octave": BINS_PER_OCTAVE,
            "median_relative_error": MEDIAN_RELATIVE_ERROR,
            "convention": "hidden state l = 0..L as output_hidden_states (0: embedding output); positions 0-based",
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """The npz contents."""
        v, p, m = self.vectors, self.probes, self.massive
        out = {
            "positional_vectors": v.vectors.astype(np.float32),
            "positional_norms": v.norms,
            "positional_gram": v.gram.astype(np.float32),
            "positional_toeplitz_r2": v.toeplitz_r2,
            "positional_norms_without_first": v.norms_without_first,
            "positional_gram_without_first": v.gram_without_first.astype(np.float32),
            "positional_toeplitz_r2_without_first": v.toeplitz_r2_without_first,
            "position_counts": v.counts,
            "positions_kept": v.kept,
            "probe_r2": p.r2,
            "probe_r2_control": p.r2_control,
            "probe_mae": p.mae,
            "probe_mae_control": p.mae_control,
            "probe_alpha": p.alpha,
            "probe_alpha_control": p.alpha_control,
            "probe_layers": p.layers,
            "probe_r2_baseline": np.float64(p.r2_baseline),
            "probe_r2_baseline_control": np.float64(p.r2_baseline_control),
            "probe_mae_baseline": np.float64(p.mae_baseline),
            "probe_baseline_inputs": np.asarray(p.baseline_inputs),
            "massive_max": m.max,
            "massive_position": m.position,
            "massive_channel": m.channel,
            "massive_text": m.text,
            "massive_median": m.median,
            "massive_ratio": m.ratio,
            "massive_top_value": m.top_value,
            "massive_top_position": m.top_position,
            "massive_top_channel": m.top_channel,
            "massive_top_text": m.top_text,
            "massive_top_token": m.top_token,
            "massive_top_special": m.top_special,
            "layers": np.arange(self.n_states),
        }
        if p.r2_controls is not None:
            out["probe_r2_controls"] = p.r2_controls
        if v.noise_floor is not None:
            out["positional_noise_floor"] = v.noise_floor
            out["positional_within_noise"] = v.within_noise
            out["positional_within_noise_without_first"] = v.within_noise_without_first
        if self.null_r2 is not None:
            out["positional_toeplitz_r2_null"] = self.null_r2
            out["positional_toeplitz_r2_without_first_null"] = self.null_r2_without_first
        if self.top_delimiter is not None:
            out["massive_top_delimiter"] = np.array(self.top_delimiter, dtype=bool)
        return out | {k: val for k, val in self.per_layer().items() if k not in out}

    def top_activations(self) -> list[list[dict]]:
        """Per hidden state, its top tokens: value, text, position, channel, token (id or string), special,
        delimiter (None without a tokenizer)."""
        m = self.massive
        rows = []
        for layer in range(self.n_states):
            row = []
            for k in range(m.top_value.shape[1]):
                token = self.top_tokens[layer][k] if self.top_tokens is not None else int(m.top_token[layer, k])
                row.append(
                    {
                        "value": float(m.top_value[layer, k]),
                        "text": int(m.top_text[layer, k]),
                        "position": int(m.top_position[layer, k]),
                        "channel": int(m.top_channel[layer, k]),
                        "token": token,
                        "special": bool(m.top_special[layer, k]),
                        "delimiter": None if self.top_delimiter is None else bool(self.top_delimiter[layer][k]),
                    }
                )
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        """The `--json` record without the output paths (NaN as None)."""
        numbers = {name: _nulls(values) for name, values in self.per_layer().items()}
        return self.metadata() | numbers | {"massive_top": self.top_activations(), "seconds": round(self.seconds, 3)}

    def command_record(self, saved) -> dict:
        """The command's `--json` record once `saved` is written (`record` of its paths)."""
        return self.record(saved["npz"], saved["figures"])

    def record(self, npz: str | Path | None = None, figures: list | None = None) -> dict:
        """The CLI's `--json` record: `to_dict()` with the `.npz` path and the figure paths."""
        out = {"npz": None if npz is None else str(npz)} | self.to_dict()
        if figures is not None:
            out["figures"] = [str(f) for f in figures]
        return out

    def output_files(self, fmt: str) -> list[OutputFile]:
        """`states.npz` (arrays and JSON metadata), `states.<fmt>` (summary) and `positional_gram.<fmt>`."""
        from posprobe.plotting import states as plots

        return [
            arrays_file("states.npz", self),
            figure_file(f"states.{fmt}", lambda: plots.states_summary(self)),
            figure_file(f"positional_gram.{fmt}", lambda: plots.gram_panels(self)),
        ]

    def plot(self, what: str = "summary"):
        """`summary`: probe R² and control, norms per position, massive activations per layer; `gram`: the
        positional vectors' Gram matrices of a few hidden states."""
        from posprobe.plotting import states as plots
        from posprobe.validation import as_choice

        what = as_choice(what, "what", ("summary", "gram"))
        return plots.states_summary(self) if what == "summary" else plots.gram_panels(self)


def _draw_stat(draws: np.ndarray | None, stat, n_states: int) -> np.ndarray:
    """(L+1,) `stat` over the null draws (draws, L+1); NaN without draws."""
    if draws is None or not len(draws):
        return np.full(n_states, np.nan)
    return stat(draws, axis=0)


def _std(a: np.ndarray, axis: int = 0) -> np.ndarray:
    """Sample standard deviation (NaN with fewer than 2 draws)."""
    return np.std(a, axis=axis, ddof=1) if a.shape[axis] > 1 else np.full(a.shape[1 - axis], np.nan)


def _number(value: float) -> float | None:
    return None if not np.isfinite(value) else float(value)


def _row_means(a: np.ndarray) -> np.ndarray:
    """(L+1,) the mean of each row of (L+1, k), NaN when k = 0."""
    return a.mean(axis=1) if a.shape[1] else np.full(a.shape[0], np.nan)


def _nulls(a) -> list:
    """A list with NaN as None (JSON null); integers stay integers."""
    a = np.asarray(a)
    if a.dtype.kind in "iub":
        return [int(x) for x in a]
    return [None if not np.isfinite(x) else float(x) for x in a]


def write_states(result: StatesResult, out_dir: str | Path, fmt: str = "png") -> dict:
    """Write `states.npz`, `states.<fmt>` (summary) and `positional_gram.<fmt>` into `out_dir` as one unit
    (`formats.save.save`: a failed or interrupted run leaves nothing). Returns the paths."""
    return save(result, out_dir, fmt)
