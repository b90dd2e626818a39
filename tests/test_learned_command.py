"""`posprobe learned`: every mechanism's learned functions against the real modules (known parameters), TISA
from a kernels file reproduced exactly, initial values kept through save/load, --text, --compare, --profiles,
the JSON contract and clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_tiny
from safetensors.numpy import save_file
from tiny_tokenizer import word_tokenizer
from typer.testing import CliRunner

from posprobe.analysis.learned import correlation_per_head, learned_functions, tisa_functions
from posprobe.cli import app, main
from posprobe.mechanisms._sequence import naive_filter
from posprobe.mechanisms.catalogue import MECHANISM_NAMES
from posprobe.pipelines.learned import mean_vectors, read_learned
from posprobe.retrofitting.install import INITIAL_FILE, mechanism_at, retrofit, save_retrofitted
from posprobe.retrofitting.loading import load_model

H, L, D, R = 4, 2, 32, 3  # tiny models: d_h = 8, clip radius 3
runner = CliRunner()


def _tokenizer_folder(folder):
    """A WordPiece tokenizer with the tiny models' 99-token vocabulary, saved into `folder`."""
    word_tokenizer(94).save_pretrained(str(folder))


def _retrofitted(tmp_path, mechanism, name="m", seed=0, **kw):
    model = retrofit(build_tiny("bert"), mechanism, radius=R, init="random", seed=seed, **kw)
    folder = save_retrofitted(model, tmp_path / name)
    _tokenizer_folder(folder)
    return folder


