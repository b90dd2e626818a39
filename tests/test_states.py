"""`posprobe states` (SPEC §16) as a command and a library call: the JSON contract and files, the result object,
families (hidden states only: no attention interface needed; encoder-decoders refused), bad input as one line with
nothing written, the hub revision's offline error, and the checkpoint series (run folders, steps, order)."""

# ruff: noqa: F811 - the fixtures imported from test_attention are parameters of the tests below
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from test_attention import texts_file, tiny_bert_folder, tiny_model  # noqa: F401 - fixtures
from typer.testing import CliRunner

import posprobe
from posprobe.cli import app, main
from posprobe.errors import PosprobeError
from posprobe.pipelines.states_series import list_checkpoints, states_series


def run_json(args: list[str]) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cli_json_contract_and_files(tiny_bert_folder, texts_file, tmp_path):
    out = tmp_path / "states"
    record = run_json(
        ["states", str(tiny_bert_folder), "--text", str(texts_file), "--column", "sentence", "--max-length", "16",
         "--min-texts", "4", "--out", str(out)]
    )  # fmt: skip
    assert record["n_texts"] == 20 and record["max_length"] == 16 and record["n_states"] == 3
    assert record["hidden_size"] == 32 and record["min_texts"] == 4 and record["probe_folds"] == 5
    assert sorted(p.name for p in out.iterdir()) == ["positional_gram.png", "states.npz", "states.png"]
    with np.load(record["npz"]) as z:
        assert z["positional_vectors"].shape == (3, 16, 32) and z["positional_norms"].shape == (3, 16)
        kept = z["positions_kept"]
        assert kept.sum() == record["n_positions_kept"] and np.isnan(z["positional_vectors"][:, ~kept]).all()
        assert z["positional_gram"].shape == (3, kept.sum(), kept.sum())
        for name in ("probe_r2", "probe_r2_control", "probe_mae", "massive_max", "massive_position",
                     "massive_channel", "massive_ratio", "positional_toeplitz_r2",
                     "positional_toeplitz_r2_without_first"):  # fmt: skip
            assert z[name].shape == (3,), name
            np.testing.assert_allclose(np.array(record[name], dtype=float), z[name], equal_nan=True)
        assert z["massive_top_value"].shape == z["massive_top_delimiter"].shape == (3, 10)
    assert len(record["massive_top"]) == 3 and {"token", "position", "channel", "delimiter"} <= set(
        record["massive_top"][0][0]
    )
    assert isinstance(record["massive_top"][0][0]["token"], str)  # the tokenizer's spelling
    assert record["figures"] == [str(out / "states.png"), str(out / "positional_gram.png")]
    assert record["probe_r2"][0] > 0.5  # BERT's learned table at the embedding output


def test_library_result_object(tmp_path):
    model = tiny_model("gpt2")
    rng = np.random.default_rng(0)
    ids = [rng.integers(5, 99, size=int(rng.integers(2, 12))).tolist() for _ in range(30)]
    result = posprobe.states(model, input_ids=ids, max_length=16, min_texts=3, probe_layers=[0, -1], mae_sample=50)
    assert isinstance(result, posprobe.StatesResult)
    assert repr(result).startswith("StatesResult(model='GPT2Model', n_texts=30, max_length=16, n_layers=2")
    assert result.positional_vectors.shape == (3, 16, 32) and result.probes.layers.tolist() == [0, 2]
    assert np.isnan(result.probe_r2[1]) and np.isfinite(result.probe_r2[[0, 2]]).all()
    assert result.probes.n_sample == 50 < result.probes.n_tokens
    assert result.top_tokens is None and "massive_delimiter_share" not in result.to_dict()
    record = json.loads(result.to_json())
    assert record["probe_r2"][1] is None and record["probe_layers"] == [0, 2]
    assert record["layer_kinds"] == ["global", "global"]  # one kind: no layer kinds line in the titles
    assert "layer kinds" not in result.plot("summary")._suptitle.get_text()
    assert record["massive_top"][0][0]["token"] == int(result.massive.top_token[0, 0])
    for what in ("summary", "gram"):
        assert result.plot(what).get_axes()
    with pytest.raises(PosprobeError, match="what"):
        result.plot("nonsense")


