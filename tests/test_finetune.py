"""`posprobe finetune` / `evaluate` end to end on a tiny BERT built here, with fixture data written here.

The tiny model has dropout switched off so that runs differ only by what each test varies (kill + resume,
one vs two processes). Every run is a few optimiser steps on CPU.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from posprobe.errors import PosprobeError

ROOT = Path(__file__).resolve().parents[1]
FILLER = "the a movie film was is plot actor very".split()
POSITIVE = ["good", "great", "fine"]
NEGATIVE = ["bad", "awful", "dull"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILLER, *POSITIVE, *NEGATIVE, "same", "other"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide BERT with a word-level vocabulary, saved with its tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    folder = tmp_path_factory.mktemp("tiny-bert")
    BertTokenizer(vocab={w: i for i, w in enumerate(VOCAB)}).save_pretrained(folder)
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        vocab_size=len(VOCAB),
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    import torch

    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def _sentence(rng: random.Random, label: int) -> str:
    words = [rng.choice(FILLER) for _ in range(rng.randint(2, 6))]
    words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
    return " ".join(words)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def sst2_dir(tmp_path_factory) -> Path:
    """A learnable single-sentence task in the HF schema: the label is the sentiment word's polarity."""
    root = tmp_path_factory.mktemp("glue-hf")
    rng = random.Random(0)
    for split, n in (("train", 64), ("validation", 32)):
        labels = [rng.randint(0, 1) for _ in range(n)]
        _write_jsonl(
            root / "sst2" / f"{split}.jsonl",
            [{"sentence": _sentence(rng, y), "label": y, "idx": i} for i, y in enumerate(labels)],
        )
    return root


def _config(model: Path, data: Path, out: Path, **overrides):
    from posprobe.glue.config import FinetuneConfig

    settings = dict(
        task="sst2",
        out=out,
        model=str(model),
        data_dir=data,
        epochs=2,
        lr=3e-3,
        warmup=0.0,
        batch_size=8,
        seeds=[0],
    )
    settings.update(overrides)
    return FinetuneConfig(**settings)


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


def _run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    from posprobe.cli import main

    code = 0
    try:
        main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------------------------------------------
# end to end


@pytest.mark.slow  # 2 seeds x 6 epochs to show the task is learned; the quick default-tier runs cover the contract
def test_cli_finetune_json_results_and_evaluate(tiny_model, sst2_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, stderr = _run_cli(
        [
            "finetune",
            "--task",
            "sst2",
            "--model",
            str(tiny_model),
            "--data-dir",
            str(sst2_dir),
            "--seeds",
            "2",
            "--epochs",
            "6",
            "--lr",
            "3e-3",
            "--batch-size",
            "8",
            "--out",
            str(out),
            "--json",
        ],
        capsys,
    )
    assert code == 0, stderr[-3000:]
    result = json.loads(stdout)  # exactly one JSON object on stdout (Trainer logs go to stderr)
    assert result["task"] == "sst2" and result["mechanism"] == "none" and result["seeds"] == [0, 1]
    assert {"metrics", "median", "mean", "stderr", "seconds"} <= set(result)
    assert [set(m) for m in result["metrics"]] == [{"accuracy"}, {"accuracy"}]
    values = [m["accuracy"] for m in result["metrics"]]
    assert result["median"]["accuracy"] == pytest.approx(sum(values) / 2)
    assert result["mean"]["accuracy"] == pytest.approx(sum(values) / 2)
    assert result["stderr"]["accuracy"] == pytest.approx(abs(values[0] - values[1]) / 2)
    assert max(values) >= 0.75  # the task is learnable: the sentiment word decides the label
    saved = json.loads((out / "results.json").read_text())
    assert saved["metrics"] == result["metrics"]
    table = (out / "results.md").read_text()
    assert "| seed | accuracy | seconds |" in table and "| median |" in table and "mean ± s.e." in table
    assert (out / "seed-1" / "model" / "config.json").is_file()
    assert not list(out.glob("seed-*/checkpoint-*"))  # finished seeds keep only the final model

    code, stdout, stderr = _run_cli(
        ["evaluate", str(out), "--task", "sst2", "--data-dir", str(sst2_dir), "--json"], capsys
    )
    assert code == 0, stderr[-3000:]
    again = json.loads(stdout)
    assert again["seeds"] == [0, 1]
    for before, after in zip(result["metrics"], again["metrics"]):
        assert after["accuracy"] == pytest.approx(before["accuracy"])


@pytest.mark.slow
def test_pair_regression_from_tsv(tiny_model, tmp_path):
    from posprobe.glue import finetune

    header = [
        "index",
        "genre",
        "filename",
        "year",
        "old_index",
        "source1",
        "source2",
        "sentence1",
        "sentence2",
        "score",
    ]
    rng = random.Random(1)
    for name, n in (("train.tsv", 16), ("dev.tsv", 12)):
        lines = [header]
        for i in range(n):
            a, b = _sentence(rng, 1), _sentence(rng, rng.randint(0, 1))
            lines.append([str(i), "g", "f", "2012", str(i), "s", "s", a, b, f"{rng.uniform(0, 5):.3f}"])
        path = tmp_path / "glue" / "STS-B" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join("\t".join(x) + "\n" for x in lines))
    result = finetune(_config(tiny_model, tmp_path / "glue", tmp_path / "run", task="stsb", max_steps=3))
    assert set(result.metrics[0]) == {"pearson", "spearman"}
    assert all(v is None or -1.0 <= v <= 1.0 for v in result.metrics[0].values())
    meta = json.loads((tmp_path / "run" / "seed-0" / "model" / "posprobe_glue.json").read_text())
    assert meta["task"] == "stsb" and meta["mechanism"] == "none"


