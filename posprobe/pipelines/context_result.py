"""The result of `posprobe context` (SPEC §17): `ContextResult`, its .npz arrays, JSON record, text table and figures.

Dimensions: V variants, n lengths, L the longest length (loss by position has L-1 entries: t = 0..L-2), F = d/2
rotary pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from posprobe.analysis.context_loss import octave_means
from posprobe.formats.arrays import optional
from posprobe.formats.save import OutputFile, Saves, arrays_file, figure_file, record_file
from posprobe.results import ResultMixin


@dataclass(frozen=True, repr=False)
class ContextResult(ResultMixin, Saves):
    """Loss across the context per rotary variant.

    `position_loss` (V, L-1) float64: loss(t) = mean over the windows of the longest length of
    -log p(x[t+1] | x[0..t]); `perplexity` (V, n): exp of the mean loss over positions and windows of each length;
    `inv_freq` (V, F): each variant's inverse frequencies as its rotary module used them at the longest length
    (dynamic: recomputed for it), empty (V, 0) for a family without rotary embeddings; `attention_scaling` (V,)
    the factor the module multiplies cos and sin by; `windows` (n,) windows per length (each length covers the
    stream tokens of the longest's windows); `tokens` (n,) tokens scored per length: the same tokens at every length
    (`text['scored_stream_tokens']` of the stream, less `text['window_starts_left_out']` without a BOS).
    `trained_length`: the length the model was trained on (SPEC §17); `budget`: the rotary budget (None without
    rotary embeddings)."""

    model: str
    model_type: str
    position_kind: str
    variants: list[str]
    lengths: list[int]
    position_loss: np.ndarray
    perplexity: np.ndarray
    inv_freq: np.ndarray
    attention_scaling: np.ndarray
    windows: np.ndarray
    tokens: np.ndarray
    trained_length: int | None
    max_positions: int | None
    text: dict = field(default_factory=dict)
    budget: dict | None = None
    quantization: str | None = None
    # (V, n, 2): a 95 % interval of each perplexity over its windows (`analysis.context_loss.perplexity_interval`),
    # NaN with one window; None in a result from before issue 49
    perplexity_interval: np.ndarray | None = None
    edits: list[str] = field(default_factory=list)  # SPEC §20: the edits applied in every pass, as written

    _repr_fields = ("model", "variants", "lengths", "trained_length", "perplexity")
    ARRAYS = {  # context.npz (formats.arrays)
        "position_loss": ("variant", "position"),
        "perplexity": ("variant", "length"),
        "inv_freq": ("variant", "frequency"),
        "attention_scaling": ("variant",),
        "variants": ("variant",),
        "lengths": ("length",),
        "windows": ("length",),
        "tokens": ("length",),
        "perplexity_interval": optional("variant", "length", "bound"),  # None in a result from before issue 49
    }

    @property
    def beyond_trained(self) -> list[int]:
        """The lengths longer than the trained length."""
        return [n for n in self.lengths if self.trained_length is not None and n > self.trained_length]

    def scored_words(self) -> str:
        """Which tokens each perplexity is over, in words."""
        covered, left = self.text.get("scored_stream_tokens"), self.text.get("window_starts_left_out") or 0
        if len({int(x) for x in self.tokens}) > 1:  # a result from before issue 47's same-token scoring
            return "tokens scored per length: " + ", ".join(
                f"{n:,}: {int(x):,}" for n, x in zip(self.lengths, self.tokens)
            )
        words = f"perplexity over the same {int(self.tokens[-1]):,} tokens at every length"
        if covered is None:
            return words
        words += f" (stream tokens 0..{covered - 1:,}"
        if left:
            words += (
                f", less the {left:,} that start a window at some length: without a BOS no window predicts its first"
            )
        return words + ")"

    def note(self) -> str:
        """What the numbers are, in words."""
        with_bos = self.text.get("bos_id") is not None
        bos = "a BOS first in each window" if with_bos else "no BOS (the tokenizer adds none)"
        where = f" of {self.text['source']}" if self.text.get("source") else ""
        past = (
            f"; lengths {', '.join(map(str, self.beyond_trained))} lie past the trained length "
            f"{self.trained_length:,}: extrapolation"
            if self.beyond_trained
            else ""
        )
        return (
            f"loss in nats from the model's logits (each token's within 1e-6 of float64, sums in float64); "
            f"documents{where} joined with "
            f"{'EOS' if self.text.get('eos_id') is not None else 'nothing'}, cut into consecutive windows, {bos}; "
            f"{self.scored_words()}{past}"
        )

    def octaves(self) -> tuple[np.ndarray, np.ndarray]:
        """(edges (K+1,), mean loss (V, K)) over position bins t in [edges[k], edges[k+1])."""
        return octave_means(self.position_loss)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "position_loss": self.position_loss,
            "perplexity": self.perplexity,
            "inv_freq": self.inv_freq,
            "attention_scaling": self.attention_scaling,
            "variants": np.asarray(self.variants),
            "lengths": np.asarray(self.lengths),
            "windows": self.windows,
            "tokens": self.tokens,
        } | ({} if self.perplexity_interval is None else {"perplexity_interval": self.perplexity_interval})

    def metadata(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "position_kind": self.position_kind,
            "variants": self.variants,
            "lengths": self.lengths,
            "trained_length": self.trained_length,
            "max_positions": self.max_positions,
            "beyond_trained_length": self.beyond_trained,
            "text": self.text,
            "quantization": self.quantization,
            "edits": list(self.edits),
            "note": self.note(),
        }

    def command_record(self, saved) -> dict:
        """`context --json`: `to_dict()` with the paths of the `.npz`, the JSON record and the figures."""
        paths = {"npz": str(saved["npz"]), "json": str(saved["json"]), "figures": [str(f) for f in saved["figures"]]}
        return self.to_dict() | paths

    def to_dict(self) -> dict:
        edges, means = self.octaves()
        return (
            self.metadata()
            | {
                "windows": [int(x) for x in self.windows],
                "tokens": [int(x) for x in self.tokens],
                "scored_tokens": {str(n): int(x) for n, x in zip(self.lengths, self.tokens)},
                "perplexity": {
                    v: {str(n): _number(p) for n, p in zip(self.lengths, row)}
                    for v, row in zip(self.variants, self.perplexity)
                },  # fmt: skip
                "perplexity_interval": None
                if self.perplexity_interval is None
                else {
                    v: {str(n): [_number(x) for x in pair] for n, pair in zip(self.lengths, rows)}
                    for v, rows in zip(self.variants, self.perplexity_interval)
                },
                "loss_by_octave": {
                    "position_bins": [[int(a), int(b)] for a, b in zip(edges[:-1], edges[1:])],
                    **{v: [_number(x) for x in row] for v, row in zip(self.variants, means)},
                },
                "budget": self.budget,
            }
        )

    def output_files(self, fmt: str) -> list[OutputFile]:
        """`context.npz` (arrays and JSON metadata), `context.json` (`to_dict()`), `context_loss_by_position.<fmt>`
        and `context_perplexity.<fmt>`."""
        return [
            arrays_file("context.npz", self),
            record_file("context.json", self.to_dict()),
            figure_file(f"context_loss_by_position.{fmt}", self.plot),
            figure_file(f"context_perplexity.{fmt}", self.plot_perplexity),
        ]

    def plot(self):
        """Loss by position per variant (raw points and a smoothed curve, log x), the trained length marked."""
        from posprobe.plotting.context import position_loss_figure

        return position_loss_figure(self)

    def plot_perplexity(self):
        """Perplexity by length per variant (log x), the trained length marked."""
        from posprobe.plotting.context import perplexity_figure

        return perplexity_figure(self)


def _number(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