def _hidden_states_only_models():
    import transformers as tf

    small = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    return {
        "bloom": tf.BloomModel(tf.BloomConfig(vocab_size=99, hidden_size=32, n_layer=2, n_head=4)),
        "mpnet": tf.MPNetModel(tf.MPNetConfig(**small, max_position_embeddings=64)),
        "deberta-v2": tf.DebertaV2Model(
            tf.DebertaV2Config(**small, relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"])
        ),
        "t5-encoder": tf.T5EncoderModel(tf.T5Config(vocab_size=99, d_model=32, d_ff=37, num_layers=2, num_heads=4)),
    }


@pytest.mark.parametrize("family", ["bloom", "mpnet", pytest.param("deberta-v2", marks=pytest.mark.slow), "t5-encoder"])
def test_families_without_an_attention_interface_work(family):
    """Hidden states only: families whose attention posprobe cannot record still give every number, and the
    positional vectors equal the per-position means of `output_hidden_states`."""
    torch.manual_seed(0)
    model = _hidden_states_only_models()[family].eval()
    ids = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]] * 4
    result = posprobe.states(model, input_ids=ids, max_length=8, min_texts=9)  # positions 0..2: 12 texts each
    assert result.n_states == 3 and np.isfinite(result.massive_max).all() and result.vectors.n_kept == 3
    with torch.no_grad():
        hidden = [model(input_ids=torch.tensor([x]), output_hidden_states=True).hidden_states for x in ids]
    means = torch.stack([torch.stack([h[-1][0, i] for h in hidden]).double().mean(0) for i in range(3)])
    np.testing.assert_allclose(result.positional_vectors[-1, :3], (means - means.mean(0)).numpy(), atol=1e-5)


def test_encoder_decoders_are_refused():
    import transformers as tf

    t5 = tf.T5Model(tf.T5Config(vocab_size=99, d_model=32, d_ff=37, num_layers=2, num_heads=4, d_kv=8)).eval()
    with pytest.raises(PosprobeError, match="encoder-decoder"):
        posprobe.states(t5, input_ids=[[5, 6, 7]] * 4, max_length=8)


def test_nan_hidden_states_are_one_error():
    model = tiny_model("bert")
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[7, 0] = float("nan")
    with pytest.raises(PosprobeError, match="NaN or infinite"):
        posprobe.states(model, input_ids=[[5, 7, 9]] * 6, max_length=8)


