"""The hidden-state reducers of `posprobe states` (SPEC §16) against independent computations: the position probe
against scikit-learn's Ridge + GridSearchCV on the same folds (sufficient statistics and a padded capture), known
answers (hidden states built to carry position linearly: R² = 1; built to carry none: R² <= 0), positional vectors
and massive activations against each text run alone through `output_hidden_states`, and the median's stated bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge
from sklearn.metrics import mean_absolute_error, r2_score
from sklearn.model_selection import GridSearchCV, PredefinedSplit
from test_attention import tiny_model

from posprobe.analysis.massive import (
    MEDIAN_RELATIVE_ERROR,
    N_BINS,
    MassiveActivationAccumulator,
    histogram_median,
    is_delimiter,
    log_bins,
)
from posprobe.analysis.position_probe import (
    ALPHA_GRID,
    N_FOLDS,
    FoldStats,
    PositionProbeAccumulator,
    TokenReservoir,
    control_positions,
    cross_validated_ridge,
    one_thread,
    ridge_solve,
)
from posprobe.analysis.positional_vectors import PositionalVectorAccumulator
from posprobe.capture import capture


# -- references -------------------------------------------------------------------------------------------------
def sklearn_probe(X: np.ndarray, y: np.ndarray, texts: np.ndarray):
    """Held-out predictions of the nested cross-validated ridge with scikit-learn: folds text mod 5, penalties
    ALPHA_GRID * tr(C)/d, chosen per outer fold by GridSearchCV over the 4 inner folds. (pred, chosen alphas)."""
    fold = texts % N_FOLDS
    centred = X - X.mean(0)
    alphas = ALPHA_GRID * (centred**2).sum() / X.shape[1]
    pred, chosen = np.empty_like(y), []
    for f in range(N_FOLDS):
        train = fold != f
        search = GridSearchCV(
            Ridge(), {"alpha": alphas}, cv=PredefinedSplit(fold[train]), scoring="neg_mean_squared_error"
        ).fit(X[train], y[train])
        pred[~train] = search.predict(X[~train])
        chosen.append(search.best_params_["alpha"])
    return pred, np.array(chosen)


def fold_stats(X: np.ndarray, Y: np.ndarray, texts: np.ndarray) -> FoldStats:
    fold = texts % N_FOLDS
    parts = [(X[fold == f], Y[fold == f]) for f in range(N_FOLDS)]
    arrays = (
        [x.T @ x for x, _ in parts],
        [x.sum(0) for x, _ in parts],
        [x.T @ y for x, y in parts],
        [float(len(x)) for x, _ in parts],
        [y.sum(0) for _, y in parts],
        [(y**2).sum(0) for _, y in parts],
    )
    return FoldStats(*(torch.tensor(np.array(a)) for a in arrays))


def alone(model, texts: list[list[int]]) -> list[list[np.ndarray]]:
    """Per text, per hidden state: (len, d) from `output_hidden_states` with the text run alone, unpadded."""
    out = []
    with torch.no_grad():
        for ids in texts:
            hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
            out.append([h[0].double().numpy() for h in hidden])
    return out


def random_texts(count: int, seed: int, low: int = 2, high: int = 12) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, 99, size=int(rng.integers(low, high))).tolist() for _ in range(count)]


# -- the probe: sufficient statistics against scikit-learn -------------------------------------------------------
def test_ridge_from_fold_statistics_equals_sklearn():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 15, size=40)
    texts = np.repeat(np.arange(40), lengths)
    y = np.concatenate([np.arange(n) for n in lengths]).astype(float)
    u = rng.normal(size=8)
    X = np.sin(y / 3.0)[:, None] * u + 0.3 * y[:, None] * np.eye(8)[0] + rng.normal(size=(len(y), 8))
    control = np.concatenate([control_positions(t, n, 3) for t, n in enumerate(lengths)]).astype(float)
    fit = cross_validated_ridge(fold_stats(X, np.stack([y, control], 1), texts))
    for t, target in enumerate((y, control)):
        pred, chosen = sklearn_probe(X, target, texts)
        assert fit.r2[t] == pytest.approx(r2_score(target, pred), abs=1e-10)
        np.testing.assert_allclose(fit.alpha[:, t], chosen, rtol=1e-12)
        fold = texts % N_FOLDS
        mine = np.empty_like(target)
        for f in range(N_FOLDS):
            at = fold == f
            mine[at] = (X[at] - fit.means[f]) @ fit.weights[f][:, t] + fit.ybar[f][t]
        np.testing.assert_allclose(mine, pred, atol=1e-9)
    assert fit.r2[0] > 0.3 and fit.r2[1] < fit.r2[0]
    assert len(set(fit.alpha[:, 0])) > 1  # the penalty really is chosen per outer fold here


@pytest.mark.slow
def test_probe_streamed_through_a_padded_capture_equals_sklearn_on_each_text_alone():
    """GPT-2 (causal) in padded batches of 4; the first and last hidden states; MAE exact (the sample holds every
    token)."""
    model = tiny_model("gpt2")
    texts = random_texts(23, seed=3)
    acc = PositionProbeAccumulator(3, [0, 2], 32, sample=10_000, seed=5, controls=1)  # one draw: means = draw 0
    capture(model, [acc], input_ids=texts, max_length=16, batch_size=4)
    probes = acc.result()
    ids = np.concatenate([[t] * len(x) for t, x in enumerate(texts)])
    y = np.concatenate([np.arange(len(x)) for x in texts]).astype(float)
    control = np.concatenate([control_positions(t, len(x), 5) for t, x in enumerate(texts)]).astype(float)
    states = alone(model, texts)
    assert probes.n_tokens == probes.n_sample == len(y) and probes.fold_tokens.sum() == len(y)
    assert np.isnan(probes.r2[1])
    for layer in (0, 2):
        X = np.concatenate([s[layer] for s in states])
        for target, r2, mae, alpha in (
            (y, probes.r2, probes.mae, probes.alpha),
            (control, probes.r2_control, probes.mae_control, probes.alpha_control),
        ):
            pred, chosen = sklearn_probe(X, target, ids)
            assert r2[layer] == pytest.approx(r2_score(target, pred), abs=1e-5)
            assert mae[layer] == pytest.approx(mean_absolute_error(target, pred), abs=1e-4)
            np.testing.assert_allclose(alpha[layer], chosen, rtol=1e-6)
    assert probes.r2[0] > 0.5 > probes.r2_control[0]  # GPT-2 adds its learned table at the embedding output


@pytest.mark.slow
def test_every_control_draw_and_the_baseline_equal_sklearn():
    """Three control draws, each its own permutation per text (`control_positions(t, n, seed, r)`), each equal to
    scikit-learn's nested probe; their mean and standard deviation are what is reported. The baseline is the same
    probe on (first-token flag, text length), same folds. A planted answer: texts whose tokens carry nothing about
    position still get the baseline's R² from the flag and the length, and a hidden-state probe of a model
    without positions does no better than it."""
    model = tiny_model("gpt2")
    texts = random_texts(26, seed=6, low=2, high=14)
    acc = PositionProbeAccumulator(3, [2], 32, sample=10_000, seed=2, controls=3)
    capture(model, [acc], input_ids=texts, max_length=16, batch_size=5)
    probes = acc.result()
    ids = np.concatenate([[t] * len(x) for t, x in enumerate(texts)])
    X = np.concatenate([s[2] for s in alone(model, texts)])
    draws = []
    for r in range(3):
        control = np.concatenate([control_positions(t, len(x), 2, r) for t, x in enumerate(texts)]).astype(float)
        pred, _ = sklearn_probe(X, control, ids)
        draws.append(r2_score(control, pred))
        assert probes.r2_controls[2, r] == pytest.approx(draws[-1], abs=1e-5)
    assert len({round(v, 6) for v in draws}) == 3  # the draws differ
    assert probes.r2_control[2] == pytest.approx(np.mean(draws), abs=1e-5)
    assert probes.r2_control_std[2] == pytest.approx(np.std(draws, ddof=1), abs=1e-5)
    y = np.concatenate([np.arange(len(x)) for x in texts]).astype(float)
    features = np.stack([(y == 0).astype(float), np.concatenate([[len(x)] * len(x) for x in texts])], 1)
    pred, _ = sklearn_probe(features, y, ids)
    assert probes.r2_baseline == pytest.approx(r2_score(y, pred), abs=1e-9)
    assert probes.mae_baseline == pytest.approx(mean_absolute_error(y, pred), abs=1e-9)
    assert 0.2 < probes.r2_baseline < 0.9  # the flag and the length alone say a good deal about the position


def test_the_finish_runs_on_one_thread_and_gives_the_same_numbers():
    """Issue 49: the probe's finish (hundreds of small d x d factorisations) runs with every BLAS / LAPACK / OpenMP
    pool at one thread (two threads spin at LAPACK's barriers on a loaded machine: 30-50x the CPU), the pools are
    restored after, large hidden sizes keep theirs, and the fits are those of the default threads to round-off.
    The probe says which hidden state it fits, one phase each."""
    from threadpoolctl import threadpool_info

    from posprobe.runtime.phases import reporting_phases

    rng = np.random.default_rng(3)
    texts = np.repeat(np.arange(40), 30)
    X = rng.normal(size=(len(texts), 48))
    Y = np.stack([np.tile(np.arange(30.0), 40), rng.permutation(np.tile(np.arange(30.0), 40))], 1)
    X[:, 0] += Y[:, 0] * 0.1
    stats = fold_stats(X, Y, texts)
    before = torch.get_num_threads(), [pool["num_threads"] for pool in threadpool_info()]
    with one_thread(48):
        assert torch.get_num_threads() == 1
        assert {pool["num_threads"] for pool in threadpool_info()} == {1}
        assert any(pool["prefix"].startswith("libscipy_openblas") for pool in threadpool_info())  # scipy's too
        single = cross_validated_ridge(stats)
    assert (torch.get_num_threads(), [pool["num_threads"] for pool in threadpool_info()]) == before
    np.testing.assert_allclose(single.r2, cross_validated_ridge(stats).r2, rtol=0, atol=1e-12)
    with one_thread(4096):
        assert torch.get_num_threads() == before[0]
    model = tiny_model("gpt2")
    acc = PositionProbeAccumulator(3, [0, 2], 32, sample=100, seed=1, controls=2)
    capture(model, [acc], input_ids=random_texts(12, seed=1), max_length=16, batch_size=4)
    said = []
    with reporting_phases(said.append):
        acc.result()
    assert said[:2] == [
        "fitting the position probes: hidden state 0 of 2 (1 of 2)",
        "fitting the position probes: hidden state 2 of 2 (2 of 2)",
    ]


@pytest.mark.slow
def test_dual_form_with_fewer_tokens_than_dimensions_equals_sklearn():
    """With every token at hand and fewer training tokens than dimensions (d = 150, about 110 tokens), the fits
    are solved in the dual form: still scikit-learn's nested probe."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(2, 5, size=36)
    texts = np.repeat(np.arange(36), lengths)
    y = np.concatenate([np.arange(n) for n in lengths]).astype(float)
    X = rng.normal(size=(len(y), 150)) + 0.5 * y[:, None] * rng.normal(size=150)
    Y = np.stack([y, rng.permutation(y)], 1)
    tokens = (torch.tensor(X), torch.tensor(Y), torch.tensor(texts % N_FOLDS))
    fit = cross_validated_ridge(fold_stats(X, Y, texts), tokens=tokens)
    for t in range(2):
        pred, chosen = sklearn_probe(X, Y[:, t], texts)
        assert fit.r2[t] == pytest.approx(r2_score(Y[:, t], pred), abs=1e-8)
        np.testing.assert_allclose(fit.alpha[:, t], chosen, rtol=1e-12)


def test_dual_and_primal_solutions_agree():
    """Fewer training tokens than dimensions: the dual form gives the primal's weights for every penalty."""
    from posprobe.analysis.position_probe import dual_ridge_solve

    rng = np.random.default_rng(1)
    Z = torch.tensor(rng.normal(size=(7, 12)) * np.r_[100.0, np.ones(11)])
    Zc = Z - Z.mean(0)
    y = torch.tensor(rng.normal(size=(7, 3)))
    yc = y - y.mean(0)
    alphas = torch.tensor([1e-3, 1.0, 50.0])
    torch.testing.assert_close(dual_ridge_solve(Zc, yc, alphas), ridge_solve(Zc.T @ Zc, Zc.T @ yc, alphas))


def test_probe_results_do_not_depend_on_batches():
    model = tiny_model("llama")
    texts = random_texts(31, seed=8)
    out = []
    for batch_size in (3, 8):
        acc = PositionProbeAccumulator(3, [0, 2], 32, sample=10_000)
        capture(model, [acc], input_ids=texts, max_length=16, batch_size=batch_size)
        out.append(acc.result())
    for name in ("r2", "r2_control", "mae", "mae_control"):
        np.testing.assert_allclose(getattr(out[0], name), getattr(out[1], name), atol=1e-6, equal_nan=True)
    assert np.isnan(out[0].r2[1]) and np.isfinite(out[0].r2[[0, 2]]).all()  # hidden state 1 was not probed


def test_known_answer_position_carried_linearly_gives_r2_one():
    """GPT-2's embedding output h_0 = wte[token] + wpe[i] with wpe[i] = (i / 10) u and every token embedding
    orthogonal to u: the position is a linear function of h_0, so the held-out R² is 1 (up to the penalty)."""
    model = tiny_model("gpt2")
    with torch.no_grad():
        u = torch.nn.functional.normalize(torch.randn(32), dim=0)
        wte = model.wte.weight
        wte -= torch.outer(wte @ u, u)
        model.wpe.weight.copy_(torch.arange(64.0)[:, None] / 10 * u)
    acc = PositionProbeAccumulator(3, [0], 32, sample=10_000)
    capture(model, [acc], input_ids=random_texts(40, seed=4, high=20), max_length=32, batch_size=8)
    probes = acc.result()
    assert probes.r2[0] >= 1 - 1e-6 and probes.mae[0] < 1e-2
    assert probes.r2_control[0] < 0.5  # the control still cannot be read off the position


def test_known_answer_no_position_anywhere_gives_r2_at_most_zero():
    """BERT without position embeddings on a Latin square corpus (text t holds token (t + i) mod 11 at position
    i, all texts of length 11): attention without positions is permutation-equivariant and every text holds
    the same tokens, so each hidden state is a function of the token alone, and within every fold each token
    sits at each position equally often. Nothing predicts the position: held-out R² <= 0 at every depth (up to
    float round-off: the fitted weights are zero up to it)."""
    model = tiny_model("bert")
    with torch.no_grad():
        model.embeddings.position_embeddings.weight.zero_()
    texts = [[5 + (t + i) % 11 for i in range(11)] for t in range(55)]
    acc = PositionProbeAccumulator(3, [0, 1, 2], 32, sample=10_000)
    capture(model, [acc], input_ids=texts, max_length=16, batch_size=7)
    probes = acc.result()
    assert (probes.r2 <= 1e-6).all() and (probes.r2_control <= 1e-6).all(), (probes.r2, probes.r2_control)


def test_constant_hidden_states_predict_the_training_mean():
    """Every token the same and no positions: the hidden states are identical (scale 0), the weights are zero and
    each fold is predicted by the mean of the other four. Every fold holds positions 0..5, so that mean is the
    overall mean: R² = 0 and MAE = mean |i - 2.5| = 1.5 exactly."""
    model = tiny_model("bert")
    with torch.no_grad():
        model.embeddings.position_embeddings.weight.zero_()
    texts = [[7] * 6 for _ in range(12)]
    acc = PositionProbeAccumulator(3, [0], 32, sample=10_000)
    capture(model, [acc], input_ids=texts, max_length=8, batch_size=12)
    probes = acc.result()
    assert probes.r2[0] == pytest.approx(0.0, abs=1e-12) and probes.mae[0] == pytest.approx(1.5)


def test_too_few_texts_for_the_folds_give_nan_not_an_error():
    acc = PositionProbeAccumulator(3, [0, 1, 2], 32)
    capture(tiny_model("bert"), [acc], input_ids=random_texts(3, seed=1), max_length=16, batch_size=2)
    probes = acc.result()
    assert np.isnan(probes.r2).all() and np.isnan(probes.mae).all() and probes.n_tokens > 0


def test_ridge_solve_falls_back_when_round_off_makes_a_system_indefinite():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(6, 4))
    C = torch.tensor(a.T @ a)
    C[0, 0] -= float(torch.linalg.eigvalsh(C)[0]) + 1e-3  # one eigenvalue slightly below zero
    b = torch.tensor(rng.normal(size=(4, 2)))
    alphas = torch.tensor([1e-6, 1.0])
    W = ridge_solve(C, b, alphas)
    values, vectors = torch.linalg.eigh(C)
    expected = vectors @ ((vectors.T @ b) / (values.clamp(min=0) + 1e-6)[:, None])
    torch.testing.assert_close(W[0], expected)
    torch.testing.assert_close(W[1], torch.linalg.solve(C + torch.eye(4, dtype=C.dtype), b))


