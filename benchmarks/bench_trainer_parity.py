"""Check on our own training (issue 12): `posprobe finetune --mechanism none` vs a plain Hugging Face `Trainer`
script with the same model, data, seed and hyper-parameters, at full scale on real GLUE data.

Both runs start from the packaged all-MiniLM-L6-v2, train on the whole train split of TASK (jsonl files of
`--data-dir`, e.g. ../shared/data/glue) for `--epochs` with linear decay, 10% warm-up, weight decay 0.01,
max length 128, and score the dev split. Prints one JSON object: each run's metric, their difference, the
largest absolute difference between the two fine-tuned models' weights, and each run's wall time.

    python benchmarks/bench_trainer_parity.py --task cola --data-dir ../shared/data/glue --epochs 1 \
        --batch-size 16 --lr 1e-4 --seed 0
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def plain_trainer(model_dir: Path, data_dir: Path, task: str, out: Path, args) -> tuple[dict, Path, float]:
    """What a user writes with transformers alone: tokenise, Trainer, train, predict. Returns (metrics, model
    folder, seconds)."""
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    from posprobe.glue.metrics import compute_metrics
    from posprobe.glue.tasks import get_task

    spec = get_task(task)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(split: str) -> list[dict]:
        rows = [json.loads(line) for line in (data_dir / task / f"{split}.jsonl").read_text().splitlines() if line]
        texts = [[r[c] for r in rows] for c in spec.text_fields]
        enc = tokenizer(*texts, truncation=True, max_length=128)
        return [{**{k: enc[k][i] for k in enc}, "label": r["label"]} for i, r in enumerate(rows)]

    start = time.perf_counter()
    set_seed(args.seed)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=spec.num_labels)
    training = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        weight_decay=0.01,
        warmup_steps=0.1,
        seed=args.seed,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training, train_dataset=encode("train"),
                      data_collator=DataCollatorWithPadding(tokenizer))  # fmt: skip
    trainer.train()
    dev_split = next(iter(spec.dev_splits))
    dev = encode(dev_split)
    logits = trainer.predict(dev).predictions
    labels = np.array([d["label"] for d in dev])
    metrics = compute_metrics(spec, logits, labels, split=dev_split)
    trainer.save_model(str(out / "model"))
    return metrics, out / "model", time.perf_counter() - start


def max_weight_difference(a: Path, b: Path) -> float:
    from safetensors.numpy import load_file

    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return max(float(abs(x[k].astype("float64") - y[k].astype("float64")).max()) for k in x.keys() & y.keys())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="cola")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "glue")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from posprobe.checkpoint import resolve_model

    model_dir = resolve_model(None).path
    with tempfile.TemporaryDirectory(prefix="posprobe-parity-") as tmp:
        tmp = Path(tmp)
        cmd = [sys.executable, "-m", "posprobe", "finetune", "--task", args.task, "--mechanism", "none"]
        cmd += ["--data-dir", str(args.data_dir), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
        cmd += ["--lr", str(args.lr), "--seed", str(args.seed), "--out", str(tmp / "posprobe"), "--json"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
        ours_seconds = time.perf_counter() - start
        ours = json.loads(proc.stdout)["metrics"][0]
        plain, plain_dir, plain_seconds = plain_trainer(model_dir, args.data_dir, args.task, tmp / "plain", args)
        weights = max_weight_difference(tmp / "posprobe" / f"seed-{args.seed}" / "model", plain_dir)
    report = {
        "task": args.task,
        "settings": vars(args) | {"data_dir": str(args.data_dir)},
        "posprobe": ours,
        "plain_trainer": plain,
        "difference": {k: ours[k] - plain[k] for k in ours if k in plain and None not in (ours[k], plain[k])},
        "max_weight_difference": weights,
        "seconds": {"posprobe": round(ours_seconds, 1), "plain_trainer": round(plain_seconds, 1)},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