def test_mnli_reports_matched_and_mismatched(tiny_model, tmp_path):
    from posprobe.glue import evaluate, finetune

    rng = random.Random(2)
    for split, n in (("train", 16), ("validation_matched", 9), ("validation_mismatched", 7)):
        _write_jsonl(
            tmp_path / "glue" / "mnli" / f"{split}.jsonl",
            [
                {"premise": _sentence(rng, 1), "hypothesis": _sentence(rng, 0), "label": i % 3, "idx": i}
                for i in range(n)
            ],
        )
    result = finetune(_config(tiny_model, tmp_path / "glue", tmp_path / "run", task="mnli", max_steps=2))
    assert set(result.metrics[0]) == {"accuracy", "accuracy_mismatched"}
    again = evaluate(tmp_path / "run" / "seed-0" / "model", "mnli", tmp_path / "glue")
    assert again["metrics"][0] == pytest.approx(result.metrics[0])
    with pytest.raises(PosprobeError, match="has 3 output"):
        (tmp_path / "glue" / "sst2").mkdir()
        _write_jsonl(tmp_path / "glue" / "sst2" / "validation.jsonl", [{"sentence": "good", "label": 1}])
        evaluate(tmp_path / "run", "sst2", tmp_path / "glue")


# ----------------------------------------------------------------------------------------------------
# kill and resume


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["none", "tisa"])
def test_resume_after_kill_matches_uninterrupted(tiny_model, sst2_dir, tmp_path, mechanism):
    """Kill training after step 5 (last checkpoint: step 4), resume, and land on the same weights and metrics."""
    from transformers import TrainerCallback

    from posprobe.glue import finetune

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                raise KeyboardInterrupt("simulated kill")

    extra = {"mechanism": mechanism, "init": "random"} if mechanism != "none" else {}
    full = finetune(_config(tiny_model, sst2_dir, tmp_path / "full", save_steps=4, **extra))
    with pytest.raises(KeyboardInterrupt):
        finetune(_config(tiny_model, sst2_dir, tmp_path / "killed", save_steps=4, **extra), callbacks=[Kill()])
    assert [p.name for p in (tmp_path / "killed" / "seed-0").glob("checkpoint-*")] == ["checkpoint-4"]
    assert not (tmp_path / "killed" / "results.json").exists()

    with pytest.raises(PosprobeError, match="already holds a fine-tuning run"):
        finetune(_config(tiny_model, sst2_dir, tmp_path / "killed", save_steps=4, **extra))
    with pytest.raises(PosprobeError, match="different settings"):
        finetune(_config(tiny_model, sst2_dir, tmp_path / "killed", save_steps=4, lr=1e-3, resume=True, **extra))

    resumed = finetune(_config(tiny_model, sst2_dir, tmp_path / "killed", save_steps=4, resume=True, **extra))
    assert resumed.metrics == full.metrics
    assert _max_weight_diff(tmp_path / "full" / "seed-0" / "model", tmp_path / "killed" / "seed-0" / "model") <= 1e-6
    # resuming a finished run reuses its metrics instead of training again
    again = finetune(_config(tiny_model, sst2_dir, tmp_path / "killed", save_steps=4, resume=True, **extra))
    assert again.metrics == full.metrics


# ----------------------------------------------------------------------------------------------------
# two processes


@pytest.mark.slow
def test_two_processes_match_one_process(tiny_model, sst2_dir, tmp_path):
    """`torchrun --nproc_per_node=2` with the same total batch size reaches the same model as one process.

    Tolerance: weights within 1e-4 (observed ~3e-6) and each metric within one flipped dev prediction
    (1/32). Both runs see the same seeded global example order (the 2 ranks take alternate halves of each
    global batch) and the tiny model has no dropout, so the only difference is float summation order:
    two half-batch mean gradients all-reduced vs one full-batch mean.
    """
    from posprobe.glue import finetune

    one = finetune(_config(tiny_model, sst2_dir, tmp_path / "one", epochs=3, warmup=0.1))  # the CLI's warm-up
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "posprobe",
        "finetune",
        "--task",
        "sst2",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(sst2_dir),
        "--seed",
        "0",
        "--epochs",
        "3",
        "--lr",
        "3e-3",
        "--batch-size",
        "8",
        "--out",
        str(tmp_path / "two"),
        "--json",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout  # only rank 0 prints the JSON object
    two = json.loads(lines[0])
    assert two["world_size"] == 2
    for name, value in one.metrics[0].items():
        assert abs(two["metrics"][0][name] - value) <= 1 / 32 + 1e-9
    assert _max_weight_diff(tmp_path / "one" / "seed-0" / "model", tmp_path / "two" / "seed-0" / "model") <= 1e-4


# ----------------------------------------------------------------------------------------------------
# errors and small helpers


def test_cli_bad_task_lists_valid_names(capsys):
    code, stdout, stderr = _run_cli(["finetune", "--task", "colaa"], capsys)
    assert code == 2 and stdout == ""
    assert "unknown GLUE task 'colaa'" in stderr and "sst2" in stderr and "wnli" in stderr


def test_unknown_mechanism_and_bad_init(tiny_model, sst2_dir, tmp_path):
    """Refused when the config is built: nothing is loaded and no folder is made."""
    with pytest.raises(PosprobeError, match="unknown mechanism 'nope'"):
        _config(tiny_model, sst2_dir, tmp_path / "a", mechanism="nope")
    with pytest.raises(PosprobeError, match="init fit only applies to TISA"):
        _config(tiny_model, sst2_dir, tmp_path / "b", mechanism="composite", init="fit")
    for option in (dict(drop_position_embeddings=True), dict(init="random")):
        with pytest.raises(PosprobeError, match="need a positional mechanism"):
            _config(tiny_model, sst2_dir, tmp_path / "n", **option)
    with pytest.raises(PosprobeError, match="does not exist"):
        _config(tiny_model, sst2_dir, tmp_path / "c", mechanism="tisa", init=f"fit:{tmp_path}/none.st")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_init_fit_fits_the_models_own_profiles(tiny_model, sst2_dir, tmp_path):
    """`--init fit` is the TISA paper's initialisation: kernels regressed onto the model's F̂_P profiles."""
    from posprobe.formats.tisa_kernels import load_tisa_kernels
    from posprobe.glue import finetune
    from posprobe.retrofitting.loading import load_model

    result = finetune(
        _config(tiny_model, sst2_dir, tmp_path / "fit", mechanism="tisa", init="fit", kernels=2, epochs=1)
    )
    a, b, c, meta = load_tisa_kernels(tmp_path / "fit" / "fit-tisa" / "tisa_kernels_S2.safetensors")
    assert a.shape == (2, 4, 2) and meta["model"] == str(tiny_model)
    assert result.mechanism == "tisa" and 0.0 <= result.metrics[0]["accuracy"] <= 1.0
    model = load_model(tmp_path / "fit" / "seed-0" / "model")
    assert model.config.posprobe["mechanism"] == "tisa"