def test_tridiagonal_ridge_solve_equals_a_direct_solve_for_every_penalty():
    """The CPU route (one tridiagonal reduction for every penalty, issue 31) against a dense solve of each
    (C + alpha I) w = b, and against the eigendecomposition route, on more tokens than dimensions."""
    from posprobe.analysis.position_probe import _tridiagonal_solve, eigen_ridge_solve

    rng = np.random.default_rng(3)
    Z = torch.tensor(rng.normal(size=(80, 30)) * np.geomspace(0.01, 100.0, 30))
    C, b = Z.T @ Z, torch.tensor(rng.normal(size=(30, 4)))
    alphas = torch.tensor(ALPHA_GRID) * float(torch.trace(C)) / 30
    W = _tridiagonal_solve(C, b, alphas)
    assert W is not None and W.shape == (len(ALPHA_GRID), 30, 4)
    for k, alpha in enumerate(alphas):
        torch.testing.assert_close(W[k], torch.linalg.solve(C + alpha * torch.eye(30, dtype=C.dtype), b))
    torch.testing.assert_close(ridge_solve(C, b, alphas), eigen_ridge_solve(C, b, alphas))


def test_control_permutations_and_folds():
    perm = control_positions(4, 9, seed=1)
    assert sorted(perm.tolist()) == list(range(9)) and (perm == control_positions(4, 9, seed=1)).all()
    assert not (perm == control_positions(5, 9, seed=1)).all()


