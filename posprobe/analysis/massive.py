"""Massive activations (SPEC §16, Sun et al. 2024): per hidden state, the largest |activation| over real tokens,
where it sits, its ratio to the layer's median |activation|, and which tokens hold the largest ones.

Pure computation: a capture reducer (`MassiveActivationAccumulator`), tensors in, arrays out. Dimensions: B batch,
m its longest sequence, L+1 hidden states, d hidden size, K tokens kept in the top list.

The median over all B·m·d values of a corpus cannot be kept exactly in bounded memory, so it is read off a
histogram of log2|h| with `BINS_PER_OCTAVE` = 256 bins per factor of two (exact zeros counted apart) over the whole
float range, 2^-160 .. 2^130. The order statistics the median is made of are located exactly (their bins); each is
estimated by its bin's geometric midpoint, so the median has a relative error of at most
2^(1/512) - 1 = 0.135% (`MEDIAN_RELATIVE_ERROR`; an exact zero is exact). log2 is taken in float64, so only
values within float64 rounding of a bin edge can fall on the wrong side of it.

Top tokens: each real token's largest |activation| over channels; the K largest tokens per layer with their text,
position, channel, token id and special-token flag (ties go to the token seen first).
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from posprobe.errors import PosprobeError

if TYPE_CHECKING:
    import torch

BINS_PER_OCTAVE = 256
LOWEST_OCTAVE, HIGHEST_OCTAVE = -160, 130  # float32, float16 and bfloat16 values (denormals included) all fit
N_BINS = (HIGHEST_OCTAVE - LOWEST_OCTAVE) * BINS_PER_OCTAVE + 1  # bin 0: exact zeros
MEDIAN_RELATIVE_ERROR = 2.0 ** (1.0 / (2 * BINS_PER_OCTAVE)) - 1.0
TOP_TOKENS = 10


def log_bins(values: torch.Tensor) -> torch.Tensor:
    """The histogram bin (int64) of each |value|: 0 for an exact zero, else 1 + floor((log2|v| - LOWEST_OCTAVE)
    * BINS_PER_OCTAVE), clamped into 1..N_BINS-1 (values outside the float range land in the edge bins)."""
    import torch

    a = values.abs().to(torch.float64)
    index = torch.floor((torch.log2(a) - LOWEST_OCTAVE) * BINS_PER_OCTAVE).clamp(0, N_BINS - 2).to(torch.int64) + 1
    return torch.where(a == 0, 0, index)


def bin_value(index: np.ndarray | int) -> np.ndarray | float:
    """The value a bin stands for: 0 for bin 0, else its geometric midpoint."""
    index = np.asarray(index)
    value = 2.0 ** (LOWEST_OCTAVE + (index - 1 + 0.5) / BINS_PER_OCTAVE)
    out = np.where(index == 0, 0.0, value)
    return float(out) if out.ndim == 0 else out


def histogram_median(counts: np.ndarray) -> float:
    """The median of the values a histogram (N_BINS,) counts (NaN if empty): the mean of the order statistics
    (N-1)//2 and N//2 (0-based), each estimated by its bin's value (relative error <= MEDIAN_RELATIVE_ERROR)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return math.nan
    cumulative = np.cumsum(counts)
    low, high = np.searchsorted(cumulative, [(total - 1) // 2 + 1, total // 2 + 1])
    return 0.5 * (bin_value(int(low)) + bin_value(int(high)))


class MassiveActivationAccumulator:
    """Per hidden state: the running maximum of |h| over real tokens (and where), the top-K tokens, and the
    log2-histogram of every |h| (on `device`)."""

    needs = ("hidden_states",)
    rank_sums = ("histogram", "seen")  # added over torchrun ranks (SPEC §19); the top-K in `merge_ranks`
    rank_kept = ("top_value", "top_index")

    def __init__(self, n_states: int, device: str | torch.device = "cpu", top: int = TOP_TOKENS):
        import torch

        self.n_states, self.top = int(n_states), int(top)
        self.device = device
        self.histogram = torch.zeros(self.n_states, N_BINS, dtype=torch.int64, device=device)
        # top-K tokens per layer, columns: |h| max, text, position, channel, token id, special, order seen
        self.top_value = torch.full((self.n_states, 0), -1.0, dtype=torch.float64, device=device)
        self.top_index = torch.zeros((self.n_states, 0, 6), dtype=torch.int64, device=device)
        self.seen = 0

    @staticmethod
    def nbytes(n_states: int) -> int:
        return 8 * n_states * N_BINS

    def add(self, batch) -> None:
        """Add one batch (a BatchCapture: hidden_states, real, special, text ids, input ids, positions)."""
        import torch

        real = batch.real  # (B, m)
        b, i = real.nonzero(as_tuple=True)  # real tokens, row-major (text order within the batch)
        # order seen: (batch number, row-major place in the batch), the same under torchrun as in one process
        order = (batch.index << 32) + torch.arange(b.numel(), device=real.device)
        self.seen += b.numel()
        info = torch.stack(
            [batch.text_ids[b], i, i, batch.input_ids[b, i], batch.special[b, i].long(), order], dim=1
        )  # (N, 6); column 2 (channel) filled per layer
        values, indices = [], []
        for layer, hidden in enumerate(batch.hidden_states):
            h = hidden[b, i]  # (N, d)
            peak, channel = h.abs().max(dim=-1)  # (N,); NaN propagates through max
            if not bool(torch.isfinite(peak).all()):
                raise PosprobeError(
                    f"hidden state {layer} holds NaN or infinite values on real tokens",
                    "check the checkpoint's weights, or run it in float32 (--device cpu)",
                )
            self.histogram[layer] += torch.bincount(log_bins(h).flatten(), minlength=N_BINS)
            layer_info = info.clone()
            layer_info[:, 2] = channel
            values.append(peak.to(torch.float64))
            indices.append(layer_info)
        self._merge(torch.stack(values), torch.stack(indices))

    def _merge(self, values: torch.Tensor, indices: torch.Tensor) -> None:
        """Keep the K largest of the kept and the new tokens per layer (ties: the token seen first)."""
        import torch

        values = torch.cat([self.top_value, values], dim=1)
        indices = torch.cat([self.top_index, indices], dim=1)
        # sort by value descending, then by order seen ascending (stable sort on the order first)
        by_order = torch.argsort(indices[..., 5], dim=1, stable=True)
        values, indices = values.gather(1, by_order), indices.gather(1, by_order[..., None].expand_as(indices))
        by_value = torch.argsort(values, dim=1, descending=True, stable=True)[:, : self.top]
        self.top_value = values.gather(1, by_value)
        self.top_index = indices.gather(1, by_value[..., None].expand(-1, -1, indices.shape[-1]))

    def merge_ranks(self) -> None:
        """Under torchrun (SPEC §19): keep the K largest of every rank's top-K (ties: the token seen first, by
        batch number, as in one process)."""
        import torch

        from posprobe.runtime.distributed import all_gather

        kept = self.top_value.shape[1]  # the same for every hidden state
        values = torch.full((self.n_states, self.top), -1.0, dtype=torch.float64, device=self.top_value.device)
        index = torch.zeros((self.n_states, self.top, 6), dtype=torch.int64, device=self.top_index.device)
        values[:, :kept], index[:, :kept] = self.top_value, self.top_index
        every_value, every_index = all_gather(values), all_gather(index)
        values, index = torch.cat(every_value, dim=1), torch.cat(every_index, dim=1)
        real = values[0] >= 0  # |h| >= 0; -1 marks the padding of a rank that kept fewer than K
        self.top_value, self.top_index = self.top_value[:, :0], self.top_index[:, :0]
        self._merge(values[:, real], index[:, real])

    def result(self) -> MassiveActivations:
        histogram = self.histogram.cpu().numpy()
        medians = np.array([histogram_median(row) for row in histogram])
        top_value = self.top_value.cpu().numpy()
        top = self.top_index.cpu().numpy()
        peak = top_value[:, 0] if top_value.shape[1] else np.full(self.n_states, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(medians > 0, peak / medians, np.nan)
        return MassiveActivations(
            max=peak,
            text=top[:, 0, 0] if top.shape[1] else np.full(self.n_states, -1),
            position=top[:, 0, 1] if top.shape[1] else np.full(self.n_states, -1),
            channel=top[:, 0, 2] if top.shape[1] else np.full(self.n_states, -1),
            median=medians,
            ratio=ratio,
            top_value=top_value,
            top_text=top[..., 0],
            top_position=top[..., 1],
            top_channel=top[..., 2],
            top_token=top[..., 3],
            top_special=top[..., 4].astype(bool),
            n_values=histogram.sum(axis=1),
        )


@dataclass(frozen=True)
class MassiveActivations:
    """Per hidden state l (arrays (L+1,)): max = the largest |h_l(t, i)_c| over real tokens, with its text,
    position and channel; median = the median |h_l| over every real token and channel (relative error <=
    MEDIAN_RELATIVE_ERROR); ratio = max / median (NaN if the median is 0); n_values = values counted.
    Top tokens (L+1, K), by their largest |activation| over channels: top_value, top_text, top_position,
    top_channel, top_token (token id), top_special (a special token: BOS, [CLS], [SEP], ...)."""

    max: np.ndarray
    text: np.ndarray
    position: np.ndarray
    channel: np.ndarray
    median: np.ndarray
    ratio: np.ndarray
    top_value: np.ndarray
    top_text: np.ndarray
    top_position: np.ndarray
    top_channel: np.ndarray
    top_token: np.ndarray
    top_special: np.ndarray
    n_values: np.ndarray

    def shares(self, delimiter: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Share of each layer's top tokens that are the first token (position 0), special tokens and, given
        `delimiter` (L+1, K) flags, delimiters: {"first": (L+1,), "special": ..., "delimiter": ...}."""
        out = {"first": (self.top_position == 0).mean(axis=1), "special": self.top_special.mean(axis=1)}
        if delimiter is not None:
            out["delimiter"] = np.asarray(delimiter, dtype=bool).mean(axis=1)
        return out


def is_delimiter(token: str) -> bool:
    """A token that is only punctuation or white space once a tokenizer's word markers are removed (GPT-2's 'Ġ'
    and 'Ċ', SentencePiece's '▁', WordPiece's '##'): '.', ',', '\\n', ' ;', ... An empty token is not one."""
    text = token.replace("##", "").replace("Ġ", " ").replace("Ċ", "\n").replace("▁", " ")
    return bool(text) and all(c.isspace() or unicodedata.category(c).startswith("P") for c in text)