@pytest.mark.slow
def test_finetuning_a_retrofitted_checkpoint_keeps_its_mechanism(tiny_model, sst2_dir, tmp_path):
    from posprobe.glue import finetune
    from posprobe.retrofitting.install import retrofit, save_retrofitted
    from posprobe.retrofitting.loading import load_model

    save_retrofitted(retrofit(load_model(tiny_model), "composite", init="random"), tmp_path / "retro")
    result = finetune(_config(tmp_path / "retro", sst2_dir, tmp_path / "run", epochs=1))
    assert result.mechanism == "composite"
    tuned = load_model(tmp_path / "run" / "seed-0" / "model")
    assert tuned.config.posprobe["mechanism"] == "composite"
    with pytest.raises(PosprobeError, match="already retrofitted"):
        finetune(_config(tmp_path / "retro", sst2_dir, tmp_path / "again", mechanism="tisa"))


def test_batch_size_must_divide_over_processes(tmp_path, monkeypatch):
    from posprobe.errors import ArgumentValueError
    from posprobe.glue.runtime import training_arguments

    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ArgumentValueError, match="not divisible by the 3 processes"):
        training_arguments(tmp_path, batch_size=8, train={"max_steps": 1})


def test_seed_list_and_aggregate():
    from posprobe.glue.config import seed_list
    from posprobe.glue.report import aggregate

    assert seed_list() == [0] and seed_list(seeds=3) == [0, 1, 2] and seed_list(seed=7) == [7]
    with pytest.raises(PosprobeError):
        seed_list(seeds=2, seed=1)
    with pytest.raises(PosprobeError):
        seed_list(seeds=0)
    agg = aggregate([{"f1": 0.5, "accuracy": 0.6}, {"f1": 0.7, "accuracy": 0.9}, {"f1": 0.9, "accuracy": 0.6}])
    assert agg["median"] == pytest.approx({"f1": 0.7, "accuracy": 0.6})
    assert agg["mean"] == pytest.approx({"f1": 0.7, "accuracy": 0.7})
    # sample s.d. of (0.5, 0.7, 0.9) is 0.2 -> s.e. 0.2 / sqrt(3)
    assert agg["stderr"]["f1"] == pytest.approx(0.2 / math.sqrt(3))
    one = aggregate([{"pearson": None}, {"pearson": 0.5}])
    assert one["mean"]["pearson"] == 0.5 and one["stderr"]["pearson"] is None
    assert one["n"]["pearson"] == 1 and agg["n"]["f1"] == 3


# ----------------------------------------------------------------------------------------------------
# evaluate loads through posprobe.load_model and refuses untrained heads


def _capture_predictions(monkeypatch) -> list:
    """Record the raw predictions `evaluate` scores (wraps the metric call of the shared runtime)."""
    import posprobe.glue.runtime as runtime

    seen: list = []
    original = runtime.compute_metrics

    def spy(task, predictions, labels, split):
        seen.append(predictions.copy())
        return original(task, predictions, labels, split)

    monkeypatch.setattr(runtime, "compute_metrics", spy)
    return seen


def _logits_one_by_one(model, tokenizer, texts: list[tuple[str, ...]]):
    import torch

    model.eval()
    with torch.no_grad():
        return torch.cat([model(**tokenizer(*t, return_tensors="pt")).logits for t in texts]).numpy()


def test_evaluate_scores_the_retrofitted_mechanism(tiny_model, tmp_path, monkeypatch):
    """Issue 8 #2: a classifier retrofitted with `fixed --init random` is evaluated with its mechanism: the
    scored predictions equal the in-memory retrofitted model's, and the score differs from the plain model's.
    (STS-B, so that the score is a correlation that any change of the predictions moves.)"""
    import numpy as np
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from posprobe.glue import evaluate
    from posprobe.glue.data import load_split
    from posprobe.retrofitting.install import retrofit, save_retrofitted
    from posprobe.retrofitting.loading import load_model

    rng = random.Random(3)
    for split in ("train", "validation"):
        rows = [
            {"sentence1": _sentence(rng, 1), "sentence2": _sentence(rng, 0), "label": round(rng.uniform(0, 5), 2)}
            for _ in range(24)
        ]
        _write_jsonl(tmp_path / "glue" / "stsb" / f"{split}.jsonl", rows)
    data = tmp_path / "glue"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    plain_model = load_model(
        tiny_model,
        model_class=AutoModelForSequenceClassification,
        num_labels=1,
        problem_type="regression",
        ignore_mismatched_sizes=True,
    )
    with torch.no_grad():  # a head that spreads its predictions, so that the correlation is well defined
        plain_model.classifier.weight.normal_(0.0, 1.0)
    plain_model.save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    model = retrofit(
        load_model(tmp_path / "plain", model_class=AutoModelForSequenceClassification), "fixed", init="random"
    )
    with torch.no_grad():  # a strong positional bias
        for name, param in model.named_parameters():
            if "posprobe_mechanisms" in name:
                param.normal_(0.0, 3.0)
    save_retrofitted(model, tmp_path / "retro")
    tokenizer.save_pretrained(tmp_path / "retro")
    texts = load_split("stsb", "validation", data).texts
    expected = _logits_one_by_one(model, tokenizer, texts)
    plain = _logits_one_by_one(plain_model, tokenizer, texts)
    assert np.abs(expected - plain).max() > 1e-2

    seen = _capture_predictions(monkeypatch)
    retro_result = evaluate(tmp_path / "retro", "stsb", data)
    plain_result = evaluate(tmp_path / "plain", "stsb", data)
    np.testing.assert_allclose(seen[0], expected, atol=1e-5)
    np.testing.assert_allclose(seen[1], plain, atol=1e-5)
    assert retro_result["mechanism"] == "fixed" and plain_result["mechanism"] == "none"
    labels = np.array(load_split("stsb", "validation", data).labels)
    pearson = float(np.corrcoef(expected[:, 0], labels)[0, 1])
    assert retro_result["metrics"][0]["pearson"] == pytest.approx(pearson, abs=1e-5)
    assert abs(retro_result["metrics"][0]["pearson"] - plain_result["metrics"][0]["pearson"]) > 1e-3