@pytest.mark.slow  # many draws
def test_reservoir_keeps_each_token_with_probability_size_over_n():
    """Algorithm R in batches equals one token at a time (later tokens win a slot drawn twice) and keeps each of
    N tokens with probability size / N."""
    size, n, runs = 5, 40, 4000
    hits = np.zeros(n)
    for run in range(runs):
        reservoir, slots = TokenReservoir(size, seed=run), np.full(size, -1)
        rng = np.random.default_rng(run)
        start = 0
        while start < n:
            count = int(rng.integers(1, 9))
            count = min(count, n - start)
            picked, where = reservoir.offer(count)
            assert len(set(where.tolist())) == len(where)
            slots[where] = start + picked
            start += count
        assert (slots >= 0).all() and len(set(slots.tolist())) == size
        hits[slots] += 1
    frequency = hits / runs
    assert np.abs(frequency - size / n).max() < 0.03  # 4000 runs: s.e. 0.005 per token


def test_reservoir_batches_equal_one_token_at_a_time():
    reservoir, kept = TokenReservoir(4, seed=9), np.full(4, -1)
    picked, where = reservoir.offer(30)
    kept[where] = picked
    draws = np.random.default_rng([9, 7919]).integers(0, np.arange(30) + 1)  # the draws the reservoir made
    one_by_one = np.full(4, -1)
    for t in range(30):
        slot = t if t < 4 else draws[t]
        if slot < 4:
            one_by_one[slot] = t
    assert (kept == one_by_one).all()