def test_accumulators_too_large_are_refused_before_the_run(monkeypatch):
    from posprobe.pipelines import states as pipeline

    monkeypatch.setattr(pipeline, "MAX_ACCUMULATOR_BYTES", 1000)
    with pytest.raises(PosprobeError, match="--probe-layers"):
        posprobe.states(tiny_model("bert"), input_ids=[[5, 6]] * 6, max_length=8)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--min-texts", "0"], "--min-texts must be at least 1"),
        (["--probe-layers", "7"], "hidden state 7 does not exist"),
        (["--probe-layers", "x"], "not a comma-separated list"),
        (["--mae-sample", "0"], "--mae-sample must be at least 1"),
        (["--max-length", "100"], "--max-length 100 exceeds"),
        (["--revision", "v1"], "--revision applies to hub model ids"),
        (["--checkpoints", "{model}"], "--checkpoints replaces MODEL"),
    ],
)
def test_cli_bad_input_one_line_exit_2_nothing_written(
    tiny_bert_folder,
    texts_file,
    tmp_path,
    capsys,
    extra,
    message,
):
    extra = [e.replace("{model}", str(tiny_bert_folder)) for e in extra]
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as info:
        main(["states", str(tiny_bert_folder), "--text", str(texts_file), "--column", "sentence", *extra,
              "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith("posprobe: error: ") and "\n" not in err
    assert message in err, err
    assert not out.exists()


def test_hub_revision_offline_is_one_line(texts_file, tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as info:
        main(["states", "some-org/some-model", "--revision", "step1000", "--text", str(texts_file), "--column",
              "sentence", "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err
    assert "'some-org/some-model' (revision 'step1000')" in err and "not in the local hub cache" in err
    assert not out.exists()


# -- the checkpoint series ---------------------------------------------------------------------------------------
@pytest.fixture()
def training_run(tiny_bert_folder, tmp_path):
    """A Trainer-like run folder: checkpoint-{100,20,300}, each a tiny BERT (different weights) with the tokenizer
    and a trainer_state.json whose global_step is the folder's number (100 is written as 'checkpoint-100')."""
    run = tmp_path / "run"
    for seed, step in ((1, 100), (2, 20), (3, 300)):
        folder = run / f"checkpoint-{step}"
        shutil.copytree(tiny_bert_folder, folder)
        torch.manual_seed(seed)
        model = tiny_model("bert")
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * seed * torch.randn_like(p))
        model.save_pretrained(folder)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.1}))
    return run


@pytest.mark.slow  # three checkpoints, each run
def test_cli_series_of_a_training_run(training_run, texts_file, tmp_path):
    out = tmp_path / "series"
    record = run_json(
        ["states", "--checkpoints", str(training_run), "--text", str(texts_file), "--column", "sentence",
         "--max-length", "16", "--min-texts", "4", "--out", str(out)]
    )  # fmt: skip
    assert record["steps"] == [20, 100, 300] and record["ordered_by_step"] is True
    assert [c["label"] for c in record["checkpoints"]] == ["checkpoint-20", "checkpoint-100", "checkpoint-300"]
    assert {c["step_from"] for c in record["checkpoints"]} == {"trainer_state.json"}
    assert np.shape(record["probe_r2"]) == (3, 3) and np.shape(record["massive_ratio"]) == (3, 3)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["states_series.npz", "states_series.png", "states_checkpoint-20.npz", "states_checkpoint-100.npz",
         "states_checkpoint-300.npz"]
    )  # fmt: skip
    single = run_json(
        ["states", str(training_run / "checkpoint-100"), "--text", str(texts_file), "--column", "sentence",
         "--max-length", "16", "--min-texts", "4", "--out", str(tmp_path / "one")]
    )  # fmt: skip
    for name in ("probe_r2", "probe_r2_control", "positional_toeplitz_r2", "massive_max", "massive_ratio"):
        np.testing.assert_allclose(
            np.array(record[name][1], dtype=float), np.array(single[name], dtype=float), equal_nan=True
        )
    with np.load(out / "states_series.npz") as z:
        assert z["steps"].tolist() == [20, 100, 300]
        assert z["labels"].tolist() == ["checkpoint-20", "checkpoint-100", "checkpoint-300"]
        assert z["probe_r2"].shape == (3, 3)
    with np.load(out / "states_checkpoint-300.npz") as z:
        assert z["positional_vectors"].shape == (3, 16, 32)


def test_checkpoint_steps_from_names_and_order_given(training_run, tmp_path):
    (training_run / "checkpoint-300" / "trainer_state.json").unlink()  # the step then comes from the name
    items = list_checkpoints(str(training_run))
    assert [(c.step, c.step_from) for c in items] == [(20, "trainer_state.json"), (100, "trainer_state.json"),
                                                      (300, "name")]  # fmt: skip
    plain = tmp_path / "final"
    shutil.copytree(training_run / "checkpoint-20", plain)
    (plain / "trainer_state.json").unlink()
    mixed = list_checkpoints([str(training_run / "checkpoint-300"), str(plain)])  # no step for 'final'
    assert [c.label for c in mixed] == ["checkpoint-300", "final"]  # the order given
    hub = list_checkpoints("EleutherAI/pythia-70m@step3000,EleutherAI/pythia-70m@step1000")
    assert [(c.model, c.revision, c.step) for c in hub] == [
        ("EleutherAI/pythia-70m", "step1000", 1000),
        ("EleutherAI/pythia-70m", "step3000", 3000),
    ]


