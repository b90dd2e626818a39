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
    from posprobe.glue.train import FinetuneConfig

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
        progress=False,
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


def test_pair_regression_from_tsv(tiny_model, tmp_path):
    from posprobe.glue.train import finetune

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
    assert set(result["metrics"][0]) == {"pearson", "spearman"}
    assert all(v is None or -1.0 <= v <= 1.0 for v in result["metrics"][0].values())
    meta = json.loads((tmp_path / "run" / "seed-0" / "model" / "posprobe_glue.json").read_text())
    assert meta["task"] == "stsb" and meta["mechanism"] == "none"


def test_mnli_reports_matched_and_mismatched(tiny_model, tmp_path):
    from posprobe.glue.train import evaluate, finetune

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
    assert set(result["metrics"][0]) == {"accuracy", "accuracy_mismatched"}
    again = evaluate(tmp_path / "run" / "seed-0" / "model", "mnli", tmp_path / "glue")
    assert again["metrics"][0] == pytest.approx(result["metrics"][0])
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

    from posprobe.glue.train import finetune

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
    assert resumed["metrics"] == full["metrics"]
    assert _max_weight_diff(tmp_path / "full" / "seed-0" / "model", tmp_path / "killed" / "seed-0" / "model") <= 1e-6
    # resuming a finished run reuses its metrics instead of training again
    again = finetune(_config(tiny_model, sst2_dir, tmp_path / "killed", save_steps=4, resume=True, **extra))
    assert again["metrics"] == full["metrics"]


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
    from posprobe.glue.train import finetune

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
    for name, value in one["metrics"][0].items():
        assert abs(two["metrics"][0][name] - value) <= 1 / 32 + 1e-9
    assert _max_weight_diff(tmp_path / "one" / "seed-0" / "model", tmp_path / "two" / "seed-0" / "model") <= 1e-4


# ----------------------------------------------------------------------------------------------------
# errors and small helpers


def test_cli_bad_task_lists_valid_names(capsys):
    code, stdout, stderr = _run_cli(["finetune", "--task", "colaa"], capsys)
    assert code == 2 and stdout == ""
    assert "unknown GLUE task 'colaa'" in stderr and "sst2" in stderr and "wnli" in stderr


def test_unknown_mechanism_and_bad_init(tiny_model, sst2_dir, tmp_path):
    from posprobe.glue.train import finetune

    with pytest.raises(PosprobeError, match="unknown mechanism 'nope'"):
        finetune(_config(tiny_model, sst2_dir, tmp_path / "a", mechanism="nope"))
    with pytest.raises(PosprobeError, match="applies to --mechanism tisa only"):
        finetune(_config(tiny_model, sst2_dir, tmp_path / "b", mechanism="composite", init="fit"))
    for option in (dict(drop_position_embeddings=True), dict(init="random")):
        with pytest.raises(PosprobeError, match="need a positional mechanism"):
            finetune(_config(tiny_model, sst2_dir, tmp_path / "n", **option))
    with pytest.raises(PosprobeError, match="does not exist"):
        finetune(_config(tiny_model, sst2_dir, tmp_path / "c", mechanism="tisa", init=f"fit:{tmp_path}/none.st"))


def test_init_fit_fits_the_models_own_profiles(tiny_model, sst2_dir, tmp_path):
    """`--init fit` is the TISA paper's initialisation: kernels regressed onto the model's F̂_P profiles."""
    from posprobe.glue.train import finetune
    from posprobe.pipelines.fitting import load_tisa_kernels
    from posprobe.retrofit import load_model

    result = finetune(
        _config(tiny_model, sst2_dir, tmp_path / "fit", mechanism="tisa", init="fit", kernels=2, epochs=1)
    )
    a, b, c, meta = load_tisa_kernels(tmp_path / "fit" / "fit-tisa" / "tisa_kernels_S2.safetensors")
    assert a.shape == (2, 4, 2) and meta["model"] == str(tiny_model)
    assert result["mechanism"] == "tisa" and 0.0 <= result["metrics"][0]["accuracy"] <= 1.0
    model = load_model(tmp_path / "fit" / "seed-0" / "model")
    assert model.config.posprobe["mechanism"] == "tisa"


def test_finetuning_a_retrofitted_checkpoint_keeps_its_mechanism(tiny_model, sst2_dir, tmp_path):
    from posprobe.glue.train import finetune
    from posprobe.retrofit import load_model, retrofit, save_retrofitted

    save_retrofitted(retrofit(load_model(tiny_model), "composite", init="random"), tmp_path / "retro")
    result = finetune(_config(tmp_path / "retro", sst2_dir, tmp_path / "run", epochs=1))
    assert result["mechanism"] == "composite"
    tuned = load_model(tmp_path / "run" / "seed-0" / "model")
    assert tuned.config.posprobe["mechanism"] == "composite"
    with pytest.raises(PosprobeError, match="already retrofitted"):
        finetune(_config(tmp_path / "retro", sst2_dir, tmp_path / "again", mechanism="tisa"))


def test_mechanism_without_retrofit_module(tiny_model, sst2_dir, tmp_path, monkeypatch):
    from posprobe.glue.train import finetune

    monkeypatch.setitem(sys.modules, "posprobe.retrofit", None)  # makes `import posprobe.retrofit` fail
    with pytest.raises(PosprobeError, match="needs posprobe.retrofit"):
        finetune(_config(tiny_model, sst2_dir, tmp_path / "x", mechanism="tisa"))


def test_batch_size_must_divide_over_processes(tiny_model, sst2_dir, tmp_path, monkeypatch):
    from posprobe.glue.train import _training_args

    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(PosprobeError, match="not divisible by the 3 processes"):
        _training_args(_config(tiny_model, sst2_dir, tmp_path), tmp_path, 0)


def test_seed_list_and_aggregate():
    from posprobe.glue.train import aggregate, seed_list

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