# -- positional vectors -------------------------------------------------------------------------------------------
def test_positional_vectors_equal_the_mean_per_position_of_each_text_alone():
    model = tiny_model("llama")
    texts = random_texts(30, seed=6, low=1, high=14)
    acc = PositionalVectorAccumulator(3, 16, 32)
    capture(model, [acc], input_ids=texts, max_length=16, batch_size=4)
    vectors = acc.result(min_texts=5)
    states = alone(model, texts)
    counts = np.bincount(np.concatenate([np.arange(len(t)) for t in texts]), minlength=16)
    kept = counts >= 5
    assert (vectors.counts == counts).all() and (vectors.kept == kept).all() and vectors.n_kept == kept.sum()
    for layer in range(3):
        means = np.stack([np.mean([s[layer][i] for s in states if len(s[layer]) > i], 0) for i in np.where(kept)[0]])
        expected = means - means.mean(0)
        np.testing.assert_allclose(vectors.vectors[layer, kept], expected, atol=1e-5)
        assert np.isnan(vectors.vectors[layer, ~kept]).all() and np.isnan(vectors.norms[layer, ~kept]).all()
        np.testing.assert_allclose(vectors.norms[layer, kept], np.linalg.norm(expected, axis=1), atol=1e-5)
        np.testing.assert_allclose(vectors.gram[layer], expected @ expected.T, atol=1e-5)
        later = means[1:] - means[1:].mean(0)  # the first token apart: recentred over positions i >= 1
        np.testing.assert_allclose(vectors.gram_without_first[layer], later @ later.T, atol=1e-5)
        np.testing.assert_allclose(vectors.norms_without_first[layer, 1 : kept.sum()], np.linalg.norm(later, axis=1),
                                   atol=1e-5)  # fmt: skip
        assert np.isnan(vectors.norms_without_first[layer, 0])
    from posprobe.analysis.toeplitz import toeplitz_r2

    np.testing.assert_allclose(vectors.toeplitz_r2, toeplitz_r2(vectors.gram), atol=1e-12)
    np.testing.assert_allclose(vectors.toeplitz_r2_without_first, toeplitz_r2(vectors.gram_without_first), atol=1e-12)


