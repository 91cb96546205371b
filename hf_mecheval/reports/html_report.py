"""``report.html``: the whole report on one self-contained page (``mecheval report``, the
quickstart, ``mecheval reproduce``).

One file, nothing outside it: the figures are embedded as ``data:`` URIs, the styles inline, no
script; its Content-Security-Policy forbids loading anything else, so a page that tried would
say so in the browser's console (a test renders it in headless Chromium and fails on any console
error). Sections, in order: the preamble, the verdicts (where the report has them: the
quickstart's checks of the paper's headline), the table of runs, the figures, and each run's
mechanism grid — restoration by site (rows) and position (columns), one table per corruption,
coloured on the same scale as the PNG heatmaps (viridis, -0.2 to 1).
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

import matplotlib

from ..runs.files import format_score, last_layer_summary

SCALE = (-0.2, 1.0)              # the colour scale's ends, as plots.residual_heatmap's
STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1320px;
       padding: 1.5em 2em 4em; color: #1d1d1f; background: #fff; }
h1 { font-size: 1.7em; margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
h3 { margin: 1.6em 0 0.2em; font-size: 1.1em; }
table { border-collapse: collapse; margin: 0.4em 0 1em; font-variant-numeric: tabular-nums; }
th, td { padding: 0.25em 0.6em; border: 1px solid #ddd; text-align: right; white-space: nowrap; }
th { background: #f4f4f6; } td.text, th.text { text-align: left; } td.wrap { white-space: normal; }
.holds { color: #0a6b2d; font-weight: 600; } .fails { color: #a4161a; font-weight: 600; }
.grid { font-size: 0.85em; } .grid td { min-width: 3.4em; text-align: center; border: 1px solid #fff; }
.grid th { font-weight: 500; } .runs { font-size: 0.9em; } .runs th, .runs td { padding: 0.25em 0.45em; }
.na { background: #e6e6e9; color: #6e6e73; }
.pair { display: flex; flex-wrap: wrap; gap: 0 2.4em; } .run > p { margin: 0 0 0.3em; color: #444; }
.pair p { margin: 0.2em 0 0; color: #444; }
.figures { display: flex; flex-wrap: wrap; gap: 1.2em 1.5em; align-items: flex-start; }
figure { margin: 0; flex: 0 1 calc(50% - 0.75em); }
figure img { max-width: 100%; border: 1px solid #eee; } figcaption { color: #555; font-size: 0.9em; }
.legend { display: inline-block; width: 14em; height: 0.9em; vertical-align: middle; margin: 0 0.4em; }
.preamble { white-space: pre-wrap; }
"""
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def heat_colours(value: float | None) -> tuple[str, str]:
    """(background, text colour) of a restoration value on the viridis scale ``SCALE``; None:
    ("", "") (the cell is marked n/a)."""
    if value is None:
        return "", ""
    lo, hi = SCALE
    fraction = min(1.0, max(0.0, (value - lo) / (hi - lo)))
    r, g, b, _ = matplotlib.colormaps["viridis"](fraction)
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return matplotlib.colors.to_hex((r, g, b)), "#000" if luminance > 0.45 else "#fff"


def _cell(value: float | None, title: str = "") -> str:
    tip = f' title="{html.escape(title)}"' if title else ""
    if value is None:
        return f'<td class="na"{tip}>n/a</td>'
    background, colour = heat_colours(value)
    return f'<td style="background:{background};color:{colour}"{tip}>{format_score(value)}</td>'


def _table(head: list[str], rows: list[list[str]], text: tuple[int, ...] = (0,), css: str = "") -> str:
    """A table of already-escaped cells (a cell starting with ``<td`` is taken as it is); the
    columns ``text`` are aligned left, the others (numbers) right."""
    def th(i, h):
        return f'<th class="text">{h}</th>' if i in text else f"<th>{h}</th>"

    def td(i, c):
        if c.startswith("<td"):
            return c
        return f'<td class="text">{c}</td>' if i in text else f"<td>{c}</td>"

    lines = [f'<table class="{css}">' if css else "<table>",
             "<tr>" + "".join(th(i, h) for i, h in enumerate(head)) + "</tr>"]
    lines += ["<tr>" + "".join(td(i, c) for i, c in enumerate(row)) + "</tr>" for row in rows]
    return "\n".join(lines + ["</table>"])


