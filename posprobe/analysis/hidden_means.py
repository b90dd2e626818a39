"""Mean hidden states entering chosen layers over real text (SPEC §13): the inputs of data-conditioned scores.

A capture reducer (`HiddenMeanAccumulator`: `add` one `posprobe.capture.BatchCapture`, `result` at the end), tensors
in, arrays out; running sums in float64 on the model's device, so memory is set by the sums, never by the corpus.
`hidden_states[l]` is what transformers returns with `output_hidden_states`: the residual stream entering layer l,
before the layer's own norm ([0] is the embedding output). Right padding: text t's real tokens sit at 0..len-1.

- `mean`: x_l = mean of h_l(t, i) over every text t and real token at position i >= 1 (position 0 is left out:
  the first token carries the attention sink's very large activations, SPEC §16). Sums (L_sel, d).
- `position-mean`: x_l(i) = mean over the texts that reach position i of h_l(t, i). Sums (L_sel, n, d) for n =
  `max_length`, and the number of texts at each position (non-increasing in i: a text reaching i reaches i - 1).

Dimensions: B texts in a batch, m the batch's longest text, d hidden size, L_sel chosen layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from posprobe.errors import PosprobeError

if TYPE_CHECKING:
    import torch

MEAN = "mean"
POSITION_MEAN = "position-mean"
INPUTS = (MEAN, POSITION_MEAN)


@dataclass(frozen=True)
class HiddenMeans:
    """Mean hidden states of `layers`: `means` (L_sel, d) for `mean`, (L_sel, n, d) for `position-mean` (NaN rows
    at positions no text reached); `texts_at` (n,) the number of texts with a real token at each position
    0..n-1; `n_tokens` the tokens averaged (positions >= 1 for `mean`, all real tokens for `position-mean`)."""

    layers: tuple[int, ...]
    input: str
    means: np.ndarray
    texts_at: np.ndarray
    n_tokens: int

    def layer(self, layer: int) -> np.ndarray:
        """The mean of model layer `layer`: (d,) or (n, d)."""
        return self.means[self.layers.index(layer)]

    def positions_with(self, min_texts: int) -> int:
        """How many leading positions 0..P-1 have at least `min_texts` texts (every later one has fewer)."""
        return int(np.sum(self.texts_at >= min_texts))


class HiddenMeanAccumulator:
    """Running sums of the hidden states entering `layers` (model layer indices, 0-based) over real tokens:
    over positions >= 1 (`input` 'mean') or per position 0..max_length-1 ('position-mean')."""

    needs = ("hidden_states",)
    rank_sums = ("sums", "texts_at")  # added over torchrun ranks (SPEC §19)

    def __init__(self, layers: Sequence[int], input: str, max_length: int, device: str | torch.device = "cpu"):
        import torch

        if input not in INPUTS:
            raise ValueError(f"input must be one of {INPUTS}, got {input!r}")
        self.layers, self.input, self.max_length = tuple(int(x) for x in layers), input, int(max_length)
        self.device = device
        self.sums: torch.Tensor | None = None  # sized by d at the first batch
        self.texts_at = torch.zeros(self.max_length, dtype=torch.float64, device=device)

    def add(self, batch) -> None:
        """Add the chosen layers' hidden states of one batch (a BatchCapture: hidden_states, real)."""
        import torch

        real = batch.real  # (B, m) bool
        m = real.shape[1]
        if m > self.max_length:
            raise ValueError(f"a batch of {m} tokens is longer than max_length {self.max_length}")
        averaged = real.clone()
        if self.input == MEAN:
            averaged[:, 0] = False  # position 0 is left out
        self.texts_at[:m] += real.sum(0, dtype=torch.float64)
        for index, layer in enumerate(self.layers):
            hidden = batch.hidden_states[layer]
            if not bool(torch.isfinite(hidden[real]).all()):
                raise PosprobeError(
                    f"the hidden state entering layer {layer} holds NaN or infinite values on real tokens",
                    "check the checkpoint's weights, or run it in float32 (--device cpu)",
                )
            # selected, not multiplied by a 0/1 weight: padding may hold NaN or inf, and 0 * NaN is NaN
            h = torch.where(averaged[..., None], hidden.to(torch.float64), 0.0)  # (B, m, d)
            if self.sums is None:
                per_position = () if self.input == MEAN else (self.max_length,)
                shape = (len(self.layers), *per_position, h.shape[-1])  # (L_sel, d) or (L_sel, n, d)
                self.sums = torch.zeros(shape, dtype=torch.float64, device=h.device)
            if self.input == MEAN:
                self.sums[index] += h.sum((0, 1))
            else:
                self.sums[index, :m] += h.sum(0)

    def result(self) -> HiddenMeans:
        """The means (`HiddenMeans`); ValueError when no token was averaged."""
        texts_at = self.texts_at.cpu().numpy()
        if self.sums is None:
            raise ValueError("no batch was added")
        sums = self.sums.cpu().numpy()
        if self.input == MEAN:
            n_tokens = int(round(texts_at[1:].sum()))
            if n_tokens == 0:
                raise ValueError("no real token at positions >= 1")
            means = sums / n_tokens
        else:
            n_tokens = int(round(texts_at.sum()))
            with np.errstate(invalid="ignore", divide="ignore"):
                means = sums / texts_at[None, :, None]
            means[:, texts_at == 0] = np.nan
        return HiddenMeans(self.layers, self.input, means, texts_at.astype(np.int64), n_tokens)