def test_known_answer_positional_vectors_of_a_constant_text_are_the_centred_table():
    """GPT-2's embedding output on texts of one repeated token is wte[c] + wpe[i]: v_0(i) = wpe[i] - mean wpe."""
    model = tiny_model("gpt2")
    texts = [[9] * n for n in range(1, 13) for _ in range(3)]
    acc = PositionalVectorAccumulator(3, 16, 32)
    capture(model, [acc], input_ids=texts, max_length=16, batch_size=5)
    vectors = acc.result(min_texts=6)
    table = model.wpe.weight.detach().double().numpy()[:11]  # positions reached by >= 6 texts: 0..10
    np.testing.assert_allclose(vectors.vectors[0, :11], table - table.mean(0), atol=1e-6)
    assert vectors.n_kept == 11


def test_no_position_kept_gives_nan_vectors():
    acc = PositionalVectorAccumulator(3, 16, 32)
    capture(tiny_model("bert"), [acc], input_ids=random_texts(4, seed=2), max_length=16, batch_size=4)
    vectors = acc.result(min_texts=16)
    assert vectors.n_kept == 0 and np.isnan(vectors.vectors).all() and np.isnan(vectors.toeplitz_r2).all()


# -- massive activations ------------------------------------------------------------------------------------------
def test_massive_activations_equal_a_direct_computation():
    model = tiny_model("llama")
    with torch.no_grad():  # one big channel at the first token's hidden states, as in real LLMs
        model.embed_tokens.weight[5:, 7] += 0.5
    texts = random_texts(19, seed=11, low=1, high=14)
    special = [t for t in range(5, 99, 13)]
    acc = MassiveActivationAccumulator(3, top=6)
    capture(model, [acc], input_ids=texts, special_ids=special, max_length=16, batch_size=4)
    massive = acc.result()
    states = alone(model, texts)
    for layer in range(3):
        values = [(float(np.abs(s[layer][i]).max()), t, i, int(np.abs(s[layer][i]).argmax()))
                  for t, s in enumerate(states) for i in range(len(s[layer]))]  # fmt: skip
        values.sort(key=lambda v: -v[0])
        assert massive.max[layer] == pytest.approx(values[0][0], rel=1e-5)
        assert (massive.text[layer], massive.position[layer], massive.channel[layer]) == values[0][1:]
        top = [(v[1], v[2], v[3]) for v in values[:6]]
        got = list(zip(massive.top_text[layer], massive.top_position[layer], massive.top_channel[layer]))
        assert got == top
        np.testing.assert_allclose(massive.top_value[layer], [v[0] for v in values[:6]], rtol=1e-5)
        tokens = [texts[t][i] for t, i, _ in top]
        assert massive.top_token[layer].tolist() == tokens
        assert massive.top_special[layer].tolist() == [x in special for x in tokens]
        everything = np.abs(np.concatenate([s[layer].ravel() for s in states]))
        true_median = np.median(everything)
        assert massive.n_values[layer] == everything.size
        assert abs(massive.median[layer] / true_median - 1) <= MEDIAN_RELATIVE_ERROR + 1e-6
        assert massive.ratio[layer] == pytest.approx(massive.max[layer] / massive.median[layer])
    shares = massive.shares()
    assert set(shares) == {"first", "special"} and shares["first"].shape == (3,)