def test_evaluate_refuses_a_checkpoint_without_a_head(tiny_model, sst2_dir, tmp_path, capsys):
    """Issue 14 §3: a base model (no classifier weights) is not scored with a random head unless asked."""
    from transformers import AutoTokenizer, BertModel

    base = tmp_path / "base"
    BertModel.from_pretrained(tiny_model).save_pretrained(base)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(base)
    capsys.readouterr()
    code, stdout, stderr = _run_cli(["evaluate", str(base), "--task", "sst2", "--data-dir", str(sst2_dir)], capsys)
    assert code == 2 and stdout == ""
    errors = [line for line in stderr.splitlines() if line.startswith("posprobe: error: ")]
    assert len(errors) == 1 and stderr.strip().endswith(errors[0].split()[-1]) and "Traceback" not in stderr
    assert stderr.strip().splitlines() == errors  # the model is checked before the data is read: nothing else
    assert "no trained classification head" in stderr and "classifier.weight" in stderr
    assert "--allow-new-head" in stderr
    code, stdout, stderr = _run_cli(
        ["evaluate", str(base), "--task", "sst2", "--data-dir", str(sst2_dir), "--allow-new-head", "--json"], capsys
    )
    assert code == 0, stderr[-2000:]
    assert 0.0 <= json.loads(stdout)["metrics"][0]["accuracy"] <= 1.0


# ----------------------------------------------------------------------------------------------------
# the library API: validated config, result object, quiet by default


@pytest.mark.parametrize(
    ("field", "value", "error", "words"),
    [
        ("epochs", "1", TypeError, "epochs must be a number"),
        ("epochs", 0, ValueError, "epochs must be positive"),
        ("lr", -1e-5, ValueError, "lr must be positive"),
        ("batch_size", 2.5, TypeError, "batch_size must be a whole number"),
        ("kernels", 0, ValueError, "kernels must be at least 1"),
        ("radius", "8", TypeError, "radius must be a whole number"),
        ("seeds", 3, TypeError, "seeds must be a list"),
        ("max_train_samples", 0, ValueError, "max_train_samples must be at least 1"),
        ("resume", "yes", TypeError, "resume must be True or False"),
        ("task", "colaa", ValueError, "unknown GLUE task 'colaa'"),
        ("mechanism", "nope", ValueError, "unknown mechanism 'nope'"),
        ("init", "bogus", ValueError, "unknown init 'bogus'"),
    ],
)
def test_config_fields_are_validated_at_construction(tmp_path, field, value, error, words):
    from posprobe.errors import ArgumentError
    from posprobe.glue import FinetuneConfig

    settings = {"task": "sst2", "out": tmp_path / "run", "mechanism": "tisa" if field == "init" else "none"}
    with pytest.raises(error) as err:
        FinetuneConfig(**{**settings, field: value})
    assert isinstance(err.value, ArgumentError) and err.value.argument == field
    assert words in str(err.value)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--epochs", "-1"], "--epochs must be positive"),
        (["--mechanism", "tisa", "--kernels", "0"], "--kernels must be at least 1"),
        (["--mechanism", "fixed", "--radius", "0"], "--radius must be at least 1"),
        (["--mechanism", "tisa", "--init", "bogus"], "unknown --init 'bogus'"),
        (["--max-train-samples", "0"], "--max-train-samples must be at least 1"),
    ],
)
def test_cli_refuses_bad_settings_before_any_work(tmp_path, capsys, flags, words):
    code, stdout, stderr = _run_cli(["finetune", "--task", "sst2", "--out", str(tmp_path / "run"), *flags], capsys)
    assert code == 2 and stdout == "" and stderr.count("\n") == 1
    assert words in stderr, stderr
    assert not (tmp_path / "run").exists()


def test_library_finetune_returns_a_result_and_is_quiet(tiny_model, sst2_dir, tmp_path, capfd):
    from posprobe.errors import ArgumentValueError
    from posprobe.glue import FinetuneResult, finetune

    capfd.readouterr()
    result = finetune(task="sst2", model=tiny_model, data_dir=sst2_dir, out=tmp_path / "run", max_steps=2, batch_size=8)
    printed = capfd.readouterr()
    assert printed.out == "" and printed.err == ""  # no {'train_runtime': ...}, no bars, no load reports
    assert isinstance(result, FinetuneResult) and result.seeds == [0]
    text = repr(result)
    assert "\n" not in text and len(text) < 300 and "accuracy=" in text and "sst2" in text
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert result.to_dict(settings=True) == saved
    assert result.model_dirs[0] == tmp_path / "run" / "seed-0" / "model"
    model = result.load_model(seed=0)
    assert model.config.num_labels == 2 and type(model).__name__ == "BertForSequenceClassification"
    with pytest.raises(ArgumentValueError, match="no model for seed 5"):
        result.load_model(seed=5)


