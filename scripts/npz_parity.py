"""Record every array of every `.npz` the commands write (`--json --out`) on tiny random models built in code, or
compare against such a record: `python scripts/npz_parity.py record FILE` / `python scripts/npz_parity.py compare
FILE`. Each array is kept as its dtype, shape and SHA-256 of its bytes, so 'compare' says byte-identical or names
what differs; the metadata is compared too, with the `dims` entry (added by the declared-arrays writer) left out.
Run from the repository root with `PYTHONPATH=. python scripts/npz_parity.py ...` (it imports the tests' helpers)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def commands(root: Path) -> list[list[str]]:
    from test_attention import tiny_model
    from test_needle import HAYSTACK, TASK_FLAGS, planted_llama
    from tiny_tokenizer import causal_folder, word_tokenizer

    bert = root / "bert"
    word_tokenizer(60).save_pretrained(bert)
    tiny_model("bert").save_pretrained(bert)
    rng = np.random.default_rng(7)
    texts = root / "texts.jsonl"
    rows = [{"sentence": " ".join(f"w{x}" for x in rng.integers(0, 60, size=rng.integers(1, 12)))} for _ in range(20)]
    texts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = root / "run"
    for step in (10, 20):
        shutil.copytree(bert, run / f"checkpoint-{step}")

    from test_context import tiny_llama

    llama = root / "llama"
    causal_folder(llama, tiny_llama())
    docs = root / "docs.txt"
    docs.write_text("".join(" ".join(f"w{x}" for x in rng.integers(0, 60, size=rng.integers(5, 40))) + "\n"
                            for _ in range(40)))  # fmt: skip

    planted = root / "planted"
    model, tok = planted_llama()
    model.save_pretrained(planted)
    tok.save_pretrained(planted)
    (planted / "haystack.txt").write_text(HAYSTACK[0] + "\n", encoding="utf-8")

    text = ["--text", str(texts), "--column", "sentence"]
    out = root / "out"
    return [
        ["profiles", str(bert), "--layers", "all", "--out", str(out / "profiles")],
        ["profiles", str(bert), *text, "--out", str(out / "profiles-text")],
        ["attention", str(bert), *text, "--max-length", "16", "--out", str(out / "attention")],
        ["states", str(bert), *text, "--out", str(out / "states")],
        ["states", "--checkpoints", str(run), *text, "--out", str(out / "states-series")],
        ["rotary", str(llama), "--out", str(out / "rotary")],
        ["rotary", str(llama), "--text", str(docs), "--out", str(out / "rotary-text")],
        ["context", str(llama), "--text", str(docs), "--lengths", "16,48", "--windows", "2", "--out",
         str(out / "context")],
        ["needle", str(planted), "--haystack", str(planted / "haystack.txt"), "--lengths", "150", "--depths",
         "0,0.5,1", "--trials", "2", *[f.replace("\\n", "\\n") for f in TASK_FLAGS], "--out", str(out / "needle")],
        ["retrofit", str(bert), "-m", "tisa", "--out", str(root / "tisa")],
        ["learned", str(root / "tisa"), "--out", str(out / "learned")],
    ]  # fmt: skip


def digest(out: Path) -> dict:
    from posprobe.formats.writing import load_npz

    found = {}
    for path in sorted(out.rglob("*.npz")):
        metadata, arrays = load_npz(path)
        metadata.pop("dims", None)
        entry = {"metadata": json.loads(json.dumps(metadata, default=str).replace(str(out.parent), "<root>"))}
        for name, a in sorted(arrays.items()):
            entry[name] = [str(a.dtype), list(a.shape), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()]
        found[str(path.relative_to(out))] = entry
    return found


def main(mode: str, file: str) -> int:
    from typer.testing import CliRunner

    from posprobe.cli import app

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for argv in commands(root):
            result = CliRunner().invoke(app, [*argv, "--json"])
            if result.exit_code != 0:
                print(" ".join(argv[:2]), "failed:", result.output[-2000:], file=sys.stderr)
                return 1
        found = digest(root / "out")
    if mode == "record":
        Path(file).write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"recorded {sum(len(v) - 1 for v in found.values())} arrays of {len(found)} files into {file}")
        return 0
    expected = json.loads(Path(file).read_text())
    bad = [f"{f}: missing" for f in expected if f not in found] + [f"{f}: new file" for f in found if f not in expected]
    for f in set(found) & set(expected):
        for key in sorted(set(found[f]) | set(expected[f])):
            if found[f].get(key) != expected[f].get(key):
                bad.append(f"{f}:{key}: {expected[f].get(key)} -> {found[f].get(key)}")
    n = sum(len(v) - 1 for v in found.values())
    print("\n".join(bad) or f"identical: {n} arrays of {len(found)} files, and their metadata (less 'dims')")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