@pytest.mark.parametrize("size", [1, 2, 999, 1000, 100_001])
def test_histogram_median_is_within_its_stated_bound(size):
    rng = np.random.default_rng(size)
    values = rng.standard_cauchy(size) * 10.0 ** rng.integers(-8, 8, size)
    values[rng.random(size) < 0.1] = 0.0
    values = values.astype(np.float32)
    counts = torch.bincount(log_bins(torch.from_numpy(values)), minlength=N_BINS).numpy()
    true = float(np.median(np.abs(values.astype(np.float64))))
    got = histogram_median(counts)
    if true == 0:
        assert got == 0
    else:
        assert abs(got / true - 1) <= MEDIAN_RELATIVE_ERROR * (1 + 1e-9)


def test_histogram_median_bound_is_reached_not_exceeded():
    """Values at a bin's edge are estimated by its midpoint: the error is the bound (0.135%), not more."""
    edge = np.float32(2.0**-3)  # exactly a bin edge
    counts = torch.bincount(log_bins(torch.tensor([edge] * 3)), minlength=N_BINS).numpy()
    assert histogram_median(counts) / float(edge) - 1 == pytest.approx(MEDIAN_RELATIVE_ERROR, rel=1e-9)
    assert histogram_median(np.zeros(N_BINS, dtype=np.int64)) != histogram_median(np.zeros(N_BINS, dtype=np.int64))


