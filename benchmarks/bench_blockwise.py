"""Blockwise attention statistics (SPEC §19, issue 37): peak memory of `posprobe.attention_profiles` on one text of
N tokens of a tiny rotary Llama (2 layers x 2 heads, hidden 32, float32; `bench_scale.tiny_llama`), one fresh
process per (length, way), against the process that only loads the model (the baseline):

- `blocks`: the blockwise route in blocks of 128 query rows (`block_size=128`; the default blocks of 16k tokens of
  2 heads are as large), no n x n mean score matrix (`mean_scores=False`): what grows with N;
- `default`: `attention_profiles` as a user calls it (blocks where whole matrices would take >= 256 MiB; the mean
  score matrix kept while its n x n sums take at most 1 GiB, n <= 4729 here);
- `old`: the whole-matrix route with the mean score matrix (`block_size=0, mean_scores=True`), the way before
  blocks, run where it fits (`--old-up-to`);
- `weights` (only with `--ways ... weights`): `default` with the weights-based profile and its correlation as well
  (`weights_correlation=True`, the library's and CLI's default).
The first three do not read the weights-based profile (`weights_correlation=False`).

Every run writes its profiles; the table's last column is the largest difference of `blocks`' score and probability
profiles, mean distances and first-token masses from `old`'s at the same length (where `old` ran).

    python benchmarks/bench_blockwise.py --lengths 1024 2048 4096 8192 12288 16384 --old-up-to 4096
    python benchmarks/bench_blockwise.py --lengths 12288 --ways baseline weights
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import _env, tiny_llama  # noqa: E402

_RUN = """
import json, resource, sys
import numpy as np
import posprobe
n, folder, way, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
ids = [[5 + (7 * i) % 60 for i in range(n)]]
options = {"blocks": dict(block_size=128, mean_scores=False, weights_correlation=False)}
options["default"] = dict(weights_correlation=False)
options |= {"old": dict(block_size=0, mean_scores=True, weights_correlation=False), "weights": {}}
if way == "baseline":
    from transformers import AutoModel
    AutoModel.from_pretrained(folder)
else:
    r = posprobe.attention_profiles(folder, input_ids=ids, max_length=n, **options[way])
    p = r.profiles
    np.savez(out, score=p.score_profiles, prob=p.prob_profiles, distance=p.mean_distance,
             first=r.sinks.first_token_mass, kept=p.mean_scores is not None)
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
"""

WAYS = ("baseline", "blocks", "default", "old", "weights")
HEADERS = {"baseline": "baseline peak (GiB)", "blocks": "blocks", "default": "default", "old": "old (whole matrices)"}
HEADERS["weights"] = "default + weights profile"


def _gap(a: Path, b: Path) -> float:
    x, y = np.load(a), np.load(b)
    gaps = []
    for name in ("score", "prob", "distance", "first"):
        u, v = x[name], y[name]
        assert np.array_equal(np.isnan(u), np.isnan(v)), name
        scale = max(float(np.nanmax(np.abs(v))), 1e-30)
        gaps.append(float(np.nanmax(np.abs(u - v))) / scale)
    return max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 12288, 16384])
    parser.add_argument("--old-up-to", type=int, default=4096, help="longest text the whole-matrix way runs on")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS[:4]))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        tiny_llama(folder, max(args.lengths))
        print(
            "baseline: peak RSS (GiB); the others: peak RSS minus the baseline's; seconds of each process in brackets"
        )
        ways = [w for w in WAYS if w in args.ways]
        print("| tokens | " + " | ".join(HEADERS[w] for w in ways) + " | blocks vs old: rel. gap |")
        print("|---:|" + "---:|" * (len(ways) + 1))
        for n in args.lengths:
            cells, peaks = {}, {}
            for way in ways:
                if way == "old" and n > args.old_up_to:
                    cells[way] = "—"
                    continue
                out = Path(tmp) / f"{way}-{n}.npz"
                started = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, "-c", _RUN, str(n), str(folder), way, str(out)],
                    env=_env(1), capture_output=True, text=True,
                )  # fmt: skip
                seconds = time.perf_counter() - started
                if proc.returncode != 0:
                    cells[way] = f"rc {proc.returncode}"
                    print(f"<!-- {n} {way}: rc {proc.returncode}: {proc.stderr.strip()[-300:]} -->", flush=True)
                    continue
                peaks[way] = json.loads(proc.stdout.strip().splitlines()[-1]) / 2**30
                cells[way] = f"{peaks[way] - peaks.get('baseline', 0.0):.2f} ({seconds:.0f} s)"
                if way == "baseline":
                    cells[way] = f"{peaks[way]:.2f}"
            gap = "—"
            if "old" in peaks and "blocks" in peaks:
                gap = f"{_gap(Path(tmp) / f'blocks-{n}.npz', Path(tmp) / f'old-{n}.npz'):.1e}"
            print(f"| {n} | " + " | ".join(cells[w] for w in ways) + f" | {gap} |", flush=True)


if __name__ == "__main__":
    main()