@pytest.mark.slow
def test_series_in_the_order_given_uses_positions_on_the_x_axis(training_run, tmp_path):
    a, b = tmp_path / "early", tmp_path / "late"
    shutil.copytree(training_run / "checkpoint-20", a)
    shutil.copytree(training_run / "checkpoint-300", b)
    for folder in (a, b):
        (folder / "trainer_state.json").unlink()
    series = states_series([str(b), str(a)], ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"] * 3, max_length=8, min_texts=2)
    assert series.labels == ["late", "early"] and not series.ordered_by_step and series.steps.tolist() == [0, 1]
    assert series.step_label.startswith("checkpoint") and series.plot().get_axes()
    assert series.numbers["probe_r2"].shape == (2, 3)
    with pytest.raises(PosprobeError, match="iterator"):
        states_series([str(a), str(b)], iter(["w1 w2"] * 10))


@pytest.mark.parametrize(
    "setup, message",
    [
        ("damaged", "cannot read the step from"),
        ("single", "at least 2 checkpoints"),
        ("empty-run", "neither config.json nor checkpoint-* folders"),
        ("empty-entry", "has an empty entry"),
    ],
)
def test_series_bad_input_is_one_line(training_run, texts_file, tmp_path, capsys, setup, message):
    target = str(training_run)
    if setup == "damaged":
        (training_run / "checkpoint-100" / "trainer_state.json").write_text('{"global_step": ')
    elif setup == "single":
        target = str(training_run / "checkpoint-100")
    elif setup == "empty-run":
        target = str(tmp_path)
    else:
        target = f"{training_run / 'checkpoint-100'},,{training_run / 'checkpoint-20'}"
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as info:
        main(["states", "--checkpoints", target, "--text", str(texts_file), "--column", "sentence", "--out",
              str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err and message in err, err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("min_texts", [100, 7])  # no position kept; one position kept (none after the first)
def test_few_kept_positions_still_give_files_and_nulls(tmp_path, min_texts):
    from posprobe.pipelines.states_result import write_states

    ids = [[5, 6, 7]] * 6 + [[8]]  # position 0: 7 texts, positions 1-2: 6
    result = posprobe.states(tiny_model("bert"), input_ids=ids, max_length=8, min_texts=min_texts)
    assert result.vectors.n_kept == (0 if min_texts == 100 else 1)
    record = json.loads(result.to_json())
    assert (
        record["positional_toeplitz_r2"] == [None] * 3 and record["positional_toeplitz_r2_without_first"] == [None] * 3
    )
    assert record["positional_norm_mean_without_first"] == [None] * 3
    written = write_states(result, tmp_path / "out")
    assert all(p.is_file() for p in [written["npz"], *written["figures"]])


@pytest.mark.slow
def test_position_axes_have_whole_number_ticks():
    """Positions and hidden states are whole numbers: no tick reads 2.5 (matplotlib's default locator put one at
    every half position on MiniLM's 20 kept positions)."""
    model = tiny_model("gpt2")
    rng = np.random.default_rng(1)
    ids = [rng.integers(5, 99, size=int(rng.integers(6, 12))).tolist() for _ in range(40)]
    result = posprobe.states(model, input_ids=ids, max_length=16, min_texts=3, mae_sample=50)
    summary, gram = result.plot("summary"), result.plot("gram")
    summary.canvas.draw(), gram.canvas.draw()
    axes = [summary.axes[0], summary.axes[2], summary.axes[3]] + [a for a in gram.axes if a.images]
    assert len(axes) > 3
    for ax in axes:
        for tick in [*ax.get_xticks(), *(ax.get_yticks() if ax.images else [])]:
            assert float(tick) == int(tick), (ax.get_title(), tick)


def test_fewer_texts_than_folds_say_why_the_probe_is_undefined(tmp_path, capsys):
    """Three texts leave two of the five folds empty: the probe is undefined (NaN), and the text output and the
    figure say why and what to pass, instead of an empty panel on a meaningless axis."""
    from posprobe.cli.states import _print

    result = posprobe.states(tiny_model("bert"), input_ids=[[5, 6, 7, 8]] * 3, max_length=8, min_texts=2)
    assert np.isnan(result.probe_r2).all()
    _print(result, {"npz": str(tmp_path / "states.npz")})
    assert "3 texts leave a fold empty; pass at least 5 texts" in " ".join(capsys.readouterr().out.split())
    texts = [t.get_text() for t in result.plot("summary").axes[0].texts]
    assert any("probe undefined: 3 texts" in t for t in texts), texts
    assert len(result.plot("summary").axes[0].get_lines()) == 1  # only the zero line: no NaN curves, no legend


def test_text_table_rows_stay_one_line_at_80_columns(tmp_path, capsys, monkeypatch):
    """SmolLM2's activations of ~28,900 and its BPE tokens folded every row of the table in two at 80 columns:
    numbers of 100 and more lose their decimals, tokens are cut to 5 characters (whole in --json)."""
    from dataclasses import replace

    from posprobe.cli import states as cli_states

    assert cli_states._fmt(28921.94, 1) == "28922" and cli_states._fmt(40.56, 1) == "40.6"
    assert cli_states._fmt(float("nan")) == "—"
    result = posprobe.states(tiny_model("bert"), input_ids=[[5, 6, 7, 8]] * 6, max_length=8, min_texts=2)
    result = replace(result, top_tokens=[["ĠNobody"] * 3] * result.n_states)
    monkeypatch.setattr(cli_states.console, "width", 80)
    cli_states._print(result, {"npz": str(tmp_path / "states.npz")})
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Massive activations"))
    rows = [line for line in lines[:at] if re.match(r"^\s*\d+\s", line)]
    massive = [line for line in lines[at:] if re.match(r"^\s*\d+\s", line)]
    assert len(rows) == len(massive) == result.n_states and all("ĠNobody" in row for row in massive)
    assert all(len(line) <= 80 for line in rows + massive)
    assert any(line.startswith("baseline (no hidden state") for line in lines)


# --- issue 38: references for the positional vectors (permutation null, noise floor) ---


def test_permutation_null_equals_the_gram_r2_of_explicitly_permuted_texts():
    """The null's draw r is the Toeplitz R² of the positional vectors computed from each text's hidden states with
    its positions 1..len-1 shuffled by `permuted_later_positions(t, len, seed, r)` (by hand here, from
    `output_hidden_states` of each text alone), for all kept positions and for i >= 1."""
    from posprobe.analysis.positional_vectors import permuted_later_positions, positional_vectors

    model = tiny_model("gpt2")
    rng = np.random.default_rng(3)
    ids = [rng.integers(5, 99, size=int(rng.integers(3, 8))).tolist() for _ in range(14)]
    result = posprobe.states(model, input_ids=ids, max_length=8, min_texts=5, null_draws=3, seed=4, batch_size=4)
    with torch.no_grad():
        hidden = [model(input_ids=torch.tensor([x]), output_hidden_states=True).hidden_states for x in ids]
    for r in range(3):
        sums, counts = np.zeros((3, 8, 32)), np.zeros(8, dtype=np.int64)
        for t, (x, h) in enumerate(zip(ids, hidden)):
            where = permuted_later_positions(t, len(x), 4, r)
            assert where[0] == 0 and sorted(where) == list(range(len(x)))
            for i, j in enumerate(where):
                counts[j] += 1
                sums[:, j] += np.stack([layer[0, i].double().numpy() for layer in h])
        expected = positional_vectors(sums, counts, 5)
        np.testing.assert_allclose(result.null_r2[r], expected.toeplitz_r2, atol=1e-6)
        np.testing.assert_allclose(result.null_r2_without_first[r], expected.toeplitz_r2_without_first, atol=1e-6)
    numbers = result.per_layer()
    np.testing.assert_allclose(numbers["positional_toeplitz_r2_null_mean"], result.null_r2.mean(0))
    np.testing.assert_allclose(numbers["positional_toeplitz_r2_null_std"], result.null_r2.std(0, ddof=1))
    assert "positional_toeplitz_r2_null" in result.arrays() and result.metadata()["positional_null_draws"] == 3


def test_a_planted_position_stands_clear_of_the_null_and_the_noise_floor_and_no_position_does_not():
    """GPT-2's embedding output with a strong smooth learned table (wpe[i] = 3 cos/sin of i/4) stands far above
    the null and the noise floor; the same model with wpe = 0 has no position at l = 0: its Gram R² sits within the
    null's spread and every kept position's norm is within the noise floor."""
    rng = np.random.default_rng(0)
    ids = [rng.integers(5, 99, size=int(rng.integers(6, 12))).tolist() for _ in range(60)]
    out = {}
    for planted in (True, False):
        model = tiny_model("gpt2")
        with torch.no_grad():
            i = torch.arange(64.0)[:, None]
            freq = torch.arange(16.0)[None] / 4 + 0.25
            table = 3 * torch.cat([torch.cos(i / 4 * freq), torch.sin(i / 4 * freq)], 1) if planted else 0 * i
            model.wpe.weight.copy_(table.expand(64, 32))
        out[planted] = posprobe.states(model, input_ids=ids, max_length=12, min_texts=20, null_draws=6, batch_size=16)
    for planted, r in out.items():
        numbers = r.per_layer()
        real = numbers["positional_toeplitz_r2_without_first"][0]
        mean, sd = (numbers[f"positional_toeplitz_r2_without_first_null_{s}"][0] for s in ("mean", "std"))
        floor, within = r.vectors.noise_floor[0], r.vectors.within_noise[0]
        kept = r.vectors.kept
        assert np.isfinite(floor[kept]).all() and np.isnan(floor[~kept]).all()
        later = kept & (np.arange(len(kept)) >= 1)
        if planted:
            assert real > mean + 4 * sd and not within[kept].any()
            assert not r.vectors.within_noise_without_first[0].any()
        else:
            assert abs(real - mean) < 3 * sd and within[kept].all()
            np.testing.assert_array_equal(r.vectors.within_noise_without_first[0], later)
            np.testing.assert_allclose(np.median(r.vectors.norms[0, kept] / floor[kept]), 1.0, atol=0.35)


def test_noise_floor_is_the_standard_error_of_each_positions_mean():
    """sqrt(tr Σ / c) from the per-position sums of |h|²: equal to a direct computation over the texts."""
    from posprobe.analysis.positional_vectors import positional_vectors

    rng = np.random.default_rng(1)
    h = rng.normal(size=(2, 5, 9, 4)) * [1.0, 3.0, 1.0, 0.5]  # (L+1, n, texts, d)
    counts = np.array([9, 9, 9, 9, 9])
    v = positional_vectors(h.sum(2), counts, 3, (h**2).sum((2, 3)))
    direct = np.sqrt(h.var(2, ddof=1).sum(-1) / 9)
    np.testing.assert_allclose(v.noise_floor, direct, rtol=1e-12)
    np.testing.assert_array_equal(v.within_noise, v.norms < 2 * direct)
    later = np.arange(5) >= 1
    np.testing.assert_array_equal(v.within_noise_without_first, later & (v.norms_without_first < 2 * direct))