def _percent(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _minutes(seconds) -> str:
    return "" if seconds is None else f"{seconds / 60:.1f} min"


def runs_table(rows: list[dict]) -> str:
    head = ["run", "model", "width", "layers", "task", "learning rate", "seed", "validation", "test", "@key",
            "@value", "@query", "mechanism", "training"]
    body = []
    for r in rows:
        mechanism = f"{r['mechanism']} ({r.get('confidence')})" if r.get("mechanism") else "n/a (not evaluated)"
        body.append([html.escape(str(r["run"])), html.escape(str(r["label"])), str(r.get("hidden_size")),
                     str(r.get("layers")), html.escape(str(r.get("task"))),
                     "" if r.get("learning_rate") is None else f"{r['learning_rate']:g}", str(r.get("seed")),
                     _percent(r.get("validation_accuracy")), _percent(r.get("test_accuracy")),
                     *(_cell(r.get(f"@{p}")) for p in ("key", "value", "query")),
                     html.escape(mechanism),
                     _minutes(r.get("train_wall_seconds", r.get("train_seconds")))])
    return _table(head, body, text=(0, 1, 4, 12), css="runs")


def verdicts_table(verdicts: list[dict]) -> str:
    body = [[f'<span class="{"holds" if v["holds"] else "fails"}">{"reproduced" if v["holds"] else "not reproduced"}'
             f"</span>", f'<td class="text wrap">{html.escape(v["claim"])}</td>',
             f'<td class="text wrap">{html.escape(v["figures"])}</td>']
            for v in verdicts]
    return _table(["verdict", "claim", "figures"], body, text=(0, 1, 2))


def mechanism_grid(result: dict, corruption: str) -> str:
    """Restoration by site (rows, in the grid's order) and position (columns), ``corruption``
    corrupted; each cell's title gives its bootstrap interval."""
    cells = {(c["site"], c["position"]): c for c in result["corruptions"][corruption]["cells"]}
    positions = result["positions"]
    body = []
    for site in result["sites"]:
        row = [f'<th class="text">{html.escape(site)}</th>']
        for p in positions:
            c = cells.get((site, p))
            value = None if c is None else c.get("restoration")
            ci = None if c is None else c.get("restoration_ci")
            title = f"{site} @{p}: " + ("not measured" if c is None else f"restoration {format_score(value)}"
                                        + (f", 95 % interval [{format_score(ci[0])}, {format_score(ci[1])}]"
                                           if ci else ""))
            row.append(_cell(value, title))
        body.append("<tr>" + "".join(row) + "</tr>")
    head = "<tr><th class=\"text\">site</th>" + "".join(f"<th>@{html.escape(p)}</th>" for p in positions) + "</tr>"
    return "\n".join(['<table class="grid">', head, *body, "</table>"])


def run_section(row: dict, result: dict) -> str:
    """A run's heading, its label with the reason the current rule gives, and its grids side by side."""
    reason = last_layer_summary(result)["reason"]
    parts = [f'<div class="run" id="run-{html.escape(str(row["run"]))}">',
             f"<h3>{html.escape(str(row['label']))} (d={row.get('hidden_size')})"
             f"{'' if row['run'] == row['label'] else ' — ' + html.escape(str(row['run']))}</h3>",
             f"<p>test accuracy {_percent(row.get('test_accuracy'))}; mechanism <b>{html.escape(str(row.get('mechanism')))}</b>"
             f" ({html.escape(str(row.get('confidence')))}): {html.escape(str(reason))}</p>", '<div class="pair">']
    for corruption in result["corruptions"]:
        clean = result["corruptions"][corruption].get("clean_accuracy")
        parts += ["<div>", f"<p>{html.escape(corruption)} corrupted ({result.get('examples')} documents, clean "
                           f"accuracy {_percent(clean)})</p>", mechanism_grid(result, corruption), "</div>"]
    return "\n".join(parts + ["</div>", "</div>"])


def markdown_table_html(text: str) -> str:
    """A Markdown table (``| a | b |`` lines, the second the separator) as an HTML table: the
    report's further tables (MQAR's), which are written as Markdown for report.md."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip().startswith("|")]
    if len(lines) < 2:
        return ""
    cells = [[html.escape(c.strip()) for c in line.strip("|").split("|")] for line in lines]
    return _table(cells[0], cells[2:], text=tuple(range(len(cells[0]))))


def figure_html(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    name = html.escape(Path(path).stem)
    return f'<figure><img src="data:image/png;base64,{data}" alt="{name}"><figcaption>{name}</figcaption></figure>'


def legend() -> str:
    lo, hi = SCALE
    stops = ", ".join(heat_colours(lo + (hi - lo) * i / 10)[0] for i in range(11))
    return (f'<p>Restoration: {lo:g}<span class="legend" style="background:linear-gradient(to right, {stops})">'
            f"</span>{hi:g}; grey: n/a, nothing to restore (corrupting hardly changed the probability of the "
            f"answer). Hover over a cell for its interval.</p>")


def html_page(title: str, preamble: str, rows: list[dict], grids: list[dict | None], figures: list[Path],
              verdicts: list[dict] | None = None, verdicts_title: str = "Verdicts",
              sections: list[tuple[str, list[str]]] = ()) -> str:
    """The page: ``rows`` as ``report.collect_runs`` makes them, ``grids`` each row's
    interventions.json (None where the run was not evaluated), ``figures`` PNG files;
    ``sections``: (heading, Markdown tables) shown after the runs (MQAR's)."""
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{html.escape(title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
             f"<h1>{html.escape(title)}</h1>"]
    if preamble.strip():
        parts.append(f'<p class="preamble">{html.escape(preamble.strip())}</p>')
    if verdicts:
        parts += [f"<h2>{html.escape(verdicts_title)}</h2>", verdicts_table(verdicts)]
    parts += ["<h2>Runs</h2>", "<p>Accuracy on the answer token; @key, @value, @query: restoration of the residual "
              "stream entering the last layer at that position, key corrupted.</p>", runs_table(rows)]
    for heading, tables in sections:
        parts += [f"<h2>{html.escape(heading)}</h2>", *(markdown_table_html(t) for t in tables if t)]
    if figures:
        parts += ["<h2>Figures</h2>", '<div class="figures">', *(figure_html(p) for p in figures), "</div>"]
    evaluated = [(row, grid) for row, grid in zip(rows, grids) if grid is not None]
    if evaluated:
        parts += ["<h2>Mechanism grids</h2>", legend(), *(run_section(row, grid) for row, grid in evaluated)]
    return "\n".join(parts + ["</body>", "</html>"]) + "\n"
