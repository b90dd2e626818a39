"""Rotary frequency bands (SPEC §15): how much of a head's query and key norm lives in each rotary frequency pair.

A rotary head rotates pairs of dims (a_f, b_f), f = 0..r/2-1, by the angle i * theta_f at position i (r <= d_h
rotated dims; partial rotary leaves dims r..d_h-1 as they are). As transformers writes it (`rotate_half`), pair f
is (f, f + r/2); families that interleave pairs (2f, 2f + 1) give a permutation of the head's dims that turns their
pairs into rotate_half pairs (`order`). Rotation keeps each pair's norm, so the pre-rotation query (after q-norm)
gives the band norms |q_f| = ||(q_{a_f}, q_{b_f})||, and the rotated part of q . k splits exactly into per-band
terms |q_f||k_f| cos(angle_f + (j - i) theta_f), angle_f the angle from q's pair to k's pair (query i, key j).

Pure numpy, and one capture reducer (`BandNormAccumulator`) that averages band norms over real tokens.
Dimensions: H query heads, H_kv key heads, T tokens, r rotated dims, F = r/2 bands, K offsets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def band_pairs(rotated: int, order: np.ndarray | None = None) -> np.ndarray:
    """(F, 2) int: the head dims (a_f, b_f) of each band f. rotate_half: (f, f + r/2); `order` (d_h,) a permutation
    of the head's dims that turns the family's pairs into rotate_half pairs (interleaved: (2f, 2f + 1))."""
    if rotated < 2 or rotated % 2:
        raise ValueError(f"rotary dims must be a positive even number, got {rotated}")
    half = rotated // 2
    pairs = np.stack([np.arange(half), np.arange(half) + half], axis=1)
    return pairs if order is None else np.asarray(order)[pairs]


def band_norms(x: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Band norms (..., F) of vectors x (..., d_h): sqrt(x_a^2 + x_b^2) of each pair."""
    return np.hypot(x[..., pairs[:, 0]], x[..., pairs[:, 1]])


def unrotated_norm(x: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Norm (...) of the dims of x (..., d_h) outside every band (partial rotary: dims the rotation leaves alone)."""
    outside = np.setdiff1d(np.arange(x.shape[-1]), pairs.ravel())
    return np.linalg.norm(x[..., outside], axis=-1)


def frequencies_from_angles(cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, float]:
    """(theta (F,), scale) from a rotary module's (cos, sin), each (n >= 2, r) in rotate_half order: theta_f the
    angle per position of band f (rad per token, in [0, pi]), read at position 1; `scale` the factor the module
    multiplies cos and sin by (yarn / longrope attention scaling; 1 otherwise), read at position 0."""
    if cos.shape[0] < 2:
        raise ValueError("angles of at least 2 positions are needed")
    half = cos.shape[1] // 2
    scale = float(np.hypot(cos[0, 0], sin[0, 0]))
    return np.abs(np.arctan2(sin[1, :half], cos[1, :half])), scale


def wavelengths(theta: np.ndarray) -> np.ndarray:
    """Wavelength 2 pi / theta_f in tokens (inf for a band that does not rotate)."""
    with np.errstate(divide="ignore"):
        return np.where(theta > 0, 2 * np.pi / np.where(theta > 0, theta, 1.0), np.inf)


def band_terms(q: np.ndarray, k: np.ndarray, pairs: np.ndarray, theta: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-band terms |q_f||k_f| cos(angle_f + k theta_f) (..., F, K) of the rotated part of q . k at offsets k = j - i
    (SPEC §15), q and k (..., d_h) before rotation: their sum over f is (R_i q) . (R_j k) less the unrotated dims'
    q . k, for unit-scale angles i theta_f (multiply by the module's scale squared otherwise)."""
    qa, qb = q[..., pairs[:, 0]], q[..., pairs[:, 1]]
    ka, kb = k[..., pairs[:, 0]], k[..., pairs[:, 1]]
    angle = np.arctan2(kb, ka) - np.arctan2(qb, qa)  # from q's pair to k's pair
    size = np.hypot(qa, qb) * np.hypot(ka, kb)
    return size[..., None] * np.cos(angle[..., None] + theta[:, None] * np.asarray(offsets)[None, :])


def long_band_share(norms: np.ndarray, lengths: np.ndarray, context: float) -> np.ndarray:
    """Share (...) of the summed band norms `norms` (..., F) that lies in bands whose wavelength `lengths` (F,)
    exceeds `context` tokens (bands that turn less than once over the context)."""
    total = norms.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, norms[..., lengths > context].sum(-1) / np.where(total > 0, total, 1.0), np.nan)


class BandNormAccumulator:
    """Running sums over real tokens of the band norms of every chosen layer's queries and keys (a capture reducer).

    `project(hidden, layer)` maps hidden states (T, d) entering model layer `layer` to (q (H, T, d_h), k (H_kv, T,
    d_h)) before rotation (the model reader's norm, projections, biases and q/k norms); `pairs` (F, 2) the bands;
    `key_layers` {layer: the layer whose keys it reuses} where that is another (Gemma 4): `project` then also
    gets that layer's hidden states as `key_hidden`."""

    needs = ("hidden_states",)
    rank_sums = ("q", "k", "q_rest", "k_rest", "tokens")  # added over torchrun ranks (SPEC §19)
    rank_kept = ("pairs",)  # a setting, the same on every rank

    def __init__(self, layers: Sequence[int], project: Callable, pairs: np.ndarray, key_layers: dict | None = None):
        self.layers, self.project, self.pairs = tuple(int(x) for x in layers), project, np.asarray(pairs)
        self.key_layers = {int(a): int(b) for a, b in (key_layers or {}).items() if int(a) != int(b)}
        self.q = self.k = self.q_rest = self.k_rest = None  # sums, sized at the first batch
        self.tokens = 0

    def add(self, batch) -> None:
        """Add the real tokens of one batch (a BatchCapture: hidden_states, real)."""
        real = batch.real
        count = int(real.sum())
        if count == 0:
            return
        sums = []
        for layer in self.layers:
            hidden = batch.hidden_states[layer][real].double().cpu().numpy()  # (T, d)
            source = self.key_layers.get(layer)
            if source is None:
                q, k = self.project(hidden, layer)
            else:  # its keys: those the source layer computes of the hidden states entering it
                q, k = self.project(hidden, layer, key_hidden=batch.hidden_states[source][real].double().cpu().numpy())
            sums.append((band_norms(q, self.pairs).sum(1), band_norms(k, self.pairs).sum(1),
                         unrotated_norm(q, self.pairs).sum(1), unrotated_norm(k, self.pairs).sum(1)))  # fmt: skip
        q, k, q_rest, k_rest = (np.stack(part) for part in zip(*sums))
        if self.q is None:
            self.q, self.k, self.q_rest, self.k_rest = q, k, q_rest, k_rest
        else:
            self.q, self.k = self.q + q, self.k + k
            self.q_rest, self.k_rest = self.q_rest + q_rest, self.k_rest + k_rest
        self.tokens += count

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """Mean band norms q (L_sel, H, F), k (L_sel, H_kv, F), mean unrotated norms (L_sel, H), (L_sel, H_kv), and
        the number of tokens averaged."""
        if self.tokens == 0:
            raise ValueError("no real token was added")
        t = self.tokens
        return self.q / t, self.k / t, self.q_rest / t, self.k_rest / t, t
