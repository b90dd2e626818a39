"""GPU benchmark: one training step of a BERT-base-sized retrofitted model with stock SDPA, stock eager attention,
today's score-bias path (a full `B x H x n x n` bias into SDPA), the explicit (eager) softmax with that bias, and
FlexAttention (`score_mod` reading per-head tables).

    python benchmarks/bench_flex.py [--batch 32] [--lengths 128,512,2048] [--mechanisms tisa,fixed,dynamic,composite]
                                    [--steps 10] [--warmup 3] [--out FILE.json]

Model: random weights, BERT-base shape (12 layers, 12 heads, hidden 768), attention dropout 0 (FlexAttention
has no attention dropout, so all variants do the same work), `max_position_embeddings` = the longest length
so that the stock model can run it; retrofitted variants drop the position embeddings (`--drop-position-
embeddings`, TISA "replace"). Each variant runs in a fresh subprocess over the lengths in ascending order (one
FlexAttention compilation per variant: `dynamic=True`); reported: median step time
(forward + backward + optimizer-free gradient clear, `torch.cuda.synchronize()` around each step) over
`--steps` steps after `--warmup` steps (which include FlexAttention's compilation), peak CUDA memory
(`max_memory_allocated`), and both as ratios to stock SDPA. An out-of-memory run is reported as OOM.
Needs a CUDA GPU (`--device cpu` only smoke-tests the stock and today's paths: FlexAttention has no CPU
backward).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> list[dict]:
    """One variant at every length (ascending; after an out-of-memory length the longer ones are not tried)."""
    import time

    import torch
    from transformers import BertConfig, BertModel

    sys.path.insert(0, str(ROOT))
    import posprobe.mechanisms.flex as flex
    import posprobe.retrofitting.attention as retrofit_attention
    from posprobe.retrofitting.install import retrofit

    device = torch.device(args.device)
    lengths = sorted(int(n) for n in args.lengths.split(","))
    torch.manual_seed(0)
    stock_eager = args.variant == "stock:eager"
    config = BertConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=max(max(lengths), 512),
        attention_probs_dropout_prob=0.0,
        attn_implementation="eager" if stock_eager else "sdpa",
    )
    model = BertModel(config)
    if not args.variant.startswith("stock"):
        mechanism, path = args.variant.split(":")
        retrofit(model, mechanism, init="random", seed=0, drop_position_embeddings=True)
        flex.FLEX_DEVICES.clear()
        if path == "flex":
            flex.FLEX_DEVICES.add(device.type)
        elif path == "eager":  # the explicit softmax(QK^T * s + bias) V: scores and probabilities materialised
            retrofit_attention.EXPLICIT_ON_CPU = True
            retrofit_attention.F = _ExplicitAttention()
    model.to(device).train()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    rows = []
    for length in lengths:
        ids = torch.randint(1000, config.vocab_size, (args.batch, length), device=device)
        mask = torch.ones_like(ids)

        def step(ids=ids, mask=mask) -> float:
            sync()
            start = time.perf_counter()
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state
            out.float().pow(2).mean().backward()
            model.zero_grad(set_to_none=True)
            sync()
            return time.perf_counter() - start

        try:
            for _ in range(args.warmup):
                step()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times = [step() for _ in range(args.steps)]
        except torch.OutOfMemoryError:
            model.zero_grad(set_to_none=True)
            rows.append({"variant": args.variant, "length": length, "oom": True})
            rows.extend({"variant": args.variant, "length": n, "oom": True} for n in lengths if n > length)
            break
        rows.append(
            {
                "variant": args.variant,
                "length": length,
                "oom": False,
                "median_s": statistics.median(times),
                "peak_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
                "flex_disabled": list(flex._disabled),
                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            }
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


class _ExplicitAttention:
    """Stands in for `torch.nn.functional` inside posprobe.retrofitting.attention: its `scaled_dot_product_attention`
    is the explicit softmax(QK^T * scale + mask) V (the "eager" baseline); everything else is torch's."""

    def __getattr__(self, name):
        import torch.nn.functional as F

        return getattr(F, name)

    @staticmethod
    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, scale=None):
        import torch

        scores = torch.matmul(query, key.transpose(-1, -2)) * (scale or query.shape[-1] ** -0.5)
        if attn_mask is not None:
            scores = scores + attn_mask if attn_mask.dtype != torch.bool else scores.masked_fill(~attn_mask, -1e30)
        return torch.matmul(torch.softmax(scores, dim=-1), value)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lengths", default="128,512,2048")
    p.add_argument("--mechanisms", default="tisa,fixed,dynamic,composite")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--device", default="cuda")
    p.add_argument("--paths", default="today,flex,eager", help="attention paths of the retrofitted variants")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="stock", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    paths = [p for p in args.paths.split(",") if args.device == "cuda" or p != "flex"]  # no flex backward on CPU
    stock = ["stock", "stock:eager"] if "eager" in paths else ["stock"]
    variants = stock + [f"{m}:{path}" for m in args.mechanisms.split(",") for path in paths]
    rows = []
    for variant in variants:
        cmd = [sys.executable, __file__, "--worker", "--variant", variant, "--lengths", args.lengths]
        for name in ("batch", "steps", "warmup", "layers", "heads", "hidden", "device"):
            cmd += [f"--{name}", str(getattr(args, name))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            error = proc.stderr.strip().splitlines()[-1:]
            got = [{"variant": variant, "length": int(n), "error": error} for n in args.lengths.split(",")]
        else:
            got = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.extend(got)
        for row in got:
            print(json.dumps(row), file=sys.stderr, flush=True)
    rows.sort(key=lambda r: (r["length"], variants.index(r["variant"])))
    print(table(rows, args))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


def table(rows: list[dict], args: argparse.Namespace) -> str:
    """Markdown: time and peak memory per (length, variant), and the ratios to stock SDPA."""
    stock = {r["length"]: r for r in rows if r["variant"] == "stock" and r.get("median_s")}
    lines = [
        f"batch {args.batch}, {args.layers} layers x {args.heads} heads x {args.hidden}, device {args.device}",
        "",
        "| length | variant | step (ms) | x stock | peak memory (GiB) | x stock |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("oom") or r.get("error"):
            lines.append(f"| {r['length']} | {r['variant']} | {'OOM' if r.get('oom') else r['error']} | | | |")
            continue
        s = stock.get(r["length"])
        t_ratio = f"{r['median_s'] / s['median_s']:.2f}" if s else ""
        mem = r.get("peak_bytes")
        m_text = "" if mem is None else f"{mem / 2**30:.2f}"
        m_ratio = f"{mem / s['peak_bytes']:.2f}" if s and mem and s.get("peak_bytes") else ""
        lines.append(
            f"| {r['length']} | {r['variant']} | {1000 * r['median_s']:.1f} | {t_ratio} | {m_text} | {m_ratio} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
