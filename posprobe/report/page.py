"""The report page: one self-contained HTML file (figures as PNG data URIs, one inline style sheet, no script, and a
Content-Security-Policy that forbids loading anything from elsewhere), readable from a phone to a laptop."""

from __future__ import annotations

import base64
import datetime
import html
import struct
from pathlib import Path

from posprobe.report.sections import ModelFacts, Table

# default-src 'none': no script, font, frame or fetch; images only from data: URIs; the one inline style sheet.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
:root { color-scheme: light; --ink: #1b1f24; --dim: #57606a; --line: #d0d7de; --soft: #f6f8fa; --accent: #0b5cad; }
* { box-sizing: border-box; }
body { margin: 0; font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); }
main { max-width: 62rem; margin: 0 auto; padding: 1rem; }
h1 { font-size: 1.6rem; margin: 0.5rem 0; } h2 { font-size: 1.3rem; margin: 0 0 0.5rem; }
h3 { font-size: 1rem; margin: 1rem 0 0.25rem; }
section { border-top: 1px solid var(--line); padding: 1.25rem 0; }
.meta, .note, .status { color: var(--dim); font-size: 0.92rem; }
.status.na, .status.failed { margin: 0; }
.table-wrap { overflow-x: auto; margin: 0.5rem 0; }
table { border-collapse: collapse; font-size: 0.88rem; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 0.2rem 0.5rem; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
table.summary td.label { white-space: normal; } table.summary td.reference { color: var(--dim); text-align: left; }
p.story a { color: var(--ink); text-decoration-color: var(--line); }
thead th { background: var(--soft); }
ul.headline { padding-left: 1.2rem; } ul.headline b { font-variant-numeric: tabular-nums; }
figure { margin: 0.75rem 0; } img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); }
figure.fig { width: clamp(100%, var(--w), calc(100vw - 2rem)); position: relative; left: 50%;
  transform: translateX(-50%); }
