"""Position probes (SPEC §16): per hidden state, a ridge regression of each token's position on its hidden state,
5 folds split by text, the penalty chosen inside the training folds, held-out R² pooled over the folds and the
mean absolute error; the same probe on positions permuted within each text as the control, over `N_CONTROLS`
permutation draws (mean and spread: one draw moves by a few hundredths); and a baseline from features that need no
hidden state (same folds, same fit), the R² any hidden state gets for free from what its position can see
(`baseline_inputs`): in a model that attends both ways, the first-token flag and the text's length; in a causal
model, the first-token flag alone — position i sees tokens 0..i only, so the text's length is hidden from it, and
the one other count it sees, i + 1 tokens so far, is the target itself.

Why sums and not scikit-learn on the tokens: scikit-learn's `Ridge` needs every hidden state in memory (tokens x d
per layer), so memory would grow with the corpus. Every number below is a function of per-fold sufficient statistics
(for fold f and hidden state l: sum z z^T (d, d), sum z (d), sum z y (d, 2), and the token count, sum y and sum y^2,
where z = h - s is the hidden state minus a fixed shift s, the first batch's mean, which keeps the sums well
conditioned), so the probe is exact — the same fits, penalties and held-out errors as scikit-learn's
`Ridge` + `GridSearchCV` on the same folds, up to float64 rounding (checked in tests/test_states_analysis.py) — and its
memory is 5·d² floats per probed layer, whatever the number of texts.

- Folds: text t goes to fold t mod 5 (t its index in the input order); no text is in two folds (as GroupKFold).
- Targets: y = the token's position i (0-based, real tokens, special tokens included); the controls y'_r = pi(i),
  a permutation of 0..len_t-1 drawn per text from (seed, t, draw r) (`control_positions`), r = 0..N_CONTROLS-1.
  A permutation keeps each text's sum and sum of squares of y, so the control differs from the probe only in
  which token carries which target; it can still be predicted where a hidden state knows the text's length (the
  mean of y' over a text is (len_t - 1)/2).
- Fit (scikit-learn's `Ridge(alpha=λ)`, `fit_intercept=True`): w = (Xc^T Xc + λI)^{-1} Xc^T yc with X and y centred
  on the training tokens' means; the intercept is not penalised.
- λ: candidates `ALPHA_GRID` (10^-6 .. 10^2) times tr(C)/d, C the centred Gram matrix of all tokens of that hidden
  state (features only, no target; it makes the grid scale-free: the same relative penalties whatever the scale of
  a layer's activations). For each outer fold f, the candidate with the smallest mean over the 4 inner folds g of
  the MSE on g of the model fitted on the other 3 training folds (ties: the smaller λ) — what
  `GridSearchCV(Ridge(), {"alpha": grid}, cv=<those inner folds>, scoring="neg_mean_squared_error")` picks — then
  refitted on all 4 training folds. Control and probe choose their λ separately.
- Held-out R² = 1 - sum (y - ŷ)^2 / sum (y - ȳ)^2 over every token, ŷ from the model of the fold the token was
  held out of, ȳ the mean over all tokens (`r2_score` of `cross_val_predict`). At most 0 when the hidden states
  carry nothing (a constant hidden state predicts the training mean, which is farther from each held-out fold's
  mean than ȳ is).
- MAE = mean |y - ŷ| over a uniform random sample of at most `sample` tokens (reservoir sampling, Algorithm R,
  seeded; every token when there are fewer), predicted the same way: the held-out predictions need the final
  weights, which only exist after the last batch, and an exact MAE would need every hidden state again. With
  N tokens and a sample of s < N, the MAE is an unbiased estimate of the all-token MAE; with N <= s it is exact.
- Solving: one factorisation per training set gives every penalty and every target at once: on the CPU the
  tridiagonal reduction C = Q S Q^T (w = Q (S + λI)^{-1} Q^T b, each shifted S solved in O(d)), elsewhere the
  eigendecomposition (w = V diag(1/(s + λ)) V^T b); when the sample holds every token and a training set has
  fewer tokens than d, the same fit is solved in its dual form, w = Xc^T (Xc Xc^T + λI)^{-1} yc (an N x N
  eigendecomposition instead of d x d): short runs, where the d x d solves used to dominate, cost little
  (benchmarks/RESULTS.md). The finish runs on one thread (`one_thread`: two threads spin at LAPACK's barriers).

Dimensions: B batch, m its longest sequence, N real tokens of a batch, P probed hidden states, F = 5 folds,
T = 2 targets (position, control), K candidate penalties, d hidden size.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from posprobe.runtime.phases import phase

if TYPE_CHECKING:
    import torch

N_FOLDS = 5
ALPHA_GRID = 10.0 ** np.arange(-6, 3)  # times tr(C)/d
DEFAULT_SAMPLE = 2048
N_CONTROLS = 5  # control permutation draws
BASELINE_FEATURES = ("first_token", "text_length")  # every input a baseline may use, in this order
SINGLE_THREAD_SIZE = 1024  # hidden sizes up to this are fitted on one thread (`one_thread`)


def baseline_inputs(causal: bool) -> tuple[str, ...]:
    """What the no-hidden-state baseline may use: what a token's position can see without a hidden state. Both ways:
    the first-token flag and the text's length. Causal: the flag alone (the length is not visible to position i;
    the count of tokens so far, i + 1, is the position itself: posprobe's positions count every real token,
    special ones included, from 0 at the first, so no count differs from it)."""
    return ("first_token",) if causal else BASELINE_FEATURES


@contextmanager
def one_thread(hidden_size: int) -> Iterator[None]:
    """Within the block, BLAS / LAPACK (numpy's and scipy's OpenBLAS, torch's) and OpenMP use one thread when
    `hidden_size` <= `SINGLE_THREAD_SIZE`. The probe's finish is hundreds of small factorisations (d x d, d <= 1024):
    on two threads, each of LAPACK's d reflector steps ends in a thread barrier, and a thread that waits for a busy
    or preempted partner spins; on a loaded machine one tridiagonal reduction of d = 384 cost 0.16-0.34 s of CPU on
    two threads against 0.006 s on one (issue 49, benchmarks/RESULTS.md §32). The results are the same numbers (the
    same LAPACK routines, one thread)."""
    import scipy.linalg.lapack  # noqa: F401  (loads scipy's own OpenBLAS, so that the limit reaches it)
    import torch
    from threadpoolctl import threadpool_limits

    if hidden_size > SINGLE_THREAD_SIZE:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            yield
    finally:
        torch.set_num_threads(threads)


def control_positions(text_id: int, length: int, seed: int = 0, draw: int = 0) -> np.ndarray:
    """The control targets of one text: a permutation of 0..length-1 drawn from (seed, text_id, draw) alone, so
    that it does not depend on batches or order (draw 0 from (seed, text_id), as before draws existed)."""
    key = [int(seed), int(text_id)] + ([int(draw)] if draw else [])
    return np.random.default_rng(key).permutation(int(length))


BASELINE_WORDS = {"first_token": "first-token flag", "text_length": "text length"}


def baseline_words(inputs: tuple[str, ...] | list[str]) -> str:
    """The baseline's inputs in words, e.g. 'first-token flag + text length'."""
    return " + ".join(BASELINE_WORDS.get(name, name) for name in inputs)


def baseline_features(
    positions: torch.Tensor, lengths: torch.Tensor, inputs: tuple[str, ...] = BASELINE_FEATURES
) -> torch.Tensor:
    """(N, len(inputs)) float64 features of tokens that need no hidden state, in the order of `inputs`:
    `first_token` 1 at a text's first token, `text_length` the text's length."""
    import torch

    columns = {"first_token": lambda: positions == 0, "text_length": lambda: lengths}
    unknown = [name for name in inputs if name not in columns]
    if unknown or not inputs:
        raise ValueError(f"baseline inputs must be among {BASELINE_FEATURES}, got {inputs}")
    return torch.stack([columns[name]().to(torch.float64) for name in inputs], dim=1)


class TokenReservoir:
    """Algorithm R (Vitter 1985): after N tokens are offered, each one is among the `size` kept with probability
    size/N (all when N <= size)."""

    def __init__(self, size: int, seed: int = 0):
        self.size, self.seen = int(size), 0
        self.rng = np.random.default_rng([int(seed), 7919])

    def offer(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Offer the next `count` tokens: (which of them to keep (k,), the slot each goes to (k,)). A slot chosen
        twice in one call keeps the later token, as if the tokens had been offered one at a time."""
        seen = self.seen + np.arange(count)
        slot = np.where(seen < self.size, seen, self.rng.integers(0, seen + 1))
        self.seen += count
        picked = np.nonzero(slot < self.size)[0]
        slots = slot[picked]
        _, last = np.unique(slots[::-1], return_index=True)
        keep = np.sort(len(slots) - 1 - last)
        return picked[keep], slots[keep]


class PositionProbeAccumulator:
    """Per-fold sufficient statistics of the probe and control for the hidden states `layers` (float64, on
    `device`), and a reservoir of `sample` tokens for the MAE."""

    needs = ("hidden_states",)
    # combined over torchrun ranks in `merge_ranks` (SPEC §19): the sums after re-centring, then the samples
    _SUMMED = ("gram", "first", "cross", "count", "ysum", "ysq", "base_gram", "base_first", "base_cross")
    rank_kept = ("shift", *_SUMMED, "sample_x", "sample_y", "sample_fold", "sample_base")

    def __init__(
        self,
        n_states: int,
        layers: list[int],
        hidden_size: int,
        device: str | torch.device = "cpu",
        sample: int = DEFAULT_SAMPLE,
        seed: int = 0,
        controls: int = N_CONTROLS,
        baseline: tuple[str, ...] = BASELINE_FEATURES,
    ):
        import torch

        self.n_states, self.layers, self.seed = int(n_states), [int(x) for x in layers], int(seed)
        self.baseline = tuple(baseline)  # the baseline's inputs (`baseline_inputs`)
        self.controls = int(controls)
        P, F, d, T = len(self.layers), N_FOLDS, int(hidden_size), 1 + self.controls
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=device)  # noqa: E731
        self.shift = None  # (P, d): the first batch's mean hidden state
        self.gram, self.first, self.cross = zeros(P, F, d, d), zeros(P, F, d), zeros(P, F, d, T)
        self.count, self.ysum, self.ysq = zeros(F), zeros(F, T), zeros(F, T)
        B = len(self.baseline)  # the baseline: the same statistics of features that need no hidden state
        self.base_gram, self.base_first, self.base_cross = zeros(F, B, B), zeros(F, B), zeros(F, B, T)
        self.reservoir = TokenReservoir(sample, seed)
        self.sample_x = None  # (sample, P, d) in the hidden states' dtype, allocated on the first batch
        self.sample_y, self.sample_fold = zeros(sample, T), torch.zeros(sample, dtype=torch.int64, device=device)
        self.sample_base = zeros(sample, B)

    @staticmethod
    def nbytes(n_layers: int, hidden_size: int, sample: int = DEFAULT_SAMPLE) -> int:
        d = hidden_size
        return 8 * n_layers * N_FOLDS * (d * d + (2 + N_CONTROLS) * d) + 4 * sample * n_layers * d

    def targets(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(b, i) of the batch's real tokens (row-major), their targets Y (N, 1 + controls): position, then each
        control draw, and their baseline features (N, len(baseline))."""
        import torch

        real = batch.real
        b, i = real.nonzero(as_tuple=True)
        lengths = real.sum(1)
        control = torch.zeros((self.controls, *real.shape), dtype=torch.float64)
        for row, (text, length) in enumerate(zip(batch.text_ids.tolist(), lengths.tolist())):
            for r in range(self.controls):
                drawn = control_positions(text, length, self.seed, r).astype(np.float64)
                control[r, row, :length] = torch.from_numpy(drawn)
        y = torch.cat([i.to(torch.float64)[:, None], control.to(real.device)[:, b, i].T], dim=1)
        return b, i, y, baseline_features(i, lengths[b], self.baseline)

    def add(self, batch) -> None:
        """Add one batch (a BatchCapture: hidden_states, real, text ids)."""
        import torch

        b, i, y, base = self.targets(batch)
        fold = batch.text_ids[b] % N_FOLDS
        # each token's row in its fold's block: the folds side by side as (F, longest, .), zero rows elsewhere,
        # so that one batched product per hidden state gives all five folds' sums
        sizes = torch.bincount(fold, minlength=N_FOLDS)
        order = torch.argsort(fold, stable=True)
        row = torch.empty_like(order)
        row[order] = torch.arange(len(order), device=order.device) - (torch.cumsum(sizes, 0) - sizes)[fold[order]]
        longest = int(sizes.max())
        blocks = y.new_zeros(N_FOLDS, longest, y.shape[1])
        blocks[fold, row] = y
        self.count += sizes
        self.ysum += blocks.sum(1)
        self.ysq += (blocks * blocks).sum(1)
        zb = y.new_zeros(N_FOLDS, longest, base.shape[1])
        zb[fold, row] = base
        self.base_gram += zb.transpose(1, 2) @ zb
        self.base_first += zb.sum(1)
        self.base_cross += zb.transpose(1, 2) @ blocks
        states = [batch.hidden_states[layer][b, i] for layer in self.layers]  # P x (N, d)
        if self.shift is None:
            self.shift = torch.stack([h.to(torch.float64).mean(0) for h in states])
        for p, h in enumerate(states):
            z = y.new_zeros(N_FOLDS, longest, h.shape[1])
            z[fold, row] = h.to(torch.float64) - self.shift[p]
            zt = z.transpose(1, 2)  # (F, d, longest)
            self.gram[p] += zt @ z
            self.first[p] += z.sum(1)
            self.cross[p] += zt @ blocks
        self._sample(states, y, fold, base)

    def _sample(self, states: list[torch.Tensor], y: torch.Tensor, fold: torch.Tensor, base: torch.Tensor) -> None:
        import torch

        picked, slots = self.reservoir.offer(int(y.shape[0]))
        if not len(picked):
            return
        if self.sample_x is None:
            self.sample_x = torch.zeros(
                (self.reservoir.size, len(states), states[0].shape[1]), dtype=states[0].dtype, device=y.device
            )
        picked, slots = torch.from_numpy(picked).to(y.device), torch.from_numpy(slots).to(y.device)
        self.sample_x[slots] = torch.stack([h[picked] for h in states], dim=1)
        self.sample_y[slots] = y[picked]
        self.sample_fold[slots] = fold[picked]
        self.sample_base[slots] = base[picked]

    def merge_ranks(self) -> None:
        """Under torchrun (SPEC §19): re-centre every rank's sums on one shift (that of the lowest rank that saw a
        batch: rank 0's first batch is the first batch of a plain run), add them over the ranks, and merge the
        token samples: every rank's kept tokens when all tokens fit the sample (then the same tokens as one
        process), else a uniform sample of the union (how many from each rank drawn from the multivariate
        hypergeometric law, seeded), so the MAE stays an unbiased estimate."""
        import torch

        from posprobe.runtime.distributed import all_gather, all_gather_or_zeros, all_reduce_sum

        shifts = all_gather_or_zeros(self.shift)
        has = all_gather(torch.tensor([self.shift is not None], dtype=torch.int64, device=self.count.device))
        self.recentre(shifts[next(r for r, flag in enumerate(has) if int(flag))].to(self.gram.device))
        for name in self._SUMMED:
            setattr(self, name, all_reduce_sum(getattr(self, name)))
        self._merge_samples()

    def recentre(self, shift: torch.Tensor) -> None:
        """Express the sums with z = h - `shift` (P, d) instead of the current shift (sums of a rank that saw no
        batch are zeros and stay zeros): with delta = old - new, z' = z + delta, so sum z'z'^T = sum zz^T +
        delta (sum z)^T + (sum z) delta^T + n delta delta^T, sum z' = sum z + n delta, sum z' y^T = sum z y^T +
        delta (sum y)^T."""
        if self.shift is not None:
            delta = self.shift - shift  # (P, d)
            n = self.count[None, :, None]  # (1, F, 1)
            delta_first = delta[:, None, :, None] * self.first[:, :, None, :]  # (P, F, d, d): delta_a first_b
            self.gram += delta_first + delta_first.transpose(-1, -2)
            self.gram += n[..., None] * (delta[:, None, :, None] * delta[:, None, None, :])
            self.cross += delta[:, None, :, None] * self.ysum[None, :, None, :]
            self.first += n * delta[:, None, :]
        self.shift = shift

    def _merge_samples(self) -> None:
        import torch

        from posprobe.runtime.distributed import all_gather, all_gather_or_zeros

        size = self.reservoir.size
        seen = [int(s) for s in all_gather(torch.tensor([self.reservoir.seen], dtype=torch.int64))]
        xs = all_gather_or_zeros(self.sample_x)
        ys, folds, bases = all_gather(self.sample_y), all_gather(self.sample_fold), all_gather(self.sample_base)
        if xs is None:
            return
        total = sum(seen)
        if total <= size:
            take = [np.arange(count) for count in seen]
        else:
            rng = np.random.default_rng([self.seed, 7919, total])
            per_rank = rng.multivariate_hypergeometric(np.array(seen, dtype=np.int64), size)
            take = [np.sort(rng.choice(min(s, size), c, replace=False)) for s, c in zip(seen, per_rank)]
        device = self.sample_y.device
        rows = lambda parts: torch.cat([p.to(device)[torch.from_numpy(t).to(device)] for p, t in zip(parts, take)])  # noqa: E731
        kept = min(total, size)
        self.sample_x = torch.zeros((size, *xs[0].shape[1:]), dtype=xs[0].dtype, device=device)
        self.sample_x[:kept], self.sample_y[:kept], self.sample_fold[:kept] = rows(xs), rows(ys), rows(folds)
        self.sample_base[:kept] = rows(bases)
        self.reservoir.seen = total

    def result(self) -> PositionProbes:
        import torch

        L1, F, T = self.n_states, N_FOLDS, 1 + self.controls
        r2, mae = np.full((L1, T), np.nan), np.full((L1, T), np.nan)
        alpha = np.full((L1, F, T), np.nan)
        kept = min(self.reservoir.seen, self.reservoir.size)
        every_token = kept == int(self.count.sum())  # the sample holds every token: the dual form is available
        sample_y, sample_fold = self.sample_y[:kept], self.sample_fold[:kept]
        with one_thread(int(self.gram.shape[-1])):
            for p, layer in enumerate(self.layers):
                phase(f"fitting the position probes: hidden state {layer} of {L1 - 1} ({p + 1} of {len(self.layers)})")
                stats = FoldStats(self.gram[p], self.first[p], self.cross[p], self.count, self.ysum, self.ysq)
                z = None if not kept else self.sample_x[:kept, p].to(torch.float64) - self.shift[p]
                fit = cross_validated_ridge(stats, tokens=(z, sample_y, sample_fold) if every_token else None)
                r2[layer], alpha[layer] = fit.r2, fit.alpha
                if kept and fit.weights is not None:
                    mae[layer] = _mean_abs_error(fit, z, sample_y, sample_fold)
            phase("fitting the position probes: the baseline (first-token flag and text length)")
            base_stats = FoldStats(self.base_gram, self.base_first, self.base_cross, self.count, self.ysum, self.ysq)
            base = cross_validated_ridge(base_stats)
        base_mae = np.full(T, np.nan)
        if kept and base.weights is not None:
            base_mae = _mean_abs_error(base, self.sample_base[:kept], sample_y, sample_fold)
        control = r2[:, 1:]
        spread = np.std(control, axis=1, ddof=1) if self.controls > 1 else np.full(L1, np.nan)
        return PositionProbes(
            layers=np.array(self.layers, dtype=np.int64),
            r2=r2[:, 0],
            r2_control=control.mean(1),
            mae=mae[:, 0],
            mae_control=mae[:, 1:].mean(1),
            alpha=alpha[..., 0],
            alpha_control=alpha[..., 1],
            n_tokens=int(self.count.sum()),
            n_sample=kept,
            fold_tokens=self.count.cpu().numpy().astype(np.int64),
            seed=self.seed,
            r2_control_std=spread,
            r2_controls=control,
            r2_baseline=float(base.r2[0]),
            r2_baseline_control=float(np.mean(base.r2[1:])),
            mae_baseline=float(base_mae[0]),
            baseline_inputs=self.baseline,
        )


def _mean_abs_error(fit: RidgeFolds, z: torch.Tensor, y: torch.Tensor, fold: torch.Tensor) -> np.ndarray:
    """(T,) mean |y - ŷ| of sampled tokens z (S, d) (shifted), each predicted by its held-out fold's model."""
    import torch

    z = z.to(torch.float64)
    weights = torch.as_tensor(fit.weights, device=z.device)[fold]  # (S, d, T)
    means = torch.as_tensor(fit.means, device=z.device)[fold]  # (S, d)
    ybar = torch.as_tensor(fit.ybar, device=z.device)[fold]  # (S, T)
    predicted = torch.einsum("sd,sdt->st", z - means, weights) + ybar
    return (y - predicted).abs().mean(0).cpu().numpy()


@dataclass(frozen=True)
class FoldStats:
    """Sufficient statistics per fold (torch float64): gram (F, d, d) = sum z z^T, first (F, d) = sum z,
    cross (F, d, T) = sum z y^T, count (F,), ysum (F, T) = sum y, ysq (F, T) = sum y^2."""

    gram: torch.Tensor
    first: torch.Tensor
    cross: torch.Tensor
    count: torch.Tensor
    ysum: torch.Tensor
    ysq: torch.Tensor

    def pooled(self, folds: list[int]) -> tuple:
        """(gram, first, cross, count, ysum, ysq) summed over `folds`."""
        return tuple(x[folds].sum(0) for x in (self.gram, self.first, self.cross, self.count, self.ysum, self.ysq))

    def fold(self, f: int) -> tuple:
        return tuple(x[f] for x in (self.gram, self.first, self.cross, self.count, self.ysum, self.ysq))


@dataclass(frozen=True)
class RidgeFolds:
    """The cross-validated probe of one hidden state, per target T: r2 (T,), sse (T,) held-out sum of squares,
    tss (T,), alpha (F, T) the penalty each outer fold chose; weights (F, d, T), means (F, d) (training mean of
    z), ybar (F, T) (training mean of y): fold f predicts ŷ = (z - means[f]) · weights[f] + ybar[f]
    (None when a fold is empty)."""

    r2: np.ndarray
    sse: np.ndarray
    tss: np.ndarray
    alpha: np.ndarray
    weights: np.ndarray | None
    means: np.ndarray | None
    ybar: np.ndarray | None


def _centred(gram, first, cross, count, ysum):
    """Training means and centred statistics: (mu (d,), ybar (T,), C = Xc^T Xc (d, d), b = Xc^T yc (d, T))."""
    import torch

    mu, ybar = first / count, ysum / count
    return mu, ybar, gram - count * torch.outer(mu, mu), cross - torch.outer(first, ybar)


def ridge_solve(C: torch.Tensor, b: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
    """w_k = (C + alphas[k] I)^{-1} b for every penalty: C (d, d) symmetric positive semi-definite, b (d, T),
    alphas (K,) > 0 -> (K, d, T). On the CPU in float64 one tridiagonal reduction C = Q S Q^T (`_tridiagonal_solve`)
    serves every penalty and target; elsewhere, or where a shifted S is not positive definite, one
    eigendecomposition C = V diag(s) V^T (eigenvalues that round-off left below 0 set to 0). The two agree to
    round-off (tested)."""
    import torch

    if C.device.type == "cpu" and C.dtype == b.dtype == alphas.dtype == torch.float64:
        solved = _tridiagonal_solve(C, b, alphas)
        if solved is not None:
            return solved
    return eigen_ridge_solve(C, b, alphas)


def eigen_ridge_solve(C: torch.Tensor, b: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
    """`ridge_solve` through one eigendecomposition C = V diag(s) V^T: w_k = V diag(1 / (s + alphas[k])) V^T b."""
    import torch

    values, vectors = torch.linalg.eigh(C)
    projected = vectors.T @ b  # (d, T)
    scaled = projected[None] / (values.clamp(min=0)[None, :, None] + alphas[:, None, None])  # (K, d, T)
    return torch.matmul(vectors, scaled)


def _tridiagonal_solve(C: torch.Tensor, b: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor | None:
    """`ridge_solve` through LAPACK's tridiagonal reduction C = Q S Q^T (dsytrd, Q orthogonal, S symmetric
    tridiagonal): w_k = Q (S + alphas[k] I)^{-1} Q^T b, each shifted S solved in O(d) (dptsv). Q is applied from
    its Householder reflectors, never formed: 0.026 s instead of an eigendecomposition's 0.063 s (which also
    computes the eigenvectors) for d = 576 on one thread (issue 31: the probe's finish of `states` was its largest
    cost). None where a shifted S is not positive definite (round-off below a tiny penalty): the caller then clamps
    eigenvalues instead."""
    import torch
    from scipy.linalg import lapack

    d, K, T = C.shape[0], alphas.shape[0], b.shape[1]
    if d < 2:
        return None
    packed, diagonal, off, tau, info = lapack.dsytrd(np.asfortranarray(C.numpy()), lower=1)
    if info != 0:
        return None
    # reflector i (i < d-1) acts on rows i+1.., its vector stored below the sub-diagonal of column i: the layout
    # of a QR factorisation (geqrf) of packed[1:, :d-1], so torch.ormqr applies Q = diag(1, Q') blocked
    reflectors, tau = torch.from_numpy(np.tril(packed[1:, : d - 1], -1)), torch.from_numpy(tau[: d - 1])
    rotated = b.clone()
    rotated[1:] = torch.ormqr(reflectors, tau, b[1:].contiguous(), left=True, transpose=True)
    rhs = rotated.numpy()
    solved = np.empty((d, K, T))
    for k, alpha in enumerate(alphas.tolist()):
        *_, x, info = lapack.dptsv(diagonal + alpha, off, rhs)
        if info != 0:
            return None
        solved[:, k] = x
    W = torch.from_numpy(solved.reshape(d, K * T))
    W[1:] = torch.ormqr(reflectors, tau, W[1:].contiguous(), left=True, transpose=False)
    return W.reshape(d, K, T).permute(1, 0, 2).contiguous()


def dual_ridge_solve(Zc: torch.Tensor, yc: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
    """The same solutions as `ridge_solve(Zc^T Zc, Zc^T yc, alphas)` from the centred training tokens Zc (N, d)
    and targets yc (N, T): w_k = Zc^T (Zc Zc^T + alphas[k] I)^{-1} yc -> (K, d, T); an N x N eigendecomposition,
    cheaper when N < d."""
    import torch

    values, vectors = torch.linalg.eigh(Zc @ Zc.T)
    projected = vectors.T @ yc  # (N, T)
    scaled = projected[None] / (values.clamp(min=0)[None, :, None] + alphas[:, None, None])  # (K, N, T)
    return torch.matmul(Zc.T, torch.matmul(vectors, scaled))


def held_out_sse(W: torch.Tensor, mu, ybar, held: tuple) -> torch.Tensor:
    """sum over the held-out tokens of (y - ŷ)^2, ŷ = (z - mu) · W[k, :, t] + ybar[t], from the held-out fold's
    statistics `held` (gram, first, cross, count, ysum, ysq): W (K, d, T) -> (K, T)."""
    import torch

    gram, first, cross, count, ysum, ysq = held
    yy = ysq - 2 * ybar * ysum + count * ybar**2  # (T,) sum (y - ybar)^2
    c = cross - torch.outer(mu, ysum) - torch.outer(first, ybar) + count * torch.outer(mu, ybar)  # sum (z-mu)(y-ybar)
    cw = torch.einsum("dt,kdt->kt", c, W)
    aw, mw = torch.einsum("d,kdt->kt", first, W), torch.einsum("d,kdt->kt", mu, W)
    quad = torch.einsum("kdt,de,ket->kt", W, gram, W) - 2 * aw * mw + count * mw**2  # w^T sum (z-mu)(z-mu)^T w
    return yy - 2 * cw + quad


def cross_validated_ridge(stats: FoldStats, grid: np.ndarray = ALPHA_GRID, tokens: tuple | None = None) -> RidgeFolds:
    """The nested cross-validated ridge probe (see the module docstring) from per-fold statistics. `tokens`:
    (z (N, d) the tokens as shifted in the statistics, y (N, T), fold (N,)) when every token is at hand, so that
    training sets with fewer tokens than d are solved in the dual form (the same fits)."""
    import torch

    F, T = stats.count.shape[0], stats.ysum.shape[1]
    nan = np.full(T, np.nan)
    if bool((stats.count == 0).any()):  # fewer texts than folds
        return RidgeFolds(nan, nan, nan, np.full((F, T), np.nan), None, None, None)
    everything = stats.pooled(list(range(F)))
    _, _, C_all, _ = _centred(*everything[:5])
    d = C_all.shape[0]
    scale = float(torch.trace(C_all)) / d
    alphas = torch.as_tensor(grid, dtype=torch.float64, device=C_all.device) * max(scale, 0.0)

    def fit(folds: list[int]):
        """(mu, ybar, W (K, d, T)) of the fit on `folds`, every penalty and target."""
        mu, ybar, C, b = _centred(*stats.pooled(folds)[:5])
        if scale <= 0:  # every hidden state is the same: the model predicts the training mean
            return mu, ybar, torch.zeros(len(alphas), d, T, dtype=C.dtype, device=C.device)
        if tokens is not None:
            z, y, fold = tokens
            inside = torch.isin(fold, torch.as_tensor(folds, device=fold.device))
            if int(inside.sum()) < d:
                return mu, ybar, dual_ridge_solve(z[inside] - mu, y[inside] - ybar, alphas)
        return mu, ybar, ridge_solve(C, b, alphas)

    inner_mse = torch.zeros(F, len(grid), T, dtype=torch.float64, device=C_all.device)
    for f in range(F):
        for g in range(f + 1, F):  # the fit without folds f and g serves outer f (held g) and outer g (held f)
            mu, ybar, W = fit([h for h in range(F) if h not in (f, g)])
            inner_mse[f] += held_out_sse(W, mu, ybar, stats.fold(g)) / stats.count[g]
            inner_mse[g] += held_out_sse(W, mu, ybar, stats.fold(f)) / stats.count[f]
    best = torch.argmin(inner_mse, dim=1)  # (F, T): the first of equal minima
    sse = np.zeros(T)
    weights, means, ybars, alpha = np.zeros((F, d, T)), np.zeros((F, d)), np.zeros((F, T)), np.zeros((F, T))
    targets = torch.arange(T, device=best.device)
    for f in range(F):
        mu, ybar, W = fit([h for h in range(F) if h != f])
        W = W[best[f], :, targets].T[None]  # (1, d, T): target t with its own chosen penalty
        sse += held_out_sse(W, mu, ybar, stats.fold(f))[0].cpu().numpy()
        weights[f], means[f], ybars[f] = W[0].cpu().numpy(), mu.cpu().numpy(), ybar.cpu().numpy()
        alpha[f] = alphas[best[f]].cpu().numpy()
    tss = (everything[5] - everything[4] ** 2 / everything[3]).cpu().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.where(tss > 0, 1.0 - sse / tss, np.nan)
    return RidgeFolds(r2, sse, tss, alpha, weights, means, ybars)


@dataclass(frozen=True)
class PositionProbes:
    """Per hidden state (arrays (L+1,), NaN where not probed): r2, r2_control (held-out R², pooled), mae,
    mae_control (mean absolute error in positions, over the sample); alpha, alpha_control (L+1, F): the penalty
    each outer fold chose. layers: the probed hidden states; n_tokens: tokens in the probe; n_sample: tokens the
    MAE is over (all of them when n_sample == n_tokens); fold_tokens (F,): tokens per fold; seed: the control
    permutations' and the sample's seed. The control is over `N_CONTROLS` permutation draws: r2_control and
    mae_control are their means, r2_control_std (L+1,) their standard deviation, r2_controls (L+1, draws) each;
    alpha_control is draw 0's. The baseline (no hidden state, same folds; its inputs `baseline_inputs`, see
    `baseline_inputs()`): r2_baseline (position), r2_baseline_control (mean over the control draws), mae_baseline."""

    layers: np.ndarray
    r2: np.ndarray
    r2_control: np.ndarray
    mae: np.ndarray
    mae_control: np.ndarray
    alpha: np.ndarray
    alpha_control: np.ndarray
    n_tokens: int
    n_sample: int
    fold_tokens: np.ndarray
    seed: int
    r2_control_std: np.ndarray | None = None
    r2_controls: np.ndarray | None = None
    r2_baseline: float = float("nan")
    r2_baseline_control: float = float("nan")
    mae_baseline: float = float("nan")
    baseline_inputs: tuple[str, ...] = BASELINE_FEATURES
