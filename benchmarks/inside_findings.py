"""The numbers behind the README's "Position inside the model" (issue 20): how well weights-based profiles track
what heads do on text, for the embedding-level input e_w (SPEC §9 / faithful §3) and the data-conditioned inputs
(SPEC §13), and where SmolLM2's query/key norm sits among the rotary bands (SPEC §15).

For a model and the first `--texts` CoLA validation sentences (or texts of `--text FILE`, with `--column` for a
.jsonl/.csv): the empirical score profiles s(k) of `posprobe attention` (SPEC §10), and per head the Pearson r
between s(k) and each weights-based profile over the offsets k with at least `--min-pairs` pairs (causal models have
none at k > 0); per layer the mean r over heads. Also the cosine between each layer's mean input x_l and the
embedding-level input e_w (after the layer's own norm, as the projections see them), and, for a rotary model, the
rotary bands of the content-free input and of the texts.

    python benchmarks/inside_findings.py MODEL [--texts 200] [--max-length 128] [--min-pairs 100] [--json FILE]
        [--text FILE [--column NAME]]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
COLA = next((p / "shared/data/glue/cola/validation.jsonl" for p in (ROOT.parent, ROOT.parent.parent)
             if (p / "shared/data/glue/cola/validation.jsonl").is_file()), None)  # fmt: skip


def correlations(empirical: np.ndarray, offsets: np.ndarray, counts: np.ndarray, weights, min_pairs: int):
    """(L, H) Pearson r between s(k) and a ProfileResult's profiles over the common offsets with enough pairs."""
    keep = (counts if counts.ndim == 1 else counts.min(0)) >= min_pairs  # counts per layer: enough in every layer
    ks = offsets[keep]
    n = weights.n_positions
    inside = np.abs(ks) <= n - 1
    ks, s = ks[inside], empirical[..., keep][..., inside]
    w = weights.profiles[..., ks + n - 1]
    out = np.full(s.shape[:2], np.nan)
    for layer in range(s.shape[0]):
        for head in range(s.shape[1]):
            a, b = s[layer, head], w[layer, head]
            if np.isfinite(a).all() and a.std() > 0 and b.std() > 1e-12 * max(1.0, np.abs(b).max()):
                out[layer, head] = np.corrcoef(a, b)[0, 1]
    return out, ks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--min-pairs", type=int, default=100)
    parser.add_argument("--json", default=None)
    parser.add_argument("--text", default=None, help="texts instead of CoLA validation (.txt, .jsonl/.csv)")
    parser.add_argument("--column", default=None, help="the column of a .jsonl/.csv --text")
    args = parser.parse_args()
    import posprobe
    from posprobe.pipelines.score_reader import open_model
    from posprobe.texts.reading import iter_texts

    model = None if args.model in ("", "none", "minilm") else args.model
    source = (args.text, args.column) if args.text else (COLA, "sentence")
    texts = [t for t, _ in zip(iter_texts(*source), range(args.texts))]
    n = args.max_length
    attention = posprobe.attention_profiles(model, texts, max_length=n, weights_correlation=False)
    p = attention.profiles
    empirical, offsets, counts = p.score_profiles, p.offsets, p.pair_counts
    ctx = open_model(model)
    mode = "faithful" if ctx.has_table else "paper"
    inputs = {
        "e_w": posprobe.profiles(model, mode=mode, positions=n),
        "data-conditioned mean": posprobe.profiles(model, positions=n, texts=texts, max_length=n),
        "data-conditioned position-mean": posprobe.profiles(model, texts=texts, max_length=n, input="position-mean"),
    }
    report = {"model": attention.model, "texts": len(texts), "min_pairs": args.min_pairs, "profiles": {}}
    report["empirical_median_toeplitz_r2_per_layer"] = [round(float(x), 3) for x in np.nanmedian(p.toeplitz_r2, 1)]
    for name, weights in inputs.items():
        r, ks = correlations(empirical, offsets, counts, weights, args.min_pairs)
        per_layer = np.nanmean(r, axis=1) if np.isfinite(r).any() else np.full(r.shape[0], np.nan)
        report["profiles"][name] = {
            "offsets": [int(ks.min()), int(ks.max())],
            "positions": weights.n_positions,
            "per_layer_mean_r": [None if not np.isfinite(x) else round(float(x), 3) for x in per_layer],
            "mean_r_all_heads": None if not np.isfinite(r).any() else round(float(np.nanmean(r)), 3),
            "mean_r_layers_1_up": None if not np.isfinite(r[1:]).any() else round(float(np.nanmean(r[1:])), 3),
            "heads_with_r": int(np.isfinite(r).sum()),
        }
        if name == "data-conditioned position-mean":
            report["profiles"][name]["median_fhat_r2_per_layer"] = [
                round(float(x), 3) for x in np.nanmedian(weights.fhat_r2, axis=1)
            ]
    # cosine between x_l and e_w as layer l's projections see them (after its own norm)
    means = inputs["data-conditioned mean"]
    e_w = [ctx.word_input(layer) for layer in range(means.n_layers)]
    from posprobe.pipelines.data_conditioned import hidden_means, text_settings

    settings = text_settings(texts, max_length=n)
    hidden, _, _ = hidden_means(model, list(range(means.n_layers)), settings, False)
    cos = lambda a, b: round(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), 3)  # noqa: E731
    report["cosine_x_l_e_w_after_norm"] = [
        cos(ctx.layer_input(hidden.layer(layer), layer), e_w[layer]) for layer in range(means.n_layers)
    ]
    report["cosine_x_l_e_w_raw"] = [cos(hidden.layer(layer), ctx.embedding) for layer in range(means.n_layers)]
    if ctx.kind == "rotary":
        for name, kwargs in (("content-free", {}), ("text", {"texts": texts, "max_length": n})):
            bands = posprobe.rotary(model, positions=n, **kwargs)
            d = bands.to_dict()
            beyond = lambda w, b=bands: np.round(b.long_band_share(w, b.max_positions).mean(1), 3).tolist()  # noqa: E731
            report[f"rotary_{name}"] = {
                "context": d["context"],
                "q_long_band_share": [row["q_long_band_share"] for row in d["summary"]],
                "k_long_band_share": [row["k_long_band_share"] for row in d["summary"]],
                "long_band_fraction": d["summary"][0]["long_band_fraction"],
                "max_positions": bands.max_positions,
                "q_share_beyond_max_positions": beyond("q"),
                "k_share_beyond_max_positions": beyond("k"),
                "fraction_beyond_max_positions": float(bands.long_band_fraction(bands.max_positions)[0]),
                "q_peak_wavelength": [row["q_peak_wavelength"] for row in d["summary"]],
                "k_peak_wavelength": [row["k_peak_wavelength"] for row in d["summary"]],
            }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