figure.fig .scroll { overflow-x: auto; }
figure.fig img { max-width: none; width: max(min(100%, var(--n)), var(--w)); }
figcaption { color: var(--dim); font-size: 0.85rem; }
pre { background: var(--soft); padding: 0.6rem; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
a { color: var(--accent); }
@media (max-width: 40rem) { body { font-size: 15px; } main { padding: 0.6rem; } th, td { padding: 0.15rem 0.3rem; }
  figure.fig { width: 100%; left: 0; transform: none; } figure.fig img { width: auto; max-width: 100%; } }
"""


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])


# CSS pixels per image pixel at which a figure is drawn at least (where the page is wide enough): the figures are
# written at 110 dpi, so a 7-pt label (10.7 image pixels) stays 8 CSS pixels tall; a wider figure than the page
# scrolls sideways in its own box rather than shrinking its text (SmolLM2's 30-layer heatmaps, issue 49).
LEGIBLE_SCALE = 0.75
PALETTE_COLOURS = 256


def page_png(data: bytes) -> bytes:
    """The PNG embedded in the page: the figure's pixels in a 256-colour palette (a colour map has 256 colours, and
    text its greys; Pillow's maximum-coverage quantiser keeps every pixel within a few levels of the file's, where
    median cut moved rare colours by up to a third of the range), written optimised; the file itself where that is
    not smaller or Pillow cannot read it. The full-resolution file is linked beside it (F̂_P's noisy heatmaps made
    MiniLM's page 4.7 MB, issue 49)."""
    import io

    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            image.load()
            rgb = image.convert("RGBA")
            flat = Image.new("RGB", rgb.size, "white")
            flat.paste(rgb, mask=rgb.getchannel("A"))
            small = flat.quantize(PALETTE_COLOURS, method=Image.Quantize.MAXCOVERAGE, dither=Image.Dither.NONE)
            buffer = io.BytesIO()
            small.save(buffer, "PNG", optimize=True)
    except Exception:  # noqa: BLE001 - any failure keeps the original bytes
        return data
    return buffer.getvalue() if len(buffer.getvalue()) < len(data) else data


def figure_html(path: str, base: Path | None = None) -> str:
    """An <img> holding the PNG at `path` as a data URI (`page_png`), with its pixel size, drawn at the column's
    width or at least `LEGIBLE_SCALE` of its pixels (wider than the column up to the window, then scrolling in its
    box), and a link to the full-resolution file (relative to `base`, the page's folder)."""
    import os

    file = Path(path)
    try:
        data = page_png(file.read_bytes())
        width, height = png_size(data)
    except (OSError, ValueError):
        return f'<p class="note">figure {html.escape(file.name)} could not be read</p>'
    encoded = base64.b64encode(data).decode("ascii")
    name = html.escape(file.name)
    link = ""
    if base is not None:
        try:
            href = Path(os.path.relpath(file.resolve(), Path(base).resolve())).as_posix()
            link = f' — <a href="{html.escape(href)}">full resolution</a>'
        except ValueError:  # another drive (Windows): no relative path
            link = ""
    style = f"--n: {width}px; --w: {round(width * LEGIBLE_SCALE)}px"
    image = f'<img src="data:image/png;base64,{encoded}" width="{width}" height="{height}" alt="{name}">'
    caption = f"<figcaption>{name}{link}</figcaption>"
    return f'<figure class="fig" style="{style}"><div class="scroll">{image}</div>{caption}</figure>'


def table_html(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table.rows)
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'


def _story(claims) -> str:
    """The summary's opening sentences, each a link to the section it comes from."""
    if not claims:
        return ""
    sentences = " ".join(f'<a href="#{html.escape(c.section)}">{html.escape(c.text)}</a>' for c in claims)
    return f'<p class="story">{sentences}</p>'


def _summary(outcomes, claims=()) -> str:
    rows, lines = [], []
    for o in outcomes:
        name, title = html.escape(o.section.name), html.escape(o.section.title)
        if o.view is not None:
            for h in o.view.headline:
                rows.append(f'<tr><td class="label"><a href="#{name}">{html.escape(h.label)}</a></td>'
                            f'<td class="value">{html.escape(h.text)}</td>'
                            f'<td class="label reference">{html.escape(h.reference_text)}</td></tr>')  # fmt: skip
        else:
            lines.append(
                f'<li><a href="#{name}">{title}</a>: {html.escape(o.status)} — {html.escape(str(o.reason))}</li>'
            )
    table = (
        '<div class="table-wrap"><table class="summary"><thead><tr><th>headline</th><th>value</th>'
        f"<th>read against</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        if rows
        else '<p class="note">no section ran</p>'
    )
    others = f'<ul class="note">{"".join(lines)}</ul>' if lines else ""
    return f'<section id="summary"><h2>Summary</h2>{_story(claims)}{table}{others}</section>'


def _section(o, base: Path | None = None) -> str:
    name = html.escape(o.section.name)
    parts = [f'<section id="{name}"><h2>{html.escape(o.section.title)}</h2>']
    if o.view is None:
        css = "na" if o.status == "not applicable" else "failed"
        parts.append(f'<p class="status {css}">{html.escape(o.status.capitalize())}: {html.escape(str(o.reason))}</p>')
        if o.command_line:
            parts.append(f"<h3>Command</h3><pre><code>{html.escape(o.command_line)}</code></pre>")
        return "".join(parts) + "</section>"
    items = "".join(f"<li>{html.escape(h.label)}: <b>{html.escape(h.text)}</b> — read against "
                    f"{html.escape(h.reference_text)}</li>" for h in o.view.headline)  # fmt: skip
    parts.append(f'<ul class="headline">{items}</ul>')
    parts.extend(figure_html(f, base) for f in o.view.figures)
    if o.view.table is not None:
        parts.append(table_html(o.view.table))
    parts.extend(f'<p class="note">{html.escape(n)}</p>' for n in o.view.notes)
    parts.append(f"<h3>How to read it</h3><p>{html.escape(o.section.how_to_read)}</p>")
    parts.append(f"<h3>Reproduce</h3><pre><code>{html.escape(o.command_line or '')}</code></pre>")
    took = f"{o.seconds:.1f} s" if o.seconds is not None else "?"
    ran = f"reused from an earlier run (which took {took})" if o.reused else f"ran in {took}"
    parts.append(f'<p class="note">{ran}; files: {html.escape(o.argv[o.argv.index("--out") + 1])}</p>')
    return "".join(parts) + "</section>"


def render_page(facts: ModelFacts, outcomes, text: str | None, claims=(), base: Path | None = None) -> str:
    """The whole page as one string; `claims` (`story.Claim`) open the summary; `base` the page's folder (figures
    link their full-resolution files relative to it)."""
    from posprobe.version import __version__

    label = html.escape(facts.label)
    causal = "causal (decoder)" if facts.causal else "bidirectional"
    texts = f"; texts: {html.escape(text)}" if text else ""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"<header><h1>How {label} handles position</h1>"
        f'<p class="meta">model type {html.escape(facts.model_type)}; positions: {html.escape(facts.mechanism)}; '
        f"{causal}{texts}. Conventions: query i attends to key j, offset k = j − i. "
        f"Made by posprobe {html.escape(__version__)} on {stamp}.</p></header>"
    )
    body = header + _summary(outcomes, claims) + "".join(_section(o, base) for o in outcomes)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>posprobe report — {label}</title><style>{STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )
