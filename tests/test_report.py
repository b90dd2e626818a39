"""`posprobe report`: every number on the page equals the record of the command it came from (recomputed here from
those records), sections that do not apply say why in one line, the reproducing command reproduces, finished
sections are reused, hostile input is one line with nothing written, and the page is self-contained (statically,
and in headless Chromium: no console message, no request leaving the file, not blank, figures at their size)."""

# ruff: noqa: F811 - the fixtures imported from test_attention are parameters of the tests below
from __future__ import annotations

import html
import json
import re
import shlex
import statistics
from pathlib import Path

import numpy as np
import pytest
from browser import chromium_path, visit
from test_attention import texts_file, tiny_bert_folder, tiny_model  # noqa: F401 - fixtures
from typer.testing import CliRunner

from posprobe.cli import app, main
from posprobe.report.page import LEGIBLE_SCALE
from posprobe.report.sections import SECTIONS

NO_CHROMIUM = "headless Chromium not installed (apt-get install chromium; .ci/run installs it)"


def run_report(args: list[str]) -> dict:
    result = CliRunner().invoke(app, ["report", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def bert_report(tiny_bert_folder, texts_file, tmp_path_factory):
    """The whole report of a tiny BERT on 20 texts: (summary, out folder)."""
    out = tmp_path_factory.mktemp("report-bert") / "report"
    args = [str(tiny_bert_folder), "--text", str(texts_file), "--column", "sentence", "--out", str(out)]
    return run_report(args), out, args


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(folder)
    return folder


def record_of(out: Path, name: str) -> dict:
    """The command's own --json record, as the section saved it."""
    return json.loads((out / name / "section.json").read_text())["record"]


def summary_rows(page: str) -> dict[tuple[str, str], str]:
    """(section, headline label) -> the value text of the page's summary table."""
    rows = re.findall(r'<td class="label"><a href="#([^"]+)">(.*?)</a></td><td class="value">(.*?)</td>', page)
    return {(name, html.unescape(label)): html.unescape(value) for name, label, value in rows}


def summary_references(page: str) -> dict[tuple[str, str], str]:
    """(section, headline label) -> the 'read against' cell of the page's summary table."""
    rows = re.findall(
        r'<td class="label"><a href="#([^"]+)">(.*?)</a></td><td class="value">.*?</td>'
        r'<td class="label reference">(.*?)</td>',
        page,
    )
    return {(name, html.unescape(label)): html.unescape(ref) for name, label, ref in rows}


def section_html(page: str, name: str) -> str:
    return re.search(rf'<section id="{re.escape(name)}">(.*?)</section>', page, re.S).group(1)


def table_rows(fragment: str) -> list[list[str]]:
    body = re.search(r"<tbody>(.*?)</tbody>", fragment, re.S).group(1)
    return [
        [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)] for row in re.findall(r"<tr>(.*?)</tr>", body)
    ]


def f3(x) -> str:
    return "—" if x is None else f"{x:.3f}"


@pytest.mark.slow  # the whole report of a tiny BERT (bert_report): ~10 s, shared by the tests below
def test_every_headline_equals_its_record(bert_report):
    summary, out, _ = bert_report
    page = Path(summary["html"]).read_text()
    shown = summary_rows(page)
    assert {s for s, _ in shown} == {"toeplitz", "fhat", "profiles", "fit-tisa", "attention", "profiles-text", "states"}
    toeplitz = json.loads((out / "toeplitz" / "P.json").read_text())  # the file `posprobe toeplitz` writes
    assert toeplitz == record_of(out, "toeplitz")
    assert shown["toeplitz", "Toeplitz R² of P"] == f3(toeplitz["toeplitz_r2"])
    fhat = json.loads((out / "fhat" / "fhat_layer0_paper.json").read_text())
    assert shown["fhat", "mean F̂_P Toeplitz R², layer 0"] == f3(np.mean([h["toeplitz_r2"] for h in fhat["heads"]]))
    profiles = record_of(out, "profiles")
    peaks = [h["peak_offset"] for h in profiles["heads"]]
    assert len(peaks) == 2 * 4
    zero = sum(p == 0 for p in peaks if p is not None)
    assert shown["profiles", "heads peaking at k = 0 (weights)"] == f"{zero} / {sum(p is not None for p in peaks)}"
    fit = record_of(out, "fit-tisa")
    assert shown["fit-tisa", "TISA fit median R² (S = 5)"] == f3(statistics.median(h["r2"] for h in fit["heads"]))
    held = statistics.median(h["holdout_r2"] for h in fit["heads"])
    assert shown["fit-tisa", "TISA held-out median R²"] == f3(held)
    attention = record_of(out, "attention")
    assert shown["attention", "sink rate (mean over layers)"] == f"{np.mean(attention['sink_rate']):.2f}"
    last = np.mean(attention["mean_distance"][-1])
    assert shown["attention", "mean attention distance, last layer"] == f"{last:.2f}"
    states = record_of(out, "states")
    assert shown["states", "position probe R², embedding output"] == f3(states["probe_r2"][0])
    assert shown["states", "position probe R², last hidden state"] == f3(states["probe_r2"][-1])
    # the JSON summary holds the record's own values, unrounded
    values = {(h["section"], h["label"]): h["value"] for h in summary["headline"]}
    assert values["toeplitz", "Toeplitz R² of P"] == toeplitz["toeplitz_r2"]
    assert values["states", "position probe R², last hidden state"] == states["probe_r2"][-1]
    assert values["fit-tisa", "TISA fit median R² (S = 5)"] == fit["median_r2"]


@pytest.mark.slow
def test_every_headline_carries_its_reference_in_the_same_row(bert_report):
    """Issue 47: every headline number, on the page and in report.json, has its reference (a number or a short text
    saying why there is none), equal to the record's: the no-hidden-state baseline, uniform attention's
    first-token mass and distance, the Gram null, the noise floor's count, held-out R²'s 0."""
    summary, out, _ = bert_report
    page = Path(summary["html"]).read_text()
    shown, refs = summary_rows(page), summary_references(page)
    assert set(refs) == set(shown) and all(text.strip() for text in refs.values())
    entries = {(h["section"], h["label"]): h for h in summary["headline"]}
    assert set(entries) == set(shown)
    for key, entry in entries.items():
        assert entry["reference"] is not None and entry["reference_text"] == refs[key], key
        section = section_html(page, key[0])
        assert html.escape(entry["reference_text"]) in section  # the section's own headline list says it too
    states, attention, fit = record_of(out, "states"), record_of(out, "attention"), record_of(out, "fit-tisa")
    for label in ("position probe R², embedding output", "position probe R², last hidden state"):
        assert entries["states", label]["reference"] == states["probe_r2_baseline"]
        assert (
            refs["states", label]
            == f"{f3(states['probe_r2_baseline'])} (no hidden state: first-token flag + text length)"
        )
    gram = entries["states", "positional Gram Toeplitz R² over i ≥ 1, last hidden state"]
    assert gram["value"] == states["positional_toeplitz_r2_without_first"][-1]
    assert gram["reference"] == states["positional_toeplitz_r2_without_first_null_mean"][-1]
    noise = entries["states", "positions i ≥ 1 whose vector is within twice the noise floor, last hidden state"]
    assert noise["value"] == states["positional_positions_within_noise_without_first"][-1]
    assert noise["reference"] == states["n_positions_kept"] - 1
    mass = entries["attention", "first-token mass (mean over layers and heads)"]
    assert mass["value"] == pytest.approx(np.mean([np.mean(row) for row in attention["first_token_mass"]]))
    assert mass["reference"] == pytest.approx(np.mean(attention["uniform_first_token_mass"]))
    distance = entries["attention", "mean attention distance, last layer"]
    assert distance["reference"] == attention["uniform_distance"][-1]
    assert entries["fit-tisa", "TISA held-out median R²"]["reference"] == 0.0
    assert "by construction" in entries["fit-tisa", "TISA fit median R² (S = 5)"]["reference"]
    assert (
        f"{fit['parameters']} parameters for {fit['points']} points" in refs["fit-tisa", "TISA fit median R² (S = 5)"]
    )
    assert isinstance(entries["toeplitz", "Toeplitz R² of P"]["reference"], str)  # no null: it says why
    story = summary["story"]
    assert story and all(c["section"] in SECTIONS for c in story)
    opening = re.search(r'<p class="story">(.*?)</p>', page, re.S).group(1)
    links = re.findall(r'<a href="#([^"]+)">(.*?)</a>', opening)
    assert [(name, html.unescape(text)) for name, text in links] == [(c["section"], c["text"]) for c in story]
    assert all(f'<section id="{c["section"]}">' in page for c in story)


@pytest.mark.slow
def test_section_tables_equal_their_records(bert_report):
    summary, out, _ = bert_report
    page = Path(summary["html"]).read_text()
    fhat = record_of(out, "fhat")
    assert table_rows(section_html(page, "fhat")) == [[str(h["head"]), f3(h["toeplitz_r2"])] for h in fhat["heads"]]
    states = record_of(out, "states")
    rows = table_rows(section_html(page, "states"))
    assert len(rows) == states["n_states"] == 3
    for s, row in enumerate(rows):
        assert row[:3] == [str(s), f3(states["probe_r2"][s]), f3(states["probe_r2_control"][s])]
        assert row[4] == f3(states["positional_toeplitz_r2"][s])
    attention = record_of(out, "attention")
    for layer, row in enumerate(table_rows(section_html(page, "attention"))):
        assert row[1] == f"{np.mean(attention['mean_distance'][layer]):.2f}"
        assert row[3] == f3(np.mean(attention["first_token_mass"][layer]))
    profiles = record_of(out, "profiles")
    for layer, row in enumerate(table_rows(section_html(page, "profiles"))):
        expected = [h for h in profiles["heads"] if h["layer"] == layer]
        assert row == [str(layer), *["—" if h["peak_offset"] is None else "edge" if h["peak_at_edge"] else
                                     f"{h['peak_offset']:+d}" for h in expected]]  # fmt: skip


@pytest.mark.slow
def test_reproducing_command_gives_the_same_record(bert_report, capsys):
    summary, out, _ = bert_report
    page = Path(summary["html"]).read_text()
    command = html.unescape(
        re.search(r"<h3>Reproduce</h3><pre><code>(.*?)</code>", section_html(page, "fhat")).group(1)
    )
    assert command == summary["sections"]["fhat"]["command"]
    argv = shlex.split(command)
    assert argv[:2] == ["posprobe", "fhat"] and argv[-1] == "--json"
    capsys.readouterr()
    main(argv[1:])
    assert json.loads(capsys.readouterr().out) == record_of(out, "fhat")


@pytest.mark.slow
def test_section_that_does_not_apply_says_why_in_one_line(bert_report, llama_folder, tmp_path):
    summary, _, _ = bert_report
    rotary = summary["sections"]["rotary"]
    assert rotary["status"] == "not applicable" and rotary["command"] is None
    assert rotary["reason"] == "not a rotary model (learned absolute table): it has no rotary frequency bands"
    page = Path(summary["html"]).read_text()
    assert f"Not applicable: {html.escape(rotary['reason'])}</p>" in section_html(page, "rotary")
    llama = run_report([str(llama_folder), "--only", "toeplitz,fhat,rotary", "--out", str(tmp_path / "r")])
    toeplitz = llama["sections"]["toeplitz"]
    assert toeplitz["status"] == "not applicable" and "\n" not in toeplitz["reason"]
    assert toeplitz["reason"].startswith("no absolute position table (rotary embeddings (RoPE))")
    assert llama["sections"]["rotary"]["status"] == "ok" and llama["sections"]["states"]["status"] == "left out"
    assert not (tmp_path / "r" / "toeplitz").exists()
    fhat = llama["sections"]["fhat"]  # rotary scores are Toeplitz by construction: no R² is shown
    assert fhat["headline"] == {"mean F̂_P Toeplitz R², layer 0": None}
    page = Path(llama["html"]).read_text()
    assert summary_rows(page)["fhat", "mean F̂_P Toeplitz R², layer 0"] == "by construction"
    record = record_of(tmp_path / "r", "rotary")
    expected = np.mean([row["q_long_band_share"] for row in record["summary"]])
    assert summary_rows(page)["rotary", "query norm in bands longer than the context (mean over layers)"] == (
        f"{expected:.2f}"
    )


@pytest.fixture(scope="module")
def causal_folder(tmp_path_factory):
    """A tiny Llama causal LM (512 positions) with a character tokenizer, as in tests/test_needle.py."""
    from test_needle import char_tokenizer, tiny_causal_lm

    folder = tmp_path_factory.mktemp("tiny-causal")
    char_tokenizer().save_pretrained(folder)
    tiny_causal_lm().save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_context_section_equals_its_record_and_encoders_say_why_not(bert_report, causal_folder, tmp_path):
    for name in ("context", "needle"):
        section = bert_report[0]["sections"][name]
        assert section["status"] == "not applicable" and section["reason"].startswith("not a causal language model")
    summary = run_report([str(causal_folder), "--only", "context", "--out", str(tmp_path / "r")])
    record = record_of(tmp_path / "r", "context")
    assert record["lengths"] == [256, 512] and record["variants"] == ["none"]
    page = Path(summary["html"]).read_text()
    assert summary_rows(page)["context", "perplexity at 512 tokens"] == f"{record['perplexity']['none']['512']:.2f}"
    assert summary_references(page)["context", "perplexity at 512 tokens"] == (
        f"{record['perplexity']['none']['256']:.2f} (at 256 tokens, the same tokens scored)"
    )
    rows = table_rows(section_html(page, "context"))
    interval = record["perplexity_interval"]["none"]
    assert rows == [[str(n), f"{record['perplexity']['none'][str(n)]:.2f}",
                     f"{interval[str(n)][0]:.2f}–{interval[str(n)][1]:.2f}" if interval[str(n)][0] else "—",
                     str(record["scored_tokens"][str(n)])] for n in record["lengths"]]  # fmt: skip
    assert len(set(record["scored_tokens"].values())) == 1


@pytest.mark.slow
def test_needle_section_equals_its_record(causal_folder, tmp_path):
    summary = run_report([str(causal_folder), "--only", "needle", "--out", str(tmp_path / "r")])
    record = record_of(tmp_path / "r", "needle")
    assert record["lengths"] == [240, 480] and record["n_prompts"] == 2 * 3 * 2  # 512 - 32: room for the answer
    page = Path(summary["html"]).read_text()
    exact = np.mean([[g["accuracy"] for g in record["grid"]]])
    assert summary_rows(page)["needle", "needle retrieval accuracy (all prompts)"] == f"{exact:.2f}"
    from scipy.stats import binomtest

    def cell(a):
        ci = binomtest(round(a * 2), 2).proportion_ci(0.95, method="wilson")
        return f"{a:.2f} ({ci.low:.2f}–{ci.high:.2f})"

    assert record["trials"] == 2
    assert table_rows(section_html(page, "needle")) == [[str(g["length"]), *map(cell, g["accuracy"])]
                                                        for g in record["grid"]]  # fmt: skip


@pytest.mark.slow
def test_rerun_reuses_finished_sections_unless_force(bert_report, tiny_bert_folder, texts_file):
    summary, out, args = bert_report
    again = run_report(args)
    assert all(s["reused"] for s in again["sections"].values() if s["status"] == "ok")
    assert again["headline"] == summary["headline"]
    fewer = run_report([*args, "--max-texts", "10", "--only", "fhat,states"])  # new arguments: states runs again
    assert fewer["sections"]["fhat"]["reused"] and not fewer["sections"]["states"]["reused"]
    assert record_of(out, "states")["n_texts"] == 10 and record_of(out, "states")["min_texts"] == 10
    forced = run_report([*args, "--only", "fhat", "--force"])
    assert forced["sections"]["fhat"]["reused"] is False


@pytest.mark.slow
def test_ctrl_c_keeps_finished_sections_for_the_next_run(tiny_bert_folder, tmp_path, monkeypatch, capsys):
    import posprobe.report.run as report_run

    calls, real = [], report_run.run_through

    def interrupted_second(section, call):  # every section, through the library
        calls.append(section.command)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(section, call)

    monkeypatch.setattr(report_run, "run_through", interrupted_second)
    out = tmp_path / "r"
    with pytest.raises(SystemExit) as info:
        main(["report", str(tiny_bert_folder), "--only", "fhat,profiles", "--out", str(out)])
    assert info.value.code == 130 and calls == ["fhat", "profiles"]
    assert (out / "fhat" / "section.json").is_file() and not (out / "profiles").exists()
    assert not (out / "report.html").exists()
    monkeypatch.setattr(report_run, "run_through", real)
    again = run_report([str(tiny_bert_folder), "--only", "fhat,profiles", "--out", str(out)])
    assert again["sections"]["fhat"]["reused"] and not again["sections"]["profiles"]["reused"]


@pytest.mark.slow
def test_the_page_is_self_contained(bert_report):
    page = Path(bert_report[0]["html"]).read_text()
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert "url(" not in page and "http://" not in page and "https://" not in page
    sources = re.findall(r'src="([^"]*)"', page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    links = [h for h in re.findall(r'href="([^"]*)"', page) if not h.startswith("#")]
    # beside each figure, a link to its full-resolution file in the report's folder (a link loads nothing)
    assert len(links) == len(sources) and all(h.endswith(".png") and not h.startswith(("/", "..")) for h in links)
    out = bert_report[1]
    assert all((out / h).is_file() for h in links)
    assert "Content-Security-Policy" in page and 'name="viewport"' in page
    for width, height in re.findall(r'<img src="data:[^"]*" width="(\d+)" height="(\d+)"', page):
        assert int(width) > 100 and int(height) > 100


@pytest.mark.parametrize(
    "args, message",
    [
        (["--only", "toeplitz,bogus"], "unknown section 'bogus' in --only — use names from: toeplitz, fhat"),
        (["--skip", "fhat", "--only", "toeplitz"], "--skip and --only cannot be combined"),
        (["--max-texts", "0"], "--max-texts must be at least 1, got 0"),
        (["--text", "/nonexistent/texts.txt"], "text file '/nonexistent/texts.txt' does not exist"),
        (["--column", "sentence"], "--column applies only with --text"),
        (["/nonexistent/model"], "/nonexistent/model"),
        (["--max-texts", "many"], "Invalid value for '--max-texts'"),
        (["--only", ""], "--only is empty"),
    ],
)
def test_hostile_input_is_one_line_and_writes_nothing(args, message, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        main(["report", *args, "--out", str(out)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posprobe: error:") and "\n" not in err and message in err
    assert not out.exists()


@pytest.mark.slow
def test_pickle_only_checkpoint_refused_unless_allowed_and_passed_on(tiny_models, tmp_path, capsys):
    """As for every command: pickle weights are refused in one line before anything is written; --allow-pickle is
    passed on to each section's command (and shown in the command that reproduces it)."""
    import torch

    folder = tmp_path / "pickled"
    tiny_models["bert"].config.save_pretrained(folder)
    torch.save(tiny_models["bert"].state_dict(), folder / "pytorch_model.bin")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        main(["report", str(folder), "--only", "toeplitz", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "--allow-pickle" in err and "\n" not in err and not out.exists()
    summary = run_report([str(folder), "--only", "toeplitz", "--allow-pickle", "--out", str(out)])
    assert summary["sections"]["toeplitz"]["status"] == "ok"
    assert "--allow-pickle" in shlex.split(summary["sections"]["toeplitz"]["command"])


def test_a_refused_section_fails_alone_in_one_line(texts_file, tmp_path):
    """`states` refuses an encoder-decoder (T5): the command's own one-line error; the other sections run."""
    import transformers as tf
    from tiny_tokenizer import word_tokenizer

    folder = tmp_path / "tiny-t5"
    word_tokenizer(60).save_pretrained(folder)
    config = tf.T5Config(vocab_size=99, d_model=32, d_ff=37, num_layers=2, num_heads=4, d_kv=8)
    tf.T5Model(config).save_pretrained(folder)
    args = [str(folder), "--text", str(texts_file), "--column", "sentence", "--only", "fhat,states"]
    record = run_report([*args, "--out", str(tmp_path / "r")])
    states = record["sections"]["states"]
    assert record["sections"]["fhat"]["status"] == "ok"
    assert states["status"] == "failed" and "\n" not in states["reason"] and "encoder-decoder" in states["reason"]
    assert states["command"].startswith("posprobe states")
    assert "Failed: " in section_html(Path(record["html"]).read_text(), "states")


def test_every_section_is_registered_once_with_its_command():
    assert list(SECTIONS) == ["toeplitz", "fhat", "profiles", "fit-tisa", "rotary", "attention", "profiles-text",
                              "states", "context", "needle"]  # fmt: skip
    assert SECTIONS["profiles-text"].command == "profiles" and SECTIONS["profiles-text"].uses_text
    registered = {c.name for c in app.registered_commands}
    assert {s.command for s in SECTIONS.values()} <= registered and "report" in registered


# ---------------------------------------------------------------------------------------------------------------
# in a real browser

_SIZES = """<script>document.title = JSON.stringify([document.documentElement.clientWidth,
  Array.from(document.images).map(i => {
    const r = i.getBoundingClientRect(); return [i.naturalWidth, i.naturalHeight, r.width, r.height]; })]);</script>"""


def _check_in_browser(page_path: Path, tmp_path: Path) -> None:
    """No console message and no request leaving the file; every figure decoded and drawn at its size, at a
    laptop's and a phone's width; the screenshot is not blank."""
    page = page_path.read_text()
    loaded = visit(page_path, tmp_path)
    assert loaded.console == [] and loaded.requests == []
    assert "<h1>How " in loaded.stdout
    n_images = page.count("<img ")
    # A copy with a script that reports each image's natural and drawn size (the page itself forbids scripts).
    probe = tmp_path / "probe.html"
    probe.write_text(
        re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page).replace("</body>", _SIZES + "</body>")
    )
    for width in (1280, 500):  # a laptop; a phone held sideways (500: the narrowest window headless Chromium lays out)
        dom = visit(probe, tmp_path, width=width).stdout
        viewport, sizes = json.loads(html.unescape(re.search(r"<title>(.*?)</title>", dom, re.S).group(1)))
        assert viewport <= width
        assert len(sizes) == n_images > 0
        for natural_w, natural_h, drawn_w, drawn_h in sizes:
            assert natural_w > 100 and natural_h > 100  # decoded
            assert min(natural_w, 0.6 * viewport) <= drawn_w + 2  # fills the column
            if width >= 1280:  # legible (issue 49): never under 0.75 CSS px per pixel (a 7-pt label at 110 dpi: 8 px)
                assert drawn_w >= LEGIBLE_SCALE * natural_w - 2 and drawn_w <= natural_w + 2
            else:  # a phone: the figure fits the width (its full-resolution file is linked beside)
                assert drawn_w <= viewport
            assert drawn_h == pytest.approx(drawn_w * natural_h / natural_w, rel=0.02, abs=2)  # aspect kept
    shot = tmp_path / "shot.png"
    visit(page_path, tmp_path, width=1280, height=1600, screenshot=shot)
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (1600, 1280)
    assert (pixels.min(axis=-1) < 0.9).mean() > 0.05 and pixels.std() > 0.1  # ink, not a blank page


def test_the_harness_sees_console_errors_and_requests(tmp_path):
    if chromium_path() is None:
        pytest.skip(NO_CHROMIUM)
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><img src="http://example.invalid/x.png"><script>console.error("boom")</script></body></html>'
    )
    seen = visit(bad, tmp_path)
    assert any('"boom"' in line for line in seen.console)
    assert any("example.invalid" in line for line in seen.requests)


@pytest.mark.slow  # ~3 s: a real browser
def test_page_in_headless_chromium(bert_report, tmp_path):
    if chromium_path() is None:
        pytest.skip(NO_CHROMIUM)
    _check_in_browser(Path(bert_report[0]["html"]), tmp_path)


@pytest.mark.slow
def test_default_report_on_the_packaged_model_in_chromium(tmp_path):
    """`posprobe report` with no model on the packaged MiniLM (offline), checked in Chromium (required here)."""
    assert chromium_path() is not None, NO_CHROMIUM
    summary = run_report(["--out", str(tmp_path / "report")])
    assert summary["model"] == "all-MiniLM-L6-v2" and summary["text"] == "builtin:sentences"
    statuses = {name: s["status"] for name, s in summary["sections"].items()}
    not_applicable = ("rotary", "context", "needle")  # a bidirectional BERT with a learned table
    assert statuses == {name: "not applicable" if name in not_applicable else "ok" for name in SECTIONS}
    assert record_of(tmp_path / "report", "attention")["n_texts"] == 32
    assert Path(summary["html"]).stat().st_size <= 2.5e6  # issue 49: 4.7 MB, 2.1 MB of it F̂_P's image
    _check_in_browser(Path(summary["html"]), tmp_path)


@pytest.mark.slow
def test_report_takes_lengths_rope_scaling_and_device_to_context_and_needle(causal_folder, tmp_path):
    """`report --lengths --rope-scaling --device` (issue 49): the context section runs the lengths (past the
    trained 512 too) with every variant, on the device, each variant's perplexity in its table equal to the
    record's; the needle section gets the lengths and the device (and --beyond-window past the trained positions)."""
    out = tmp_path / "r"
    args = [str(causal_folder), "--only", "context", "--lengths", "64,600", "--rope-scaling", "none,yarn:2",
            "--device", "cpu", "--out", str(out)]  # fmt: skip
    summary = run_report(args)
    record = record_of(out, "context")
    assert record["lengths"] == [64, 600] and record["variants"] == ["none", "yarn:2"]
    assert record["beyond_trained_length"] == [600]
    argv = json.loads((out / "context" / "section.json").read_text())["argv"]
    assert argv[argv.index("--rope-scaling") + 1] == "none,yarn:2" and argv[argv.index("--device") + 1] == "cpu"
    assert summary["sections"]["context"]["command"] == shlex.join(["posprobe", *argv])
    rows = table_rows(section_html(Path(summary["html"]).read_text(), "context"))
    ppl, interval = record["perplexity"], record["perplexity_interval"]["none"]
    assert rows == [[f"{n}{' *' if n == 600 else ''}", *[f"{ppl[v][str(n)]:.2f}" for v in ("none", "yarn:2")],
                     f"{interval[str(n)][0]:.2f}–{interval[str(n)][1]:.2f}" if interval[str(n)][0] else "—",
                     str(record["scored_tokens"][str(n)])] for n in (64, 600)]  # fmt: skip
    from posprobe.checkpoint import resolve_model
    from posprobe.report.run import long_context_options, model_facts

    facts = model_facts(resolve_model(str(causal_folder)))
    options = long_context_options(facts, [64, 600], "yarn:2", "cpu")["needle"]
    assert facts.max_positions == 512
    assert options == {"--lengths": "64,600", "--device": "cpu", "--beyond-window": ""}
    assert long_context_options(facts, [64, 480], None, None)["needle"]["--beyond-window"] is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lengths", "1,x"], "--lengths '1,x' is not a list of whole numbers"),
        (["--rope-scaling", "bogus:2"], "--rope-scaling 'bogus:2' is not a variant"),
        (["--device", "nonsense"], "--device"),
    ],
)
def test_report_long_context_options_refused_in_one_line(args, message, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        main(["report", *args, "--out", str(out)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posprobe: error:") and "\n" not in err and message in err, err
    assert not out.exists()


@pytest.mark.slow
def test_embedded_figures_are_palette_pngs_of_the_same_picture(tmp_path):
    """A noisy heatmap as the commands write it (110 dpi, viridis, labels): the page embeds it as a 256-colour
    PNG (the full-resolution file linked beside), at most half the file's bytes, every pixel within 3 % of the
    file's (read back with Pillow here)."""
    import io

    from matplotlib.figure import Figure
    from PIL import Image

    from posprobe.report.page import figure_html, page_png

    fig = Figure(figsize=(8, 3), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    ax.imshow(np.random.default_rng(0).normal(size=(256, 512)), cmap="viridis")
    ax.set_title("F̂_P of head 0 — noisy", fontsize=9)
    path = tmp_path / "fhat.png"
    fig.savefig(path, dpi=110)
    data = path.read_bytes()
    small = page_png(data)
    assert len(small) <= 0.5 * len(data)
    with Image.open(io.BytesIO(small)) as embedded, Image.open(path) as original:
        assert embedded.mode == "P" and embedded.size == original.size
        a = np.asarray(embedded.convert("RGB"), dtype=float)
        b = np.asarray(original.convert("RGB"), dtype=float)
    assert np.abs(a - b).max() <= 0.03 * 255
    fragment = figure_html(str(path), base=tmp_path)
    assert '<a href="fhat.png">full resolution</a>' in fragment
    assert f"--n: {a.shape[1]}px; --w: {round(a.shape[1] * LEGIBLE_SCALE)}px" in fragment
