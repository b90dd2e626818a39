"""Issue 47 (benchmarks/RESULTS.md §34): the no-hidden-state baselines of `posprobe states` on CoLA dev (1,043
sentences), with each model's own tokenizer (special tokens added as `states` adds them, truncated to 128).

The baseline depends only on which token is first and how long each text is, so a tiny random model of the same
kind (causal or bidirectional) run on the real token ids gives the real model's baseline. Both kinds are run for
every tokenizer: the causal one is what `states` now reports for SmolLM2 and Gemma (the first-token flag), the
bidirectional one what it reported before (flag + text length). An independent check: the tests' scikit-learn
nested ridge on the flag, the length and both.

Run from the repository root: `PYTHONPATH=.:tests python benchmarks/states_baselines.py`; COLA (default
../shared/data/glue/cola/validation.jsonl), GEMMA (the Gemma 3 270M GGUF file, assembled by its package's
`assemble`), OUT (where baselines.json goes; default .).
"""

import json
import os

import numpy as np
import torch
import transformers as tf
from sklearn.metrics import r2_score
from test_states_analysis import sklearn_probe

import posprobe
from posprobe.checkpoint import resolve_model
from posprobe.checkpoint.loading import load_tokenizer

COLA = os.environ.get("COLA", "../shared/data/glue/cola/validation.jsonl")
GEMMA = os.environ.get("GEMMA", "/tmp/readings/gemma3/gemma-3-270m-q4_k_m.gguf")
MODELS = (("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"), ("Gemma 3 270M", GEMMA), ("all-MiniLM-L6-v2", None))


def tiny(kind: str, vocab: int):
    torch.manual_seed(0)
    sizes = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vocab_size=vocab,
                 max_position_embeddings=256)  # fmt: skip
    if kind == "causal":
        return tf.LlamaModel(tf.LlamaConfig(**sizes)).eval()
    return tf.BertModel(tf.BertConfig(**sizes)).eval()


def main() -> None:
    texts = [json.loads(line)["sentence"] for line in open(COLA)]
    out = {}
    for name, model in MODELS:
        tokenizer = load_tokenizer(resolve_model(model, with_tokenizer=True).path)
        ids = [list(x) for x in tokenizer(texts, truncation=True, max_length=128)["input_ids"]]
        row = {"tokens": sum(map(len, ids)), "first_is_special": sum(x[0] in tokenizer.all_special_ids for x in ids)}
        for kind in ("causal", "bidirectional"):
            net = tiny(kind, max(max(x) for x in ids) + 1)
            result = posprobe.states(net, input_ids=ids, max_length=128, probe_layers=[0], null_draws=0, controls=1)
            p = result.probes
            row[kind] = {"baseline_inputs": list(p.baseline_inputs), "r2": p.r2_baseline, "mae": p.mae_baseline}
        y = np.concatenate([np.arange(len(x)) for x in ids]).astype(float)
        text_ids = np.concatenate([[i] * len(x) for i, x in enumerate(ids)])
        flag = (y == 0).astype(float)[:, None]
        length = np.concatenate([[len(x)] * len(x) for x in ids]).astype(float)[:, None]
        features = {"flag": flag, "length": length, "flag+length": np.concatenate([flag, length], 1)}
        row["sklearn"] = {k: float(r2_score(y, sklearn_probe(f, y, text_ids)[0])) for k, f in features.items()}
        out[name] = row
        print(name, json.dumps(row), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "baselines.json"), "w") as handle:
        json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