def test_cli_model_argument_default_out_and_json_matches_library(tiny_model, sst2_dir, tmp_path, capsys, monkeypatch):
    """MODEL is an argument (`--model` kept as an alias); the default run folder is
    posprobe-out/finetune/<model label>/<task>-<mechanism>; `--json` equals `FinetuneResult.to_dict()`."""
    monkeypatch.chdir(tmp_path)
    argv = ["finetune", str(tiny_model), "--task", "sst2", "--data-dir", str(sst2_dir), "--json"]
    code, stdout, stderr = _run_cli([*argv, "--epochs", "1", "--batch-size", "16"], capsys)
    assert code == 0, stderr[-2000:]
    out = Path("posprobe-out") / "finetune" / tiny_model.name / "sst2-none"
    printed = json.loads(stdout)
    saved = json.loads((out / "results.json").read_text())
    assert printed == {k: v for k, v in saved.items() if k != "settings"}
    assert {"task", "mechanism", "model", "seeds", "metrics", "median", "mean", "stderr", "seconds"} <= set(printed)
    assert "64 examples from" in stderr
    code, _, stderr = _run_cli(["finetune", str(tiny_model), "--model", "other", "--task", "sst2"], capsys)
    assert code == 2 and "two models given" in stderr
    # a failed run into the default folder leaves none of the folders it created
    code, _, stderr = _run_cli(["finetune", str(tiny_model), "--task", "cola", "--data-dir", str(sst2_dir)], capsys)
    assert code == 2 and "no cola 'train' data" in stderr
    assert not (Path("posprobe-out") / "finetune" / tiny_model.name / "cola-none").exists()
    assert sorted(p.name for p in (Path("posprobe-out") / "finetune" / tiny_model.name).iterdir()) == ["sst2-none"]


# ----------------------------------------------------------------------------------------------------
# one run per folder, full disks, no empty folders


@pytest.mark.slow
def test_second_run_into_a_locked_folder_refuses_at_once_or_waits(tiny_model, sst2_dir, tmp_path):
    import fcntl
    import threading
    import time

    from posprobe.glue import finetune

    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another run holds the folder
    try:
        started = time.perf_counter()
        with pytest.raises(PosprobeError, match="in use by another fine-tuning run"):
            finetune(_config(tiny_model, sst2_dir, out, max_steps=1))
        assert time.perf_counter() - started < 5
        assert list(out.iterdir()) == []
        threading.Timer(1.0, os.close, args=(fd,)).start()  # the other run finishes in a second
        waited = finetune(_config(tiny_model, sst2_dir, out, max_steps=1), wait=True)
        fd = None
    finally:
        if fd is not None:
            os.close(fd)
    assert waited.seeds == [0] and (out / "results.json").is_file()


