"""Blockwise attention statistics (SPEC §19, issue 37): the SPEC §10 and §14 measures computed a block of query rows
at a time (the attention kernel's blockwise route, row masks, reducers' `add_block`) equal those of eager attention:
against the brute-force loop over the eager model's pairs, and against the whole-matrix route on the family matrix
(sliding windows, softcapping, learned sinks, chunked and bidirectional masks, padding); ALiBi families
(eager route) through the reducers' row blocks. Also: the block offset sums, the memory estimate and the optional
n x n mean score matrix."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from family_models import CASES, build
from test_attention import CLS, SEP, brute_force, sequences, tiny_model

from posprobe.analysis.empirical import EmpiricalAccumulator, block_offset_sums, offset_sums
from posprobe.analysis.learned_sinks import LearnedSinkAccumulator
from posprobe.analysis.sinks import SinkAccumulator
from posprobe.capture import capture, is_eager_route
from posprobe.capture import run as capture_run
from posprobe.capture.memory import attention_batch_bytes, attention_block_bytes
from posprobe.capture.model import attention_layers, check_model, picks_keys_per_head
from posprobe.capture.recording import BLOCK_NAME, BlockRecorder
from posprobe.errors import PosprobeError
from posprobe.kernel import BLOCKS, EAGER, Taps, attention
from posprobe.pipelines.attention import attention_profiles

PROFILE_FIELDS = ("score_profiles", "prob_profiles", "prob_profiles_without_first", "mean_distance")
COUNT_FIELDS = ("pair_counts", "pair_counts_without_first", "n_queries", "head_pair_counts")
SINK_FIELDS = (
    "first_token_mass",
    "special_token_mass",
    "distance_without_first",
    "sink_rate",
    "uniform_distance",
    "uniform_distance_without_first",
    "uniform_first_token_mass",
    "first_token_queries",
)


def test_block_offset_sums_equal_a_loop_over_the_block():
    rng = np.random.default_rng(0)
    n = 9
    matrix = rng.normal(size=(2, n, n))
    for row0, col0, b, w in [(0, 0, 9, 9), (3, 0, 2, 9), (8, 1, 1, 8), (2, 1, 4, 6), (0, 0, 1, 1), (5, 0, 4, 3)]:
        block = torch.from_numpy(matrix[:, row0 : row0 + b, col0 : col0 + w].copy())
        expected = np.zeros((2, 2 * n - 1))
        for r in range(b):
            for c in range(w):
                expected[:, (col0 + c) - (row0 + r) + n - 1] += block[:, r, c].numpy()
        np.testing.assert_allclose(block_offset_sums(block, row0, col0, n).numpy(), expected, atol=1e-12)
    whole = torch.from_numpy(matrix)
    np.testing.assert_allclose(block_offset_sums(whole, 0, 0, n).numpy(), offset_sums(matrix), atol=1e-12)
    rows = sum(block_offset_sums(whole[:, s : s + 2], s, 0, n) for s in range(0, n, 2))  # blocks add up
    np.testing.assert_allclose(rows.numpy(), offset_sums(matrix), atol=1e-12)


@pytest.mark.parametrize(
    "family, causal, exclude, mean_scores",
    [("bert", False, True, True), ("llama", True, False, True), ("llama", True, False, False)],
)
def test_blockwise_statistics_equal_brute_force_over_eager_attention(family, causal, exclude, mean_scores):
    """Blocks of 2 query rows (texts of 2..11 tokens, padded batches of 3) against the loop over eager pairs."""
    model = tiny_model(family)
    texts, n = sequences(), 12
    specials = (CLS, SEP) if exclude else ()
    ref = brute_force(model, family, texts, n, causal, specials)
    res = attention_profiles(
        model,
        input_ids=texts,
        special_ids=[CLS, SEP],
        exclude_special=exclude,
        max_length=n,
        batch_size=3,
        block_size=2,
        mean_scores=mean_scores,
    )
    p = res.profiles
    np.testing.assert_array_equal(p.pair_counts[0], ref["pair_counts"])
    assert p.n_queries[0] == ref["n_queries"]
    for name in ("score_profiles", "prob_profiles", "mean_distance"):
        np.testing.assert_allclose(getattr(p, name), ref[name], rtol=1e-5, atol=1e-5, err_msg=name)
    if mean_scores:
        for name in ("mean_scores", "toeplitz_r2"):
            np.testing.assert_allclose(getattr(p, name), ref[name], rtol=1e-5, atol=1e-5, err_msg=name)
        assert res.mean_scores_note == "kept"
    else:
        assert p.mean_scores is None and p.count_matrix is None and p.toeplitz_r2 is None
        assert "mean_scores" not in res.arrays() and "toeplitz_r2" not in res.arrays()
        assert res.to_dict()["toeplitz_r2"] == [[None] * res.n_heads] * res.n_layers
        assert res.to_dict()["mean_scores"].startswith("not kept")


def _texts(lengths, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 99, size=int(m)).tolist() for m in lengths]


def _reducers(model, n: int, learned: bool = False):
    """Reducers for every attention layer (a hybrid's attention layers only: what the capture records); their
    counts per head where a layer's heads pick keys of their own (MiniMax M3)."""
    L, H = len(attention_layers(model)), check_model(model, hybrid=True)[1]  # the most heads of any layer
    per_head = picks_keys_per_head(model)
    out = [EmpiricalAccumulator(L, H, n, head_masks=per_head), SinkAccumulator(L, H, head_masks=per_head)]
    return out + ([LearnedSinkAccumulator(L, H)] if learned else [])


def _assert_same(whole, blocks, tol: float) -> None:
    a, b = whole[0].result(), blocks[0].result()
    for name in COUNT_FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in (*PROFILE_FIELDS, "mean_scores", "toeplitz_r2"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=tol, atol=tol, err_msg=name)
    s, t = whole[1].result(), blocks[1].result()
    assert s.n_queries == t.n_queries and s.n_special_tokens == t.n_special_tokens
    for name in SINK_FIELDS:
        np.testing.assert_allclose(getattr(t, name), getattr(s, name), rtol=tol, atol=tol, err_msg=name)
    if len(whole) > 2:
        u, v = whole[2].result(), blocks[2].result()
        assert u.n_queries == v.n_queries
        np.testing.assert_allclose(v.real_token_share, u.real_token_share, rtol=tol, atol=tol)
        assert (v.learned_sink_share > 1e-3).all()  # the sinks took a share: the sink column was in the softmax


QUICK = ["mistral", "gemma2", "gpt_oss"]  # sliding window; softcapping + window; learned sinks + yarn + window
# families whose attention module computes with the mask itself (Doge adds its dynamic-mask bias to it): a row
# block's mask is no tensor, so running in blocks is refused in one line
MASK_IN_MODULE = {"doge"}
MASK_IN_MODULE |= {"deepseek_v4"}  # issue 34 (dsv4): its compressed layers extend a tensor mask to their pooled entries
MASK_IN_MODULE |= {"kolibri1_1", "kolibri1_1-pool"}  # issue 44: its indexer overlays its pick on a tensor mask
SLOW = [name for name in CASES if name not in QUICK]  # eager-route families and refused hybrids are skipped


@pytest.mark.parametrize("name", QUICK + [pytest.param(name, marks=pytest.mark.slow) for name in SLOW])
def test_blocks_equal_whole_matrices_on_the_family_matrix(name):
    """Padded batches of texts longer than the windows and chunks: blocks of 3 rows (the last block shorter) and
    blocks of 1 row give the statistics of the whole-matrix route (checked against eager attention in
    test_attention / test_sinks / test_capture_families). float32: in float64, eager attention gives NaN on padded
    batches of windowed families (a padding query whose window holds only padding keys), NaN that reaches the real
    tokens through its values. The slow tier runs every family of the matrix whose attention goes through
    AttentionInterface (74 cases, rotary, absolute, NoPE, latent attention, encoders)."""
    model = build(name, torch.float32)
    if is_eager_route(model):
        pytest.skip("eager route: the family's own attention makes the matrices (see the ALiBi test)")
    texts, n = _texts([30, 17, 26, 9, 2]), 30
    learned = name == "gpt_oss"
    whole = _reducers(model, n, learned)
    try:
        capture(model, whole, input_ids=texts, special_ids=[3], max_length=n, batch_size=3, block_size=0)
    except PosprobeError as err:  # hybrids whose other layers are not attention: refused on either route
        pytest.skip(err.message)
    if name in MASK_IN_MODULE:
        with pytest.raises(PosprobeError, match="could not run its attention in blocks of queries"):
            capture(model, _reducers(model, n), input_ids=texts, max_length=n, batch_size=3, block_size=3)
        return
    for rows in (3, 1):
        blocks = _reducers(model, n, learned)
        capture(model, blocks, input_ids=texts, special_ids=[3], max_length=n, batch_size=3, block_size=rows)
        _assert_same(whole, blocks, 2e-5)


@pytest.mark.parametrize("name", ["bloom", pytest.param("mpt", marks=pytest.mark.slow)])
def test_alibi_families_reduced_in_row_blocks_equal_whole_matrices(name):
    """ALiBi families run their own eager attention (the eager route holds each layer's matrices); their S and A
    handed to the reducers in blocks of rows give the whole matrices' statistics."""

    class Keep:
        needs = ("scores", "probs")

        def __init__(self):
            self.batches = []

        def add(self, batch):
            self.batches.append(batch)

        def result(self):
            return None

    model = build(name)
    keep, n = Keep(), 24
    capture(model, [keep], input_ids=_texts([24, 11, 19]), max_length=n, batch_size=3)
    whole, blocks = _reducers(model, n), _reducers(model, n)
    for batch in keep.batches:
        for reducer in whole:
            reducer.add(batch)
        for layer in range(model.config.num_hidden_layers):
            m = batch.probs[layer].shape[-1]
            for start in range(0, m, 5):
                rows = slice(start, start + 5)
                block = capture_run.BlockCapture(
                    batch.index,
                    batch.tokens,
                    layer,
                    start,
                    batch.scores[layer][:, :, rows],
                    batch.probs[layer][:, :, rows],
                    batch.allowed[layer][:, rows],
                    batch.counted_pairs[layer][:, rows],
                )
                for reducer in blocks:
                    reducer.add_block(block)
    _assert_same(whole, blocks, 1e-12)
    assert len(keep.batches) == 1 and block.start == 20  # the last of five blocks of rows


def test_the_kernels_blocks_equal_its_whole_matrices_row_by_row():
    """The kernel itself, blockwise route against eager route: masks as RowMask-free tensors (bool and additive),
    None, softcap, sinks, grouped-query heads; output and recorded S, A equal the whole-matrix computation."""
    torch.manual_seed(0)
    B, H, Hkv, m, d = 2, 4, 2, 11, 8
    q, k = torch.randn(B, H, m, d, dtype=torch.float64), torch.randn(B, Hkv, m, d, dtype=torch.float64)
    v = torch.randn(B, Hkv, m, d, dtype=torch.float64)
    allowed = torch.ones(m, m, dtype=torch.bool).tril()[None, None].expand(B, 1, m, m).clone()
    allowed[1, :, :, 7:] = False  # padding keys of the second text
    additive = torch.zeros(B, 1, m, m, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    module = torch.nn.Module().eval()
    for mask in (allowed, additive, None):
        for extra in ({}, {"softcap": 2.0}, {"s_aux": torch.randn(H, dtype=torch.float64)}):
            seen: list = []
            recorder = BlockRecorder(
                1, lambda layer, start, s, a, ok, seen=seen: seen.append((start, s, a, ok)), rows=4
            )
            recorder.begin(m)
            taps = recorder.taps()
            out, _ = attention(module, q, k, v, mask, 0.3, route=BLOCKS, posprobe_taps=taps, **extra)
            ref_out, ref_probs = attention(module, q, k, v, mask, 0.3, route=EAGER, posprobe_taps=Taps(), **extra)
            torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
            assert [start for start, *_ in seen] == [0, 4, 8] and recorder.calls == 1
            probs = torch.cat([a for _, _, a, _ in seen], dim=2)
            torch.testing.assert_close(probs, ref_probs, rtol=1e-12, atol=1e-12)
            ok = torch.cat([o for *_, o in seen], dim=1)
            expected = torch.ones(B, m, m, dtype=torch.bool) if mask is None else allowed[:, 0]
            assert torch.equal(ok, expected)


def test_the_blockwise_route_is_taken_for_long_batches_and_makes_no_square_matrix(monkeypatch):
    """block_size None: a batch whose whole matrices would take >= 256 MiB runs in blocks (lowered here to 0 bytes);
    no tensor with two axes of the sequence length is made by the attention function."""
    model = tiny_model("llama")
    n = 40
    monkeypatch.setattr(capture_run, "_CHECKED_FROM", 0)
    seen_shapes = []
    from posprobe.kernel import routes as kernel

    original = kernel._blocks

    def watching(module, query, key, value, attention_mask, *args, **kwargs):
        seen_shapes.append(type(attention_mask).__name__)
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    monkeypatch.setattr(kernel, "_blocks", watching)
    monkeypatch.setattr(kernel, "BLOCK_ELEMENTS", 4 * n * 5)  # blocks of 5 rows for 4 heads
    whole, blocks = _reducers(model, n), _reducers(model, n)
    texts = _texts([40, 33])
    capture(model, whole, input_ids=texts, max_length=n, block_size=0)
    capture(model, blocks, input_ids=texts, max_length=n)
    assert seen_shapes and set(seen_shapes) == {"RowMask"}  # the mask was never a (B, 1, m, m) tensor
    assert model.config._attn_implementation != BLOCK_NAME
    _assert_same(whole, blocks, 1e-5)


def test_memory_estimate_of_the_blockwise_route_is_linear_in_the_length():
    full = [attention_batch_bytes(2, 2, 1, m, 4, True, True) for m in (4096, 8192)]
    rows = [attention_block_bytes(2, 1, m, 64, 4, 32) for m in (4096, 8192, 16384)]  # blocks of 64 rows
    auto = [attention_block_bytes(2, 1, m, 0, 4, 32) for m in (4096, 8192, 16384)]  # blocks of ~BLOCK_ELEMENTS
    assert full[1] / full[0] == pytest.approx(4, rel=0.01)
    assert rows[1] / rows[0] == pytest.approx(2, rel=0.01) and rows[2] / rows[1] == pytest.approx(2, rel=0.01)
    assert all(1 <= b / a <= 2 for a, b in zip(auto, auto[1:]))  # a fixed-size block plus linear terms
    assert max(auto) < 2**30 < full[0]  # 16k tokens in blocks: under a GiB; 4k tokens whole: over


def test_mean_scores_default_keeps_small_matrices_and_leaves_out_large_ones(monkeypatch):
    from posprobe.pipelines import attention as pipeline

    model = tiny_model("llama")
    texts = _texts([20, 12])
    assert attention_profiles(model, input_ids=texts, max_length=20).profiles.mean_scores is not None
    monkeypatch.setattr(pipeline, "MEAN_SCORES_AUTO_BYTES", 1000)
    res = attention_profiles(model, input_ids=texts, max_length=20)
    assert res.profiles.mean_scores is None and "pass mean_scores=True" in res.mean_scores_note
    forced = attention_profiles(model, input_ids=texts, max_length=20, mean_scores=True)
    assert forced.profiles.mean_scores.shape == (2, 4, 20, 20)
    np.testing.assert_allclose(res.profiles.score_profiles, forced.profiles.score_profiles, rtol=1e-12)


def test_weights_profile_of_long_texts_reads_fewer_positions(tmp_path, monkeypatch):
    """Past `WEIGHTS_MATRIX_BYTES` the weights-based profile is read over fewer positions (no n x n matrices of
    the full length): NaN outside |k| < n', equal to the full reading inside (rotary F̂ of a constant input is
    Toeplitz), and the correlation still defined."""
    from posprobe.pipelines import attention as pipeline

    model = tiny_model("llama")
    model.save_pretrained(tmp_path / "llama")
    texts, n = _texts([24, 24, 20]), 24
    full = attention_profiles(str(tmp_path / "llama"), input_ids=texts, max_length=n, min_pairs=1)
    monkeypatch.setattr(pipeline, "WEIGHTS_MATRIX_BYTES", 8 * 4 * 10 * 10)  # 4 heads x 10 x 10 float64
    assert pipeline.weights_positions(n, 4) == 10
    short = attention_profiles(str(tmp_path / "llama"), input_ids=texts, max_length=n, min_pairs=1)
    inside = np.abs(short.profiles.offsets) < 10
    assert (
        np.isnan(short.weights_profiles[..., ~inside]).all() and np.isfinite(short.weights_profiles[..., inside]).all()
    )
    np.testing.assert_allclose(short.weights_profiles[..., inside], full.weights_profiles[..., inside], atol=1e-9)
    assert "positions 0..9" in short.weights_note and np.isfinite(short.weights_correlation).all()


@pytest.mark.slow
def test_cli_blocks_without_the_mean_score_matrix(tmp_path, capsys):
    """`--block-size 3 --mean-scores no`: the same profiles as the default run, no n x n arrays in the .npz, the
    JSON says why; a bad --block-size is one line, exit 2, nothing written."""
    from tiny_tokenizer import word_tokenizer

    from posprobe.cli import main

    folder = tmp_path / "bert"
    word_tokenizer(60).save_pretrained(folder)
    tiny_model("bert").save_pretrained(folder)
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(" ".join(f"w{(7 * i + j) % 60}" for j in range(3 + i % 9)) + "\n" for i in range(12)))
    base = ["attention", str(folder), "--text", str(texts), "--max-length", "12", "--json"]
    records = []
    for extra, name in (([], "whole"), (["--block-size", "3", "--mean-scores", "no"], "blocks")):
        try:
            main([*base, *extra, "--out", str(tmp_path / name)])
        except SystemExit as stop:
            assert stop.code in (0, None)
        records.append(json.loads(capsys.readouterr().out))
    whole, blocks = records
    assert whole["mean_scores"] == "kept" and blocks["mean_scores"].startswith("not kept (mean_scores=False)")
    assert all(v is None for row in blocks["toeplitz_r2"] for v in row)
    with np.load(whole["npz"]) as a, np.load(blocks["npz"]) as b:
        assert {"mean_scores", "count_matrix", "toeplitz_r2"} <= set(a.files)
        assert not {"mean_scores", "count_matrix", "toeplitz_r2"} & set(b.files)
        for key in ("score_profiles", "prob_profiles", "mean_distance", "first_token_mass", "weights_correlation"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)
    with pytest.raises(SystemExit) as info:
        main([*base, "--block-size", "-1", "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "--block-size" in err and "\n" not in err
    assert not (tmp_path / "never").exists()


def test_a_model_offloaded_to_disk_gives_the_same_blocks(tmp_path):
    """accelerate's big-model inference (every layer on disk, hooks moving weights in) on the blockwise route gives
    the plain model's whole-matrix statistics."""
    from posprobe.retrofitting.loading import load_model

    folder = tmp_path / "llama"
    tiny_model("llama").save_pretrained(folder)
    offloaded = load_model(
        str(folder), device_map="auto", max_memory={"cpu": "20KB"}, offload_folder=str(tmp_path / "offload")
    )
    assert "disk" in set(offloaded.hf_device_map.values())
    settings = dict(input_ids=_texts([14, 9, 11]), max_length=14, batch_size=2, weights_correlation=False)
    a = attention_profiles(offloaded, block_size=4, **settings)
    b = attention_profiles(load_model(str(folder)), block_size=0, **settings)
    # float32 sums in two orders: relative agreement, and an absolute floor for entries near 0 (a score profile entry
    # of ~1e-4 differs by 1.4e-9 under accelerate 1.16's offload hooks, 1.4e-5 relative)
    for name in ("score_profiles", "prob_profiles", "mean_distance", "mean_scores", "count_matrix"):
        np.testing.assert_allclose(
            getattr(a.profiles, name), getattr(b.profiles, name), rtol=1e-5, atol=1e-7, equal_nan=True
        )
    np.testing.assert_allclose(a.sinks.first_token_mass, b.sinks.first_token_mass, rtol=1e-5, atol=1e-7)


def test_each_route_checks_its_first_batch_against_eager_attention(monkeypatch):
    """Short batches run as whole matrices and long ones in blocks in the same capture: the first batch of each
    route is checked (once), so a long batch is never the first unchecked one."""
    model = tiny_model("llama")
    short = capture_run._full_bytes(model, {"scores", "probs"}, 2, 4, _batch(model, 6))
    monkeypatch.setattr(capture_run, "_CHECKED_FROM", short + 1)  # batches longer than 6 tokens run in blocks
    calls = {"blocks": 0, "whole": 0}
    blocks, whole = capture_run._verify_blocks, capture_run.verify_against_eager
    monkeypatch.setattr(
        capture_run, "_verify_blocks", lambda *a: (calls.update(blocks=calls["blocks"] + 1), blocks(*a))
    )

    def counted(*args, **kwargs):  # _verify_blocks calls it too, with restore=BLOCK_NAME
        calls["whole"] += "restore" not in kwargs
        return whole(*args, **kwargs)

    monkeypatch.setattr(capture_run, "verify_against_eager", counted)
    reducers = _reducers(model, 30)
    capture(model, reducers, input_ids=_texts([30, 5, 28, 4, 6, 25]), max_length=30, batch_size=1)
    assert calls == {"blocks": 1, "whole": 1}


def _batch(model, m: int):
    from posprobe.capture import id_tokenizer, token_batches

    return next(iter(token_batches([list(range(3, 3 + m))], id_tokenizer((), m, 99), batch_size=1, pad_id=0)))
