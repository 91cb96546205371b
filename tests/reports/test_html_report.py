"""report.html (``reports/html_report.py``): one self-contained page, parsed back strictly, every
figure and figure of merit checked against what it was made from; rendered in headless Chromium
(where the system's ``chromium`` is installed) with no console error. The tiny quickstart's
page, made from real runs, is checked the same way in test_quickstart_and_report.py."""
from pathlib import Path

import pytest
from html_checks import cell_texts, chromium, embedded_pngs, parse_page, render_in_chromium

from hf_mecheval.reports.html_report import heat_colours, html_page, markdown_table_html
from hf_mecheval.reports.report import figures

SITES = ["layers.0.input", "layers.0.mixer.state", "layers.1.input"]
POSITIONS = ["key", "value", "divider", "query", "answer"]


def grid(values: dict, clean=1.0) -> dict:
    """An interventions.json of two layers: ``values[(site, position)]`` the restoration of each
    cell (missing: not measured), the same grid under both corruptions."""
    cells = [{"site": s, "layer": int(s.split(".")[1]), "component": s.split(".", 2)[2], "position": p,
              "restoration": values.get((s, p)), "restoration_ci": None if values.get((s, p)) is None
              else [values[(s, p)] - 0.05, values[(s, p)] + 0.05]}
             for s in SITES for p in POSITIONS if (s, p) in values or p != "answer"]
    corruption = {"clean_accuracy": clean, "cells": cells}
    return {"examples": 256, "sites": SITES, "positions": POSITIONS,
            "corruptions": {"key": corruption, "value": corruption}, "mechanism": {"reason": "as written then"}}


INDUCTION = {("layers.1.input", "key"): 0.0, ("layers.1.input", "value"): 1.0, ("layers.1.input", "query"): 0.0,
             ("layers.0.input", "key"): 1.0, ("layers.0.mixer.state", "query"): 0.25,
             ("layers.0.input", "value"): -0.2}


def row(run, label, accuracy, mechanism=None, **scores):
    return {"run": run, "label": label, "architecture": label.split()[0], "hidden_size": 64, "layers": 2,
            "conv_kernel": None, "task": "ar_32", "learning_rate": 3e-4, "seed": 0, "validation_accuracy": accuracy,
            "test_accuracy": accuracy, "train_wall_seconds": 90.0, "mechanism": mechanism,
            "confidence": "high" if mechanism else None, **scores,
            "layer_scores": {"layers.0.input@key": 1.0, "layers.1.input@value": 1.0} if mechanism else {}}


def make_page(tmp_path):
    rows = [row("transformer", "transformer <b>&", 1.0, "induction", **{"@key": 0.0, "@value": 1.0, "@query": 0.0}),
            row("h3", "h3", 0.25)]                                        # h3 never evaluated: no grid
    made = figures(rows, tmp_path)
    verdicts = [{"claim": "transformer solves AR by induction", "holds": True, "figures": "accuracy 1.00"},
                {"claim": "h3 fails AR", "holds": False, "figures": "accuracy 0.25 > 0.2 <made up>"}]
    text = html_page("a report & its title", "Setting: AR, 2 layers.", rows, [grid(INDUCTION), None], made,
                     verdicts, "The paper's headline here")
    (tmp_path / "report.html").write_text(text)
    return text, rows, made


def test_the_page_is_self_contained_and_holds_what_it_was_made_from(tmp_path):
    text, rows, made = make_page(tmp_path)
    page = parse_page(text)
    assert page.errors == []
    assert page.titles == ["a report & its title"] and "script" not in page.tags
    csp = [m["content"] for m in page.metas if m.get("http-equiv") == "Content-Security-Policy"]
    assert csp == ["default-src 'none'; img-src data:; style-src 'unsafe-inline'"]
    # every figure embedded, byte for byte; nothing else referenced
    assert embedded_pngs(page) == [Path(p).read_bytes() for p in made] and len(made) >= 3
    verdicts, runs = page.tables[0], page.tables[1]
    assert cell_texts(verdicts) == [["verdict", "claim", "figures"],
                                    ["reproduced", "transformer solves AR by induction", "accuracy 1.00"],
                                    ["not reproduced", "h3 fails AR", "accuracy 0.25 > 0.2 <made up>"]]
    assert cell_texts(runs)[1] == ["transformer", "transformer <b>&", "64", "2", "ar_32", "0.0003", "0", "100.0 %",
                                   "100.0 %", "0.00", "1.00", "0.00", "induction (high)", "1.5 min"]
    assert cell_texts(runs)[2][:9] == ["h3", "h3", "64", "2", "ar_32", "0.0003", "0", "25.0 %", "25.0 %"]
    assert cell_texts(runs)[2][9:13] == ["n/a", "n/a", "n/a", "n/a (not evaluated)"]
    assert "Setting: AR, 2 layers." in page.text


