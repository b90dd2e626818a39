"""A short training run whose checkpoints `posprobe states --checkpoints` reads (figures/states/README.md).

Fine-tunes the packaged all-MiniLM-L6-v2 on a CoLA subset with `posprobe.glue.finetune` (mechanism none), saving a
Trainer checkpoint every `--save-steps` steps. `posprobe finetune` keeps at most two checkpoints while it trains and
removes them at the end, so a callback copies each one as it is saved (model, config, tokenizer and
trainer_state.json; not the optimizer state) into `--series`, which also gets the starting model as
`checkpoint-0`. Run from the repository root:

    python figures/states/train_series.py --data-dir ../shared/data/glue --series runs/minilm-cola-series
    posprobe states --checkpoints runs/minilm-cola-series --text ../shared/data/glue/cola/validation.jsonl \
        --column sentence --out figures/states/minilm-cola-series
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

KEEP = ("config.json", "model.safetensors", "trainer_state.json", "tokenizer.json", "tokenizer_config.json",
        "vocab.txt", "special_tokens_map.json")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--series", required=True, help="folder for the copied checkpoints")
    parser.add_argument("--run", default=None, help="the fine-tuning run folder (default: <series>-run)")
    parser.add_argument("--train-samples", type=int, default=4000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--save-steps", type=int, default=25)
    args = parser.parse_args()

    from transformers import TrainerCallback

    from posprobe.checkpoint.resolve import default_model_dir
    from posprobe.glue import finetune

    series = Path(args.series)
    series.mkdir(parents=True, exist_ok=True)
    start = series / "checkpoint-0"
    if not start.exists():
        start.mkdir()
        for name in KEEP:
            if (default_model_dir() / name).is_file():
                shutil.copy2(default_model_dir() / name, start / name)
        (start / "trainer_state.json").write_text(json.dumps({"global_step": 0}))

    class CopyCheckpoints(TrainerCallback):
        def on_save(self, args_, state, control, **kwargs):
            source = Path(args_.output_dir) / f"checkpoint-{state.global_step}"
            target = series / source.name
            target.mkdir(exist_ok=True)
            for name in KEEP:
                if (source / name).is_file():
                    shutil.copy2(source / name, target / name)

    result = finetune(
        task="cola",
        data_dir=args.data_dir,
        out=args.run or f"{series}-run",
        seeds=[0],
        epochs=args.epochs,
        lr=args.lr,
        max_train_samples=args.train_samples,
        save_steps=args.save_steps,
        callbacks=[CopyCheckpoints()],
    )
    print(json.dumps({"metrics": result.metrics, "series": sorted(p.name for p in series.iterdir())}))


if __name__ == "__main__":
    main()