def test_full_disk_while_writing_results_is_one_clean_error(tiny_model, sst2_dir, tmp_path, monkeypatch):
    """ENOSPC (simulated: the write stops half-way) is one PosprobeError; no results file, no temporary file."""
    import errno

    from posprobe.glue import finetune

    original = Path.write_text

    def full_disk(self, text, *args, **kwargs):
        if self.name.startswith(".results.json"):
            original(self, text[: len(text) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    out = tmp_path / "run"
    with pytest.raises(PosprobeError, match="no space left on the device") as err:
        finetune(_config(tiny_model, sst2_dir, out, max_steps=1))
    assert "\n" not in str(err.value)
    assert not out.exists() or not [p for p in out.rglob("*results*")]


@pytest.fixture
def small_filesystem(tmp_path):
    """A 2 MiB tmpfs (needs root; skipped otherwise), unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_full_disk_on_a_real_small_filesystem(tiny_model, sst2_dir, small_filesystem, capsys):
    """A real full disk: the checkpoint does not fit; one error line, exit 2, and the run folder (created by
    this run, nothing to resume in it) is gone."""
    (small_filesystem / "filler").write_bytes(b"\0" * (2 * 1024 * 1024 - 64 * 1024))  # leave ~64 KiB
    out = small_filesystem / "run"
    code, stdout, stderr = _run_cli(
        ["finetune", str(tiny_model), "--task", "sst2", "--data-dir", str(sst2_dir), "--out", str(out)]
        + ["--epochs", "1", "--batch-size", "16"],
        capsys,
    )
    assert code == 2, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("posprobe: error: no space left on the device"), stderr[-2000:]
    assert "Traceback" not in stderr and not out.exists(), sorted(str(p) for p in out.rglob("*"))


# ----------------------------------------------------------------------------------------------------
# real processes: Ctrl-C, two runs at once (slow)


def _cli_process(args: list[str], cwd: Path) -> subprocess.Popen:
    """`posprobe ARGS` in its own process group, with SIGINT at its default (a background shell ignores it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        ["env", "--default-signal=INT", sys.executable, "-m", "posprobe", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_ctrl_c_during_finetune_exits_130_with_nothing_half_written(tiny_model, sst2_dir, tmp_path):
    import signal
    import time

    out = tmp_path / "run"
    proc = _cli_process(
        ["finetune", str(tiny_model), "--task", "sst2", "--data-dir", str(sst2_dir), "--out", str(out), "--json"]
        + ["--epochs", "2000", "--batch-size", "8", "--save-steps", "10"],
        tmp_path,
    )
    deadline = time.monotonic() + 120
    while not list(out.glob("seed-0/checkpoint-*/trainer_state.json")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert json.loads(stdout)["exit_code"] == 130  # --json: the error object, no results
    assert stderr.strip().splitlines()[-1].startswith("posprobe: error: interrupted"), stderr[-2000:]
    assert "Traceback" not in stderr
    assert not (out / "results.json").exists() and not (out / "results.md").exists()
    assert not (out / "seed-0" / "model").exists() and not list(out.rglob("*.partial"))
    for ckpt in out.glob("seed-0/checkpoint-*"):  # resume checkpoints may stay, but only complete ones
        assert (ckpt / "trainer_state.json").is_file()


def _start_a_run_into(out: Path, tiny_model, sst2_dir, tmp_path):
    """Start `finetune` seed 0 into `out` as a real process and wait until it has written run.json; returns
    (the command's common arguments, the process)."""
    import time

    common = ["finetune", str(tiny_model), "--task", "sst2", "--data-dir", str(sst2_dir), "--out", str(out)]
    common += ["--epochs", "3", "--batch-size", "8"]
    first = _cli_process([*common, "--seed", "0"], tmp_path)
    deadline = time.monotonic() + 120
    while not (out / "run.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return common, first


@pytest.mark.slow
def test_two_runs_started_at_once_into_one_folder(tiny_model, sst2_dir, tmp_path):
    """Issue 14 §5: both used to exit 0 and results.json lost a seed. Now the second refuses at once; with
    --wait it queues behind the first and then resumes it (both seeds end up in results.json)."""
    out = tmp_path / "run"
    common, first = _start_a_run_into(out, tiny_model, sst2_dir, tmp_path)
    second = _cli_process([*common, "--seed", "1"], tmp_path)
    _, err2 = second.communicate(timeout=120)
    assert second.returncode == 2 and "in use by another fine-tuning run" in err2, err2[-2000:]
    third = _cli_process([*common, "--seeds", "2", "--resume", "--wait"], tmp_path)
    _, err1 = first.communicate(timeout=240)
    _, err3 = third.communicate(timeout=240)
    assert first.returncode == 0, err1[-2000:]
    assert third.returncode == 0, err3[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [0, 1] and len(results["metrics"]) == 2


def test_library_default_out_is_the_clis(tiny_model):
    from posprobe.glue import FinetuneConfig

    config = FinetuneConfig(task="SST-2", model=tiny_model, mechanism="tisa")
    assert config.out == Path("posprobe-out") / "finetune" / tiny_model.name / "sst2-tisa"
    assert FinetuneConfig(task="cola").out == Path("posprobe-out") / "finetune" / "all-MiniLM-L6-v2" / "cola-none"


# ----------------------------------------------------------------------------------------------------
# reviewer defects: resume with a new seed, --wait --resume, progress only on a terminal


@pytest.mark.slow
def test_resume_with_a_new_seed_keeps_the_finished_seeds(tiny_model, sst2_dir, tmp_path):
    """`--seed 0`, then `--seed 1 --resume` into the same folder: results hold both seeds (seed 0 reused)."""
    from posprobe.glue import finetune

    out = tmp_path / "run"
    first = finetune(_config(tiny_model, sst2_dir, out, max_steps=2))
    second = finetune(_config(tiny_model, sst2_dir, out, max_steps=2, seeds=[1], resume=True))
    assert second.seeds == [0, 1] and second.metrics[0] == first.metrics[0]
    assert set(second.model_dirs) == {0, 1} and len(second.seconds_per_seed) == 2
    saved = json.loads((out / "results.json").read_text())
    assert saved["seeds"] == [0, 1] and saved["metrics"] == second.metrics
    assert "| 0 |" in (out / "results.md").read_text() and "| 1 |" in (out / "results.md").read_text()
    with pytest.raises(PosprobeError, match="different settings"):  # seeds may change, settings may not
        finetune(_config(tiny_model, sst2_dir, out, max_steps=3, seeds=[2], resume=True))


@pytest.mark.slow
def test_plain_wait_into_a_folder_holding_a_run_refuses_before_waiting(tiny_model, sst2_dir, tmp_path):
    """A run is in progress in `out` (lock held, run.json written): `wait=True` without `resume` would only be
    refused once the lock is free, so it is refused at once; with `resume` it queues and adds its seed."""
    import fcntl
    import threading
    import time

    from posprobe.glue import finetune

    out = tmp_path / "run"
    finetune(_config(tiny_model, sst2_dir, out, max_steps=1))
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # run A holds the folder
    try:
        release = threading.Timer(20.0, fcntl.flock, args=(fd, fcntl.LOCK_UN))  # (old code: no deadlock)
        release.start()
        started = time.perf_counter()
        with pytest.raises(PosprobeError, match="already holds a fine-tuning run"):
            finetune(_config(tiny_model, sst2_dir, out, max_steps=1, seeds=[1]), wait=True)
        release.cancel()
        assert time.perf_counter() - started < 5
        threading.Timer(1.0, os.close, args=(fd,)).start()  # A finishes in a second
        queued = finetune(_config(tiny_model, sst2_dir, out, max_steps=1, seeds=[1], resume=True), wait=True)
        fd = None
    finally:
        if fd is not None:
            os.close(fd)
    assert queued.seeds == [0, 1]


@pytest.mark.slow
def test_cli_progress_stays_off_when_stderr_is_not_a_terminal(tiny_model, sst2_dir, tmp_path, capsys):
    """Piped / CI output: no progress bars and no `{'train_runtime': ...}` dicts on stderr."""
    code, stdout, stderr = _run_cli(
        ["finetune", str(tiny_model), "--task", "sst2", "--data-dir", str(sst2_dir), "--out", str(tmp_path / "r")]
        + ["--epochs", "1", "--batch-size", "16"],
        capsys,
    )
    assert code == 0, stderr[-2000:]
    assert "train_runtime" not in stderr and "it/s" not in stderr and "%|" not in stderr, stderr[-2000:]


@pytest.mark.slow
def test_wait_resume_queues_a_second_seed_behind_a_running_run(tiny_model, sst2_dir, tmp_path):
    """Real processes: A runs seed 0; B (`--seed 1 --resume --wait`) queues and adds seed 1; C (plain
    `--wait`, seed 2) is refused at once because the folder holds a run."""
    out = tmp_path / "run"
    common, first = _start_a_run_into(out, tiny_model, sst2_dir, tmp_path)
    second = _cli_process([*common, "--seed", "1", "--resume", "--wait"], tmp_path)
    third = _cli_process([*common, "--seed", "2", "--wait"], tmp_path)
    _, err3 = third.communicate(timeout=120)
    assert third.returncode == 2 and "already holds a fine-tuning run" in err3, err3[-2000:]
    assert first.poll() is None or not (out / "seed-1").exists()  # C did not wait for A
    _, err1 = first.communicate(timeout=240)
    _, err2 = second.communicate(timeout=240)
    assert first.returncode == 0, err1[-2000:]
    assert second.returncode == 0, err2[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [0, 1] and len(results["metrics"]) == 2


# ----------------------------------------------------------------------------------------------------
# the grid: tasks x mechanisms x seeds in one folder, paired statistics


@pytest.mark.slow
def test_cli_grid_json_layout_and_paired_cells(tiny_model, sst2_dir, tmp_path, capsys):
    """`--mechanism none,fixed --seeds 2`: one cell folder per mechanism, `--json` with `runs` and `summary`
    (SPEC §12), results.md / .png; the `none` cell's seed equals a plain single run with that seed (same
    seed, same data order: the cells are paired)."""
    from posprobe.glue import finetune

    out = tmp_path / "grid"
    argv = ["finetune", str(tiny_model), "--task", "sst2", "--mechanism", "none,fixed", "--seeds", "2"]
    argv += ["--data-dir", str(sst2_dir), "--out", str(out), "--epochs", "2", "--batch-size", "8", "--lr", "3e-3"]
    argv += ["--max-train-samples", "16"]  # 4 steps a run
    code, stdout, stderr = _run_cli([*argv, "--json"], capsys)
    assert code == 0, stderr[-3000:]
    result = json.loads(stdout)
    assert result["tasks"] == ["sst2"] and result["mechanisms"] == ["none", "fixed"] and result["seeds"] == [0, 1]
    assert sorted((r["mechanism"], r["seed"]) for r in result["runs"]) == [
        ("fixed", 0),
        ("fixed", 1),
        ("none", 0),
        ("none", 1),
    ]
    assert all(set(r) == {"task", "mechanism", "seed", "metrics", "settings"} for r in result["runs"])
    for r in result["runs"]:  # each run states its own cell's settings, as its cell's run.json has them
        saved = json.loads((out / f"sst2-{r['mechanism']}" / "run.json").read_text())
        assert r["settings"] == {k: v for k, v in saved.items() if k in r["settings"]}
        assert r["settings"]["init"] == "zero" and "out" not in r["settings"] and "model_path" not in r["settings"]
    rows = {r["mechanism"]: r for r in result["summary"]}
    assert all(
        set(r) == {"task", "mechanism", "metric", "median", "mean", "stderr", "n", "delta"} for r in rows.values()
    )
    assert rows["none"]["delta"] is None and set(rows["fixed"]["delta"]) >= {"mean", "stderr", "ci95", "p_value"}
    acc = {(r["mechanism"], r["seed"]): r["metrics"]["accuracy"] for r in result["runs"]}
    assert rows["fixed"]["delta"]["mean"] == pytest.approx(
        (acc[("fixed", 0)] - acc[("none", 0)] + acc[("fixed", 1)] - acc[("none", 1)]) / 2
    )
    assert "[1/4] sst2 × none, seed 0" in stderr and "[4/4] sst2 × fixed, seed 1" in stderr
    assert "paired difference vs `none`" in " ".join(stderr.split())
    for name in ("grid.json", "results.json", "results.md", "results.png"):
        assert (out / name).is_file(), name
    assert (out / "sst2-fixed" / "seed-1" / "model" / "config.json").is_file()
    cell = json.loads((out / "sst2-none" / "results.json").read_text())
    assert cell["seeds"] == [0, 1]  # a cell is a plain run folder holding every seed
    single = finetune(_config(tiny_model, sst2_dir, tmp_path / "single", seeds=[1], warmup=0.1, max_train_samples=16))
    assert single.metrics[0]["accuracy"] == acc[("none", 1)]
    assert _max_weight_diff(tmp_path / "single" / "seed-1" / "model", out / "sst2-none" / "seed-1" / "model") <= 1e-6
    code, _, stderr = _run_cli(argv, capsys)  # the folder holds a grid: only --resume may continue it
    assert code == 2 and "already holds a fine-tuning grid" in stderr and "--resume" in stderr


@pytest.mark.slow
def test_grid_resume_after_a_kill_does_not_redo_finished_cells(tiny_model, sst2_dir, tmp_path):
    from transformers import TrainerCallback

    from posprobe.glue.grid import finetune_grid

    class Count(TrainerCallback):
        def __init__(self, kill_at=None):
            self.started = 0
            self.kill_at = kill_at

        def on_train_begin(self, args, state, control, **kwargs):
            self.started += 1
            if self.started == self.kill_at:
                raise KeyboardInterrupt("simulated kill")

    settings = dict(model=str(tiny_model), data_dir=sst2_dir, max_steps=2, batch_size=8, seeds=[0, 1])
    out = tmp_path / "grid"
    with pytest.raises(KeyboardInterrupt):
        finetune_grid(["sst2"], ["none", "tisa"], out=out, callbacks=[Count(kill_at=3)], **settings)
    assert (out / "sst2-tisa" / "seed-0" / "metrics.json").is_file() and not (out / "results.json").exists()
    with pytest.raises(PosprobeError, match="different mechanisms"):
        finetune_grid(["sst2"], ["none", "fixed"], out=out, resume=True, **settings)
    count = Count()
    result = finetune_grid(["sst2"], ["none", "tisa"], out=out, resume=True, callbacks=[count], **settings)
    assert count.started == 2  # seed 1 of both cells; seed 0 (finished before the kill) is read back
    assert len(result.runs) == 4 and result.seeds == [0, 1]
    assert json.loads((out / "results.json").read_text())["runs"] == result.runs
    with pytest.raises(PosprobeError, match="different settings .*max_steps"):  # all cells finished: still checked
        finetune_grid(["sst2"], ["none", "tisa"], out=out, resume=True, **{**settings, "max_steps": 3})


def test_grid_cells_keep_their_own_settings(tmp_path):
    """`--init fit` applies to TISA only: the tisa cell's settings say `fit`, the others `zero`, and the grid's
    shared settings hold no `init` (they used to hold the first cell's, `zero`, for every cell)."""
    from posprobe.glue.grid import _shared, cell_settings, grid_configs

    configs = grid_configs(["sst2"], ["none", "tisa", "fixed"], tmp_path, [0], init="fit", lr=1e-4)
    own = {m: cell_settings(c) for (_, m), c in configs.items()}
    assert {m: s["init"] for m, s in own.items()} == {"none": "zero", "tisa": "fit", "fixed": "zero"}
    shared = _shared(configs)
    assert "init" not in shared and shared["lr"] == 1e-4
    assert all(s[k] == v for s in own.values() for k, v in shared.items())
    folder = configs[("sst2", "tisa")].out  # a cell's run.json (written by its run) wins: it names the kernels file
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({**configs[("sst2", "tisa")].settings(), "fitted_kernels": "k.json"}))
    assert cell_settings(configs[("sst2", "tisa")])["fitted_kernels"] == "k.json"


def test_grid_refuses_bad_lists_before_any_work(tmp_path, capsys):
    for flags, words in (
        (["--task", "sst2,colaa", "--mechanism", "none,tisa"], "unknown GLUE task 'colaa'"),
        (["--task", "sst2", "--mechanism", "none,tisa,none"], "lists 'none' twice"),
        (["--task", "sst2", "--mechanism", "none,nope"], "mechanism 'nope'"),
    ):
        code, stdout, stderr = _run_cli(["finetune", *flags, "--out", str(tmp_path / "g")], capsys)
        assert code == 2 and stdout == "" and words in stderr, stderr
        assert not (tmp_path / "g").exists()


# ----------------------------------------------------------------------------------------------------
# check on our own training: `finetune --mechanism none` = a plain Hugging Face Trainer script


def _plain_trainer_run(model_dir: Path, data_dir: Path, out: Path, *, seed: int, epochs: float, lr: float, batch: int):
    """What a user would write with transformers alone: tokenise, Trainer, train, predict; (accuracy, folder)."""
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    def rows(split):
        return [json.loads(line) for line in (data_dir / "sst2" / f"{split}.jsonl").read_text().splitlines()]

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(split):
        data = rows(split)
        enc = tokenizer([r["sentence"] for r in data], truncation=True, max_length=128)
        return [
            {"input_ids": i, "token_type_ids": t, "attention_mask": m, "label": r["label"]}
            for i, t, m, r in zip(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"], data)
        ]

    set_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=batch,
        num_train_epochs=epochs,
        learning_rate=lr,
        weight_decay=0.01,
        warmup_steps=0.1,
        seed=seed,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=encode("train"), data_collator=DataCollatorWithPadding(tokenizer)
    )
    trainer.train()
    dev = encode("validation")
    logits = trainer.predict(dev).predictions
    accuracy = float(np.mean(np.argmax(logits, -1) == np.array([d["label"] for d in dev])))
    trainer.save_model(str(out / "model"))
    return accuracy, out / "model"


@pytest.mark.slow
def test_finetune_none_matches_a_plain_trainer_script(tiny_model, sst2_dir, tmp_path, capsys):
    """Same tiny model, data, seed and hyper-parameters (lr 3e-3, 6 epochs, batch 8, 10% warm-up, weight
    decay 0.01, linear decay): `posprobe finetune --mechanism none` and a plain `Trainer` script reach the
    same dev accuracy and the same weights. Tolerance: weights within 1e-5 — both runs draw the head
    initialisation and the data order from the same seed and the tiny model has no dropout, so the only
    allowed difference is float summation order (e.g. posprobe's explicit `data_seed`, id2label config
    entries and its loading path change no numbers); with dropout on, seed noise would be the yardstick."""
    argv = ["finetune", str(tiny_model), "--task", "sst2", "--mechanism", "none", "--data-dir", str(sst2_dir)]
    argv += ["--out", str(tmp_path / "posprobe"), "--seed", "0", "--epochs", "6", "--lr", "3e-3"]
    argv += ["--batch-size", "8", "--json"]
    code, stdout, stderr = _run_cli(argv, capsys)
    assert code == 0, stderr[-2000:]
    ours = json.loads(stdout)["metrics"][0]["accuracy"]
    plain, plain_dir = _plain_trainer_run(tiny_model, sst2_dir, tmp_path / "plain", seed=0, epochs=6, lr=3e-3, batch=8)
    assert ours == pytest.approx(plain, abs=1e-9), (ours, plain)
    assert ours >= 0.75  # and the run learned the task
    assert _max_weight_diff(tmp_path / "posprobe" / "seed-0" / "model", plain_dir) <= 1e-5


@pytest.mark.slow
def test_grid_under_torchrun_two_processes(tiny_model, sst2_dir, tmp_path):
    """A grid under `torchrun --nproc_per_node=2`: one process group for all cells, one JSON object on stdout,
    and the same metrics as the grid in one process (within one flipped dev prediction)."""
    from posprobe.glue.grid import finetune_grid

    settings = dict(model=str(tiny_model), data_dir=sst2_dir, epochs=1, batch_size=8, lr=3e-3, seeds=[0, 1])
    one = finetune_grid(["sst2"], ["none", "fixed"], out=tmp_path / "one", **settings)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "posprobe"]
    cmd += ["finetune", str(tiny_model), "--task", "sst2", "--mechanism", "none,fixed", "--seeds", "2"]
    cmd += ["--data-dir", str(sst2_dir), "--epochs", "1", "--lr", "3e-3", "--batch-size", "8"]
    cmd += ["--out", str(tmp_path / "two"), "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    two = json.loads(lines[0])
    ours = {(r["mechanism"], r["seed"]): r["metrics"]["accuracy"] for r in one.runs}
    theirs = {(r["mechanism"], r["seed"]): r["metrics"]["accuracy"] for r in two["runs"]}
    assert ours.keys() == theirs.keys()
    assert all(abs(ours[k] - theirs[k]) <= 1 / 32 + 1e-9 for k in ours)


def test_finetune_of_a_checkpoint_with_nan_weights_is_one_line(tiny_model, sst2_dir, tmp_path, capsys):
    """Issue 23: the weights are checked before the data is read, so one bad input is one stderr line."""
    import shutil

    from safetensors.numpy import load_file, save_file

    broken = tmp_path / "nan-model"
    shutil.copytree(tiny_model, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("attention.self.query.weight"))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "run"
    code, stdout, stderr = _run_cli(
        ["finetune", str(broken), "--task", "sst2", "--data-dir", str(sst2_dir), "--out", str(out)], capsys
    )
    assert code == 2 and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posprobe: error: ") and "NaN" in lines[0], stderr