def test_each_evaluated_run_has_its_grid_by_site_and_position_on_the_colour_scale(tmp_path):
    text, _, _ = make_page(tmp_path)
    page = parse_page(text)
    assert list(page.runs) == ["run-transformer"]                 # h3 has no grid
    key, value = page.runs["run-transformer"]
    for table in (key, value):
        cells = cell_texts(table)
        assert cells[0] == ["site"] + [f"@{p}" for p in POSITIONS]
        assert [r[0] for r in cells[1:]] == SITES
        for site, line in zip(SITES, cells[1:]):
            for p, shown in zip(POSITIONS, line[1:]):
                v = INDUCTION.get((site, p))
                assert shown == ("n/a" if v is None else f"{v:.2f}"), (site, p)
    # the colour of a cell: viridis from -0.2 (its darkest) to 1 (its brightest), as the PNG heatmaps
    colours = {(site, p): c[2] for site, r in zip(SITES, key.rows[1:]) for p, c in zip(POSITIONS, r[1:])}
    assert "background:#fde725" in colours[("layers.1.input", "value")]["style"]      # 1.0: viridis' top
    assert "background:#440154" in colours[("layers.0.input", "value")]["style"]      # -0.2: its bottom
    assert colours[("layers.1.input", "answer")].get("class") == "na"
    assert "[0.95, 1.05]" in colours[("layers.1.input", "value")]["title"]
    assert heat_colours(5.0) == heat_colours(1.0) and heat_colours(-3.0) == heat_colours(-0.2)
    assert heat_colours(None) == ("", "")
    # the label's reason is the current rule's, not the one the file was written with
    assert "the value position restores" in page.text and "as written then" not in page.text


def test_further_tables_come_from_their_markdown(tmp_path):
    text, rows, made = make_page(tmp_path)
    table = "| task | model | test |\n|---|---|---|\n| mqar_a | based <x> | 99.5 |\n| mqar_b | h3 | 12.0 |\n"
    page = parse_page(html_page("t", "", rows, [None, None], made, sections=[("MQAR", [table, ""])]))
    assert page.errors == [] and cell_texts(page.tables[-1]) == [["task", "model", "test"],
                                                                 ["mqar_a", "based <x>", "99.5"], ["mqar_b", "h3", "12.0"]]
    assert markdown_table_html("no table here") == ""


def test_a_broken_page_is_told_from_a_good_one():
    """The parse's checks can fail: an unclosed tag, an outside reference."""
    page = parse_page('<html><body><div><p>x</div><img src="https://example.org/x.png"></body></html>')
    assert page.errors == ["</div> closes p"]
    with pytest.raises(AssertionError):
        embedded_pngs(page)


NO_CHROMIUM = pytest.mark.skipif(chromium() is None,
                                 reason="headless Chromium is not installed (Debian: apt-get install chromium)")


@NO_CHROMIUM
def test_chromium_reports_a_script_error_and_a_missing_image(tmp_path):
    """The rendering check can fail: what a broken page shows in the console is collected."""
    broken = tmp_path / "broken.html"
    broken.write_text('<!DOCTYPE html><html><body><img src="missing.png"><script>throw new Error("boom")</script>'
                      "</body></html>")
    errors = render_in_chromium(broken)
    assert any("boom" in e for e in errors) and any("missing.png" in e for e in errors), errors


@NO_CHROMIUM
def test_the_page_renders_in_headless_chromium_without_a_console_error(tmp_path):
    make_page(tmp_path)
    shot = tmp_path / "report.png"
    assert render_in_chromium(tmp_path / "report.html", shot) == []
    assert shot.read_bytes().startswith(b"\x89PNG")