def test_delimiters():
    for token in (".", ",", "Ġ.", "Ċ", "▁,", "##.", ";", "Ġ", "\n\n", "«"):
        assert is_delimiter(token), token
    for token in ("the", "Ġthe", "##s", "[CLS]", "", "1", "<s>"):
        assert not is_delimiter(token), token


@pytest.mark.slow
def test_a_causal_models_baseline_uses_what_a_position_sees():
    """Issue 47: on a causal model (GPT-2) the no-hidden-state baseline is the first-token flag alone — position i
    cannot see the text's length, and its one other count, i + 1 tokens so far, is the target — equal to
    scikit-learn's probe on that flag; on a model that attends both ways (BERT) it is the flag and the length."""
    from posprobe.analysis.position_probe import baseline_inputs
    from posprobe.pipelines.states import is_causal, states

    texts = random_texts(26, seed=6, low=2, high=14)
    ids = np.concatenate([[t] * len(x) for t, x in enumerate(texts)])
    y = np.concatenate([np.arange(len(x)) for x in texts]).astype(float)
    flag = (y == 0).astype(float)[:, None]
    baselines = {}
    length = np.concatenate([[len(x)] * len(x) for x in texts]).astype(float)[:, None]
    for kind, causal, features in (("gpt2", True, flag), ("bert", False, np.concatenate([flag, length], 1))):
        model = tiny_model(kind)
        assert is_causal(model) is causal and baseline_inputs(causal) == (
            ("first_token",) if causal else ("first_token", "text_length")
        )
        result = states(model, input_ids=texts, max_length=16, min_texts=3, probe_layers=[0], mae_sample=10_000)
        record = result.to_dict()
        assert record["baseline_inputs"] == list(baseline_inputs(causal))
        pred, _ = sklearn_probe(features, y, ids)
        assert result.probes.r2_baseline == pytest.approx(r2_score(y, pred), abs=1e-9), kind
        baselines[kind] = result.probes.r2_baseline
    assert baselines["gpt2"] < baselines["bert"] - 0.05  # the length is worth something: the causal model lacks it