def _bias(mech, n, query=None, key=None):
    z = torch.zeros(1, H, n, D // H)
    return mech.score_bias(z if query is None else query, z if key is None else key)[0].detach().double().numpy()


@pytest.mark.parametrize("mechanism", MECHANISM_NAMES)
def test_every_mechanism_functions_match_its_module(tmp_path, mechanism):
    """Random (known) parameters: each array equals what the installed module really does at offset k."""
    folder = _retrofitted(tmp_path, mechanism)
    report = read_learned(folder, window=5)
    lf = report.learned
    model = load_model(folder)
    k = lf.offsets
    assert k.tolist() == list(range(-5, 6)) and lf.initial_known and lf.parts == (mechanism,)
    n = 12
    for depth in range(L):
        mech = mechanism_at(model, depth)
        if mechanism in ("tisa", "fixed", "composite"):
            bias = _bias(mech, n)  # zero query: composite's dynamic part vanishes
            for t, kk in enumerate(k):
                for i in range(max(0, -kk), min(n, n - kk)):
                    np.testing.assert_allclose(lf.arrays["functions"][depth, :, t], bias[:, i, i + kk], atol=1e-6)
            np.testing.assert_array_equal(lf.arrays["functions"], lf.arrays["initial"])  # not trained
        if mechanism in ("dynamic", "composite", "key-dynamic", "shaw-values"):
            owner = mech.dynamic if mechanism == "composite" else mech
            table = owner.a_v if mechanism == "shaw-values" else owner.w
            prefix = mechanism.replace("-", "_") if mechanism != "composite" else "dynamic"
            sign = -1 if mechanism == "key-dynamic" else 1
            rows = table.detach().double().numpy()[np.clip(sign * k, -R, R) + R]
            np.testing.assert_allclose(lf.arrays[f"{prefix}_norms"][depth], np.linalg.norm(rows, axis=-1))
        if mechanism == "depthwise":
            ones = torch.ones(D // H)
            for t, kk in enumerate(k):
                want = np.concatenate([mech.naive_output(h, 6, 6 + kk, ones).detach().numpy() for h in range(H)])
                np.testing.assert_allclose(lf.arrays["depthwise"][depth, t], want, rtol=1e-6)
        if mechanism in ("cat", "conv-qkv"):
            key = "cat_filters" if mechanism == "cat" else "conv_qkv_filters"
            bank = mech.filters if mechanism == "cat" else mech.depthwise
            valid = torch.ones(n, dtype=torch.bool)
            for role in range(3):
                for j in (2, 6, 9):  # a one-hot input at j: output i carries tap k = j - i
                    x = torch.zeros(n, D)
                    x[j] = 1.0
                    y = naive_filter(x, bank[role].detach(), valid).numpy()  # (n, d)
                    for t, kk in enumerate(k):
                        if 0 <= j - kk < n:
                            np.testing.assert_allclose(lf.arrays[key][depth, role, :, t], y[j - kk], atol=1e-7)


def test_dynamic_scores_of_the_mean_query_and_key():
    """With mean vectors, the score arrays equal the modules' own per-pair scores for that query / key."""
    rng = np.random.default_rng(1)
    w = rng.normal(size=(L, 2 * R + 1, D // H))
    q = rng.normal(size=(L, H, D // H))
    offsets = np.arange(-6, 7)
    lf = learned_functions(
        "dynamic+key-dynamic",
        [("dynamic", {"w": w}), ("key-dynamic", {"w": w})],
        offsets,
        means={"query": q, "key": q},
    )
    from posprobe.mechanisms.catalogue import LayerShape, RadiusOptions
    from posprobe.mechanisms.dynamic import DynamicConvolution, KeyDynamicConvolution

    shape = LayerShape(H, D // H, D)
    for cls, key in ((DynamicConvolution, "dynamic_scores"), (KeyDynamicConvolution, "key_dynamic_scores")):
        mech = cls(shape, RadiusOptions(R)).double()
        for depth in range(L):
            with torch.no_grad():
                mech.w.copy_(torch.from_numpy(w[depth]))
            for h in range(H):
                v = torch.from_numpy(q[depth, h])
                i = 7
                want = [float(mech.naive_score(h, i, i + kk, v, v).detach()) for kk in offsets]
                np.testing.assert_allclose(lf.arrays[key][depth, h], want, rtol=1e-12)


def test_mean_vectors_match_the_layer_inputs(tmp_path):
    """--text: the mean query/key/value are the projections of every real token's layer input."""
    folder = _retrofitted(tmp_path, "dynamic")
    model = load_model(folder).eval()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    texts = ["w1 w2 w3", "w5 w6 w7 w8 w9 w10 w11", "w40"]
    means, tokens = mean_vectors(model, tok, texts)
    batch = tok(texts, padding=True, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    assert tokens == int(mask.sum())
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states
        for depth in range(L):
            attn = model.encoder.layer[depth].attention.self
            x = hidden[depth][mask]  # (tokens, d)
            for role in ("query", "key", "value"):
                want = getattr(attn, role)(x).double().mean(0).view(H, D // H).numpy()
                np.testing.assert_allclose(means[role][depth], want, atol=1e-6)


@pytest.mark.slow
def test_tisa_from_kernels_file_reproduced_exactly(tmp_path, tiny_checkpoints):
    rng = np.random.default_rng(3)
    arrays = {
        "a": rng.normal(size=(L, H, 3)).astype(np.float32),
        "b": rng.uniform(0.05, 1, size=(L, H, 3)).astype(np.float32),
        "c": rng.uniform(-5, 5, size=(L, H, 3)).astype(np.float32),
    }
    kfile = tmp_path / "k.safetensors"
    save_file(arrays, str(kfile), metadata={"posprobe": json.dumps({"layers": [0, 1]})})
    folder = tmp_path / "tisa"
    result = runner.invoke(
        app, ["retrofit", str(tiny_checkpoints["bert"]), "-m", "tisa", "--init", f"fit:{kfile}", "--out", str(folder)]
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "k-out"
    result = runner.invoke(app, ["learned", str(folder), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["mechanism"] == "tisa" and record["window"] == 16 and record["initial_known"]
    assert record["arrays"]["functions"]["max_abs_change"] == 0.0
    with np.load(record["npz"]) as npz:
        k = npz["offsets"]
        assert k.tolist() == list(range(-16, 17))
        a, b, c = (arrays[n].astype(np.float64)[..., None] for n in "abc")  # (L, H, S, 1)
        want = (a * np.exp(-np.abs(b) * (k - c) ** 2)).sum(2)  # sum_s a exp(-|b| (k - c)^2)
        np.testing.assert_allclose(npz["functions"], want, rtol=1e-13, atol=1e-300)
        np.testing.assert_array_equal(npz["initial"], npz["functions"])
    assert all(__import__("pathlib").Path(p).is_file() for p in record["figures"])
    np.testing.assert_allclose(tisa_functions(arrays["a"], arrays["b"], arrays["c"], k), want, rtol=1e-13)


def _name_comparisons(tree) -> set[int]:
    """Lines comparing a value with a mechanism's name (`x == "tisa"`, `p in ("dynamic", ...)`, `"tisa" in parts`)."""
    import ast

    def names(node) -> set:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*map(names, node.elts)) if node.elts else set()
        return set()

    compares = [node for node in ast.walk(tree) if isinstance(node, ast.Compare)]
    return {c.lineno for c in compares if any(names(x) & set(MECHANISM_NAMES) for x in [c.left, *c.comparators])}


@pytest.mark.slow
def test_each_mechanism_owns_its_reading_over_k():
    """How a mechanism's parameters read over k is its catalogue entry's (`read_over_k`), and no code outside
    `posprobe/mechanisms/` branches on a mechanism's name (the if-chain over names in analysis/learned.py is gone);
    the scan finds a planted comparison."""
    import ast
    from pathlib import Path

    import posprobe
    from posprobe.mechanisms.catalogue import CATALOGUE

    assert all(info.reading is not None for info in CATALOGUE.values())
    assert _name_comparisons(ast.parse('if part == "tisa" or p in ("dynamic", "cat"):\n    pass')) == {1}
    root = Path(posprobe.__file__).parent
    found = {
        str(path.relative_to(root)): lines
        for path in sorted(root.rglob("*.py"))
        if path.parent.name != "mechanisms" and (lines := _name_comparisons(ast.parse(path.read_text("utf-8"))))
    }
    assert found == {}


@pytest.mark.slow
def test_old_spelling_kernels_is_a_hidden_alias(tmp_path, capsys):
    """`posprobe kernels DIR` (the command's old name) still runs the same command with the same record; `--help`
    lists `learned` only ("kernels" alone names TISA's Gaussian kernels)."""
    folder = _retrofitted(tmp_path, "fixed")
    records = []
    for name in ("learned", "kernels"):
        result = runner.invoke(app, [name, str(folder), "--out", str(tmp_path / name), "--json"])
        assert result.exit_code == 0, result.output
        record = json.loads(result.stdout)
        assert record.pop("npz") == str(tmp_path / name / "learned_functions.npz")
        record["figures"] = [p.replace(str(tmp_path / name), "OUT") for p in record["figures"]]
        records.append(record)
    assert records[0] == records[1] and records[0]["mechanism"] == "fixed"
    main(["--help"])
    listed = capsys.readouterr().out
    assert "│ learned " in listed and "│ kernels " not in listed


def test_initial_values_survive_training_and_saving(tmp_path):
    folder = _retrofitted(tmp_path, "fixed")
    assert (folder / INITIAL_FILE).is_file()
    model = load_model(folder)
    with torch.no_grad():
        for depth in range(L):
            mechanism_at(model, depth).beta.add_(1.0)  # "training"
    trained = save_retrofitted(model, tmp_path / "trained")
    lf = read_learned(trained).learned
    np.testing.assert_allclose(lf.change("functions"), 1.0, rtol=1e-6)
    (trained / INITIAL_FILE).unlink()  # a folder from before posprobe stored the initial values
    report = read_learned(trained)
    assert not report.learned.initial_known and report.learned.change("functions") is None
    assert any("initial values unknown" in note for note in report.notes)


@pytest.mark.slow
def test_compare_and_profiles_json(tmp_path):
    one, two = _retrofitted(tmp_path, "composite", "one", 0), _retrofitted(tmp_path, "composite", "two", 1)
    lf = read_learned(one).learned
    k = lf.offsets
    profiles = 2.0 * lf.arrays["functions"] + 1.0  # perfectly correlated base "profiles"
    np.savez(tmp_path / "p.npz", profiles=profiles, offsets=k, layers=np.arange(L), metadata=np.array("{}"))
    text = tmp_path / "t.txt"
    text.write_text("w1 w2 w3 w4\n\nw9 w8 w7\n")
    out = tmp_path / "out"
    args = ["learned", str(one), "--compare", str(two), "--profiles", str(tmp_path / "p.npz")]
    result = runner.invoke(app, [*args, "--text", str(text), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["compare"] == str(two) and record["text_tokens"] == 2 * 2 + 7
    arrays = record["arrays"]
    assert set(arrays) >= {"functions", "dynamic_norms", "dynamic_scores"}
    np.testing.assert_allclose(np.array(arrays["functions"]["profile_correlation"], dtype=float), 1.0)
    assert np.all(np.abs(np.array(arrays["functions"]["compare_correlation"], dtype=float)) < 1)
    with np.load(record["npz"]) as npz:
        assert npz["functions"].shape == (L, H, 2 * R + 1) and npz["compare_functions"].shape == (L, H, 2 * R + 1)
    r, common = correlation_per_head(lf.arrays["functions"], k, lf.arrays["functions"], k)
    np.testing.assert_allclose(r, 1.0) and common.tolist() == k.tolist()
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "text")])  # the correlations asked for, in text too
    assert result.exit_code == 0, result.output
    table = result.stdout.split("Pearson r per head")[1]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines() if line.startswith("│")]
    assert ["functions", "profiles", "1.00", "1.00", "1.00"] in cells, table  # median, min, max over layers, heads
    assert any(row[:2] == ["functions", "compared"] for row in cells)
    assert "compared" in table and max(len(line) for line in table.splitlines() if line[:1] in "┏┃┡│└") <= 80


def test_head_grid_keeps_titles_and_panels_clear():
    """The kernels figure: no shared '1e-5' offset text over the head titles (each tick label carries its own
    exponent) and the legend outside every panel (in panel L0 H0 it hid the curves and the 'layer 0' label)."""
    from posprobe.plotting.learned import head_grid

    k = np.arange(-3, 4)
    tiny = 1e-5 * np.random.default_rng(0).normal(size=(2, 3, k.size))
    fig = head_grid(k, [("learned", tiny, {}), ("initial", 0 * tiny, {"ls": "--"})], "t")
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.yaxis.get_offset_text().get_text() == "" and ax.get_legend() is None
        assert any("e-05" in t.get_text() or t.get_text() == "0" for t in ax.get_yticklabels())
    assert len(fig.legends) == 1
    legend = fig.legends[0].get_window_extent()
    assert all(not legend.overlaps(ax.get_window_extent()) for ax in fig.axes)


def run_main(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code, capsys.readouterr()


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, tiny_checkpoints, capsys):
    folder = _retrofitted(tmp_path, "fixed")
    out = tmp_path / "out"
    cases = [
        ([str(tiny_checkpoints["bert"])], "without a retrofitted positional mechanism"),
        ([str(tmp_path / "nope")], "nope"),
        ([str(folder), "--window", "0"], "--window"),
        ([str(folder), "--text", str(tmp_path / "missing.txt")], "missing.txt"),
        ([str(folder), "--compare", str(tiny_checkpoints["bert"])], "without a retrofitted"),
    ]
    for args, expected in cases:
        code, captured = run_main(["learned", *args, "--out", str(out)], capsys)
        lines = captured.err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("posprobe: error: "), captured.err
        assert expected in lines[0]
        assert not out.exists()


# ------------------------------------------------------------------------------- fit-tisa --orientation official
@pytest.mark.slow
def test_fit_tisa_official_orientation_brute_force(tmp_path, tiny_checkpoints):
    """The official TISA code scores pair (i, j) with f'(i - j - 1) from (S, H) arrays: the exported file must
    give exactly posprobe's f(j - i) for every pair; posprobe itself refuses to read it as its own."""
    from safetensors.numpy import load_file

    from posprobe.formats.tisa_kernels import read_kernels_file
    from posprobe.pipelines.fitting import ProfileSet, fit_tisa

    k = np.arange(-20, 21)
    rng = np.random.default_rng(0)
    prof = 2.0 * np.exp(-0.3 * (k - rng.uniform(-4, 4, (2, 3, 1))) ** 2) + rng.normal(0, 0.01, (2, 3, k.size))
    data = ProfileSet("synthetic", "bert", "paper", [0, 1], k, prof, 2, 3, False)

    ours = fit_tisa(None, kernels=2, profiles=data).save(tmp_path / "p").fits[0]
    theirs = fit_tisa(None, kernels=2, profiles=data, orientation="official").save(tmp_path / "o").fits[0]
    assert theirs.kernels_file.name == "tisa_kernels_S2_official.safetensors"
    mine = read_kernels_file(ours.kernels_file)
    official = load_file(str(theirs.kernels_file))
    assert official["a"].shape == (2, 2, 3)  # (L, S, H)
    n = 9
    for layer in range(2):
        for h in range(3):
            for i in range(n):
                for j in range(n):
                    m = i - j - 1  # the official indexing
                    a, b, c = (official[x][layer, :, h].astype(np.float64) for x in "abc")
                    got = np.sum(a * np.exp(-np.abs(b) * (m - c) ** 2))
                    a, b, c = mine.a[layer, h], mine.b[layer, h], mine.c[layer, h]
                    want = np.sum(a * np.exp(-np.abs(b) * ((j - i) - c) ** 2))
                    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    with pytest.raises(Exception, match="convention|shape"):
        read_kernels_file(theirs.kernels_file)
    result = runner.invoke(
        app,
        ["fit-tisa", str(tiny_checkpoints["bert"]), "--kernels", "1", "--orientation", "official"]
        + ["--out", str(tmp_path / "cli"), "--json"],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["orientation"] == "official" and record["kernels_file"].endswith("_official.safetensors")
    result = runner.invoke(app, ["fit-tisa", "--orientation", "sideways", "--out", str(tmp_path / "bad")])
    assert result.exit_code != 0 and not (tmp_path / "bad").exists()


# ------------------------------------------------------------------------------------ combined mechanisms
COMBOS = ["composite+key-dynamic", "fixed+shaw-values", "tisa+depthwise", "cat+fixed", "conv-qkv+dynamic"]


@pytest.mark.parametrize("name", COMBOS)
def test_combined_fast_path_equals_per_pair_loop(name):
    """Forward and gradients of the hooked attention layer == the parts' naive loops, summed/chained."""
    from posprobe.mechanisms import ROLES

    model = retrofit(build_tiny("bert").double(), name, radius=2, kernels=2, init="random", seed=1)
    attention, mech = model.encoder.layer[0].attention.self, mechanism_at(model, 0)
    B, n = 2, 7
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, n, D, generator=g, dtype=torch.float64, requires_grad=True)
    valid = torch.ones(B, n, dtype=torch.bool)
    valid[1, 5:] = False
    mask = valid[:, None, None, :].expand(B, 1, n, n)
    weight = torch.randn(B, n, D, generator=g, dtype=torch.float64) * valid[:, :, None]
    params = [*mech.parameters(), x]
    fast = attention(x, attention_mask=mask)[0]
    grads_fast = torch.autograd.grad((fast * weight).sum(), params)
    slow = mech.naive_self_attention(x, {r: getattr(attention, r) for r in ROLES}, valid)
    grads_slow = torch.autograd.grad((slow * weight).sum(), params)
    torch.testing.assert_close(fast[valid], slow[valid], rtol=1e-10, atol=1e-10)
    for gf, gs in zip(grads_fast, grads_slow):
        torch.testing.assert_close(gf, gs, rtol=1e-9, atol=1e-10)
    grad_of = {id(p): gf for p, gf in zip(params, grads_fast)}
    for part in mech.parts:  # every part receives a gradient
        assert any(grad_of[id(p)].abs().sum() > 0 for p in part.parameters()), part.name


@pytest.mark.parametrize("name", COMBOS)
@pytest.mark.parametrize("family", ["bert", "albert"])
def test_combined_zero_init_unchanged_and_counts(name, family):
    from posprobe.mechanisms.catalogue import CATALOGUE, mechanism_info
    from posprobe.retrofitting.install import added_parameters, expected_parameters

    base = build_tiny(family).double()
    ids = torch.randint(5, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        ref = base(input_ids=ids, attention_mask=mask)[0]
        retrofit(base, name, radius=2, kernels=2)
        new = base(input_ids=ids, attention_mask=mask)[0]
    keep = mask.bool()
    torch.testing.assert_close(new[keep], ref[keep], rtol=0, atol=1e-12)
    from posprobe.mechanisms.catalogue import LayerShape

    shape = LayerShape(H, D // H, D)
    parts = name.split("+")
    per_depth = sum(CATALOGUE[p].parameters_per_depth(shape, CATALOGUE[p].options(radius=2, kernels=2)) for p in parts)
    info = mechanism_info(name)
    assert info.parameters_per_depth(shape, info.options(radius=2, kernels=2)) == per_depth
    assert added_parameters(base) == expected_parameters(base) == L * per_depth


@pytest.mark.slow
def test_combined_round_trip_and_kernels_per_part(tmp_path):
    folder = _retrofitted(tmp_path, "composite+key-dynamic")
    model = load_model(folder)
    assert model.config.posprobe["mechanism"] == "composite+key-dynamic"
    text = tmp_path / "t.txt"
    text.write_text("w1 w2 w3 w4 w5\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["learned", str(folder), "--text", str(text), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["parts"] == ["composite", "key-dynamic"]
    assert {"functions", "dynamic_norms", "dynamic_scores", "key_dynamic_norms", "key_dynamic_scores"} <= set(
        record["arrays"]
    )
    lf = read_learned(folder).learned
    for depth in range(L):
        composite, key_dynamic = mechanism_at(model, depth).parts
        rows = key_dynamic.w.detach().double().numpy()[np.clip(-lf.offsets, -R, R) + R]
        np.testing.assert_allclose(lf.arrays["key_dynamic_norms"][depth], np.linalg.norm(rows, axis=-1))
        beta = composite.fixed.beta.detach().double().numpy()
        np.testing.assert_allclose(lf.arrays["functions"][depth], beta[:, np.clip(lf.offsets, -R, R) + R])
    fixed_tisa = read_learned(_retrofitted(tmp_path, "tisa+fixed", "tf"), window=4).learned
    np.testing.assert_allclose(
        fixed_tisa.arrays["functions"], fixed_tisa.arrays["tisa_functions"] + fixed_tisa.arrays["fixed_functions"]
    )
    assert "initial" in fixed_tisa.arrays and "tisa_functions_initial" in fixed_tisa.arrays


def test_combined_bad_names(tmp_path, capsys):
    from posprobe.errors import ArgumentValueError

    for bad in ("fixed+fixed", "fixed+nope", "fixed+"):
        with pytest.raises(ArgumentValueError):
            retrofit(build_tiny("bert"), bad)


@pytest.mark.slow
def test_albert_text_and_base_model_profiles_human_output(tmp_path, tiny_checkpoints):
    """ALBERT's shared layer has one mechanism per depth; --profiles takes the base model itself."""
    model = retrofit(build_tiny("albert"), "composite", radius=R, init="random", seed=3)
    folder = save_retrofitted(model, tmp_path / "albert")
    _tokenizer_folder(folder)
    text = tmp_path / "t.txt"
    text.write_text("w1 w2 w3\nw4 w5\n")
    report = read_learned(folder, text=text, profiles=str(tiny_checkpoints["albert"]))
    loaded = load_model(folder)
    for depth in range(L):
        beta = mechanism_at(loaded, depth).fixed.beta.detach().double().numpy()
        np.testing.assert_allclose(report.learned.arrays["functions"][depth], beta)  # window = r: k = -r..r
    assert report.n_text_tokens == 9 and report.learned.arrays["dynamic_scores"].shape == (L, H, 2 * R + 1)
    r = report.with_profiles["functions"]
    assert r.shape == (L, H) and np.all(np.abs(r) <= 1 + 1e-12)
    out = tmp_path / "out"
    args = ["learned", str(folder), "--profiles", str(tiny_checkpoints["albert"]), "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "learned_functions.npz").is_file() and (out / "functions_heads.png").is_file()
    assert "functions" in result.output and "dynamic_norms" in result.output


@pytest.mark.slow
def test_outputs_are_named_for_the_learned_functions_they_hold(tmp_path, monkeypatch):
    """The npz and the default folder are named for what they hold (learned functions of k, not TISA's kernels):
    `posprobe-out/learned/<folder>/learned_functions.npz`, whichever spelling of the command ran."""
    folder = _retrofitted(tmp_path, "fixed")
    monkeypatch.chdir(tmp_path)
    for name in ("learned", "kernels"):
        result = runner.invoke(app, [name, str(folder), "--json"])
        assert result.exit_code == 0, result.output
        npz = Path(json.loads(result.stdout)["npz"])
        assert npz == Path("posprobe-out") / "learned" / folder.name / "learned_functions.npz" and npz.is_file()
        with np.load(npz) as arrays:
            assert {"offsets", "functions", "initial"} <= set(arrays.files)
    assert not (tmp_path / "posprobe-out" / "kernels").exists()


@pytest.mark.parametrize("mechanism", ["composite", "shaw-values"])
def test_a_model_trains_after_its_means_were_read_on_the_run_loop(tmp_path, mechanism):
    """`mean_vectors` runs on the run loop, in inference mode: the index tensors the mechanisms cache by length
    (`mechanisms.base`) must still serve autograd afterwards, at the same length, in the same process (a notebook
    that reads `learned --text` and then fine-tunes)."""
    from posprobe.mechanisms import base

    for cached in (base._offset_index, base._clipped, base._offset_range):
        cached.cache_clear()  # made afresh here, first inside inference mode
    folder = _retrofitted(tmp_path, mechanism)
    model = load_model(folder).eval()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    texts = ["w1 w2 w3", "w5 w6 w7 w8 w9 w10 w11"]
    mean_vectors(model, tok, texts)
    batch = tok(texts, padding=True, return_tensors="pt")
    loss = model(**batch).last_hidden_state.pow(2).mean()
    loss.backward()  # before the fix: "Inference tensors cannot be saved for backward"
    assert any(p.grad is not None for p in model.parameters())
