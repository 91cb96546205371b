"""`mecheval quickstart --tiny` end to end, and `mecheval report`."""
import csv
import json
import re

import pytest
from html_checks import cell_texts, chromium, embedded_pngs, parse_page, render_in_chromium

from hf_mecheval.cli import main as mecheval

PNG = b"\x89PNG\r\n\x1a\n"


def qs_plan():
    from hf_mecheval.reports.quickstart import PLAN

    return PLAN


def test_tiny_quickstart_writes_every_artefact(tmp_path, capsys, monkeypatch):
    out = tmp_path / "qs"
    assert mecheval(["quickstart", "--tiny", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    # progress: a line as each job ends, then each job's wall time beside its run's training time
    # (stderr is no terminal here: plain lines, as in a log file)
    ended = re.findall(r"^\[(\d)/8\] (\w+): done in \d+:\d\d$", captured.err, re.M)
    assert [int(k) for k, _ in ended] == list(range(1, 9))
    assert sorted(name for _, name in ended) == sorted(qs_plan().models)
    table = captured.err.split("wall time of each job")[1].splitlines()[1:]
    assert [row.split()[0] for row in table] == [name for _, name in ended]
    # the form only: how long a tiny run trains depends on the machine and its load
    assert all(re.search(r"\s\d+:\d\d(:\d\d)?  \(training \d+:\d\d(:\d\d)?\)$", row) for row in table), table
    assert "\x1b" not in captured.err
    # each job's log has its progress lines; its progress file ends with the intervention grid
    assert "step 20/20, epoch" in (out / "runs" / "h3.log").read_text()
    assert json.loads((out / "runs" / "h3.progress.json").read_text())["phase"] == "interventions"
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["label"]: r for r in summary["rows"]}
    assert set(rows) == {"transformer", "based", "mamba (conv 4)", "mamba (conv 0)", "hyena", "h3", "baseconv",
                         "deltanet"}
    for name in ("accuracy.png", "scatter_value_query.png", "scatter_query_key.png", "layers.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    report = (out / "report.md").read_text()
    # the numbers in the report are those of the JSON
    for r in summary["rows"]:
        line = next(l for l in report.splitlines() if l.startswith(f"| {r['label']} (d="))
        assert f"{100 * r['test_accuracy']:.1f} %" in line
        for p in ("key", "value", "query"):
            value = r[f"@{p}"]
            assert ("n/a" if value is None else f"{value:.2f}") in line
        assert r["mechanism"] in line
    # each verdict of the JSON is stated in the report, reproduced or not as the JSON has it
    assert len(summary["checks"]) == 8
    for check in summary["checks"]:
        verdict = "**reproduced**" if check["holds"] else "**not reproduced**"
        assert f"- {verdict}: {check['claim']} — {check['figures']}\n" in report, check["claim"]
    assert "mamba (conv 0)" in printed and "report:" in printed
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert len(runs) == 8
    check_report_page(out, summary)
    # a second invocation reuses the finished runs and their intervention grids
    made = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/*.safetensors")}
    made.update({p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/interventions/interventions.json")})
    assert len(made) == 16
    assert mecheval(["quickstart", "--tiny", "--out", str(out)]) == 0
    assert "jobs" not in capsys.readouterr().err          # nothing to train or evaluate
    assert all(p.stat().st_mtime_ns == t for p, t in made.items())
    # a run whose grid was lost gets only its grid again, not a new training
    (out / "runs" / "h3" / "interventions" / "interventions.json").unlink()
    assert mecheval(["quickstart", "--tiny", "--out", str(out)]) == 0
    assert (out / "runs" / "h3" / "interventions" / "interventions.json").exists()
    assert all(p.stat().st_mtime_ns == t for p, t in made.items() if "h3" not in str(p))
    assert (out / "runs" / "h3" / "model.safetensors").stat().st_mtime_ns == made[out / "runs" / "h3" / "model.safetensors"]
    # another seed is another run: refused in this folder, naming the seed
    assert mecheval(["quickstart", "--tiny", "--seed", "1", "--out", str(out)]) == 2
    assert "training.seed: 0 there, 1 asked" in capsys.readouterr().err
    # a person's file beside the report: refused before anything runs, the file kept as it was;
    # --overwrite writes the report beside it
    (out / "notes.md").write_text("mine")
    assert mecheval(["quickstart", "--tiny", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "notes.md" in err and "--overwrite" in err and "jobs" not in err
    assert mecheval(["quickstart", "--tiny", "--out", str(out), "--overwrite"]) == 0
    assert (out / "notes.md").read_text() == "mine"
    (out / "notes.md").unlink()
    # ... but not for another setting: the full quickstart (here a cheap stand-in) never reports
    # the tiny models under its heading
    import dataclasses

    import hf_mecheval.reports.quickstart as qs

    monkeypatch.setattr(qs, "PLAN", dataclasses.replace(qs.PLAN, setting={**qs.PLAN.tiny, "train_size": 128}))
    before = (out / "summary.json").read_text()
    assert mecheval(["quickstart", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cannot reuse" in err and "task.train_size: 256 there, 128 asked" in err
    assert (out / "summary.json").read_text() == before


def check_report_page(out, summary):
    """report.html: well formed, self-contained, the headline's verdicts, and every run's grid cell
    for cell as its interventions.json has it; no console error where Chromium can render it."""
    page = parse_page((out / "report.html").read_text())
    assert page.errors == [] and len(embedded_pngs(page)) == len(summary["figures"])
    verdicts = cell_texts(page.tables[0])[1:]
    assert [(v, c) for v, c, _ in verdicts] == [("reproduced" if c["holds"] else "not reproduced", c["claim"])
                                                for c in summary["checks"]]
    assert sorted(page.runs) == sorted(f"run-{name}" for name in qs_plan().models)
    for name in qs_plan().models:
        result = json.loads((out / "runs" / name / "interventions" / "interventions.json").read_text())
        tables = page.runs[f"run-{name}"]
        assert len(tables) == len(result["corruptions"])
        for table, corruption in zip(tables, result["corruptions"].values()):
            shown = {(r[0], p): text for r in cell_texts(table)[1:] for p, text in zip(result["positions"], r[1:])}
            assert len(shown) == len(result["sites"]) * len(result["positions"])
            for c in corruption["cells"]:
                value = c["restoration"]
                assert shown[(c["site"], c["position"])] == ("n/a" if value is None else f"{value:.2f}")
    if chromium() is not None:
        assert render_in_chromium(out / "report.html") == []


def test_report_command_and_errors(tmp_path, capsys):
    assert mecheval(["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("nothing does not exist")        # a mistyped path, said as such
    (tmp_path / "empty").mkdir()
    assert mecheval(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "empty is not a finished run: run.json, metrics.json are missing" in err[0]


def test_headline_verdicts_follow_the_figures():
    from hf_mecheval.reports.quickstart import PLAN, headline

    def row(acc, mech=None, key=None, value=None, query=None):
        return {"test_accuracy": acc, "mechanism": mech, "@key": key, "@value": value, "@query": query}

    paper = {"transformer": row(0.99, "induction", 0.0, 1.0, 0.0), "based": row(0.99, "induction", 0.0, 1.0, 0.0),
             "mamba_conv4": row(0.97, "direct_key_query", 0.45, 0.0, 0.3), "mamba_conv0": row(0.24, "failed"),
             "hyena": row(0.4, "failed"), "h3": row(0.3, "failed"), "baseconv": row(0.3, "failed"),
             "deltanet": row(1.0, "direct_query", 0.0, 0.0, 1.0)}
    assert set(paper) == set(PLAN.models)
    checks = headline(paper)
    assert len(checks) == 8 and all(c["holds"] for c in checks)
    # each departure from the paper fails exactly its own claim
    for name, change, claim_word in [("transformer", {"mechanism": "direct_query"}, "transformer"),
                                     ("mamba_conv4", {"@value": 0.9}, "induction"),
                                     ("mamba_conv4", {"@key": 0.1, "@query": 0.1}, "induction"),
                                     ("mamba_conv0", {"test_accuracy": 0.95}, "width 0"),
                                     ("hyena", {"test_accuracy": 0.95, "mechanism": "induction"}, "hyena"),
                                     ("deltanet", {"mechanism": "induction"}, "DeltaNet")]:
        rows = {k: dict(v) for k, v in paper.items()}
        rows[name].update(change)
        failed = [c["claim"] for c in headline(rows) if not c["holds"]]
        assert len(failed) == 1 and claim_word in failed[0], (name, change, failed)


def test_the_quickstart_plan_is_read_from_its_experiment_file_with_every_key_checked(tmp_path, monkeypatch):
    import hf_mecheval.experiments as experiments
    from hf_mecheval.errors import MechEvalError
    from hf_mecheval.reports.quickstart import PLAN, QuickstartPlan
    from hf_mecheval.training.spec import RunSpec

    # every model trains with the setting's arguments and its own, as `mecheval train` checks them
    for name in PLAN.training_order:
        spec = RunSpec.from_values(PLAN.run_args(name))
        assert spec.train_size == 24000 and spec.training.learning_rate == PLAN.models[name]["learning_rate"]
        assert RunSpec.from_values(PLAN.run_args(name, tiny=True)).training.max_steps == 20
    assert PLAN.run_args("mamba_conv0")["model_config"] == {"conv_kernel": 0} and PLAN.grid.n == 256
    text = (experiments.EXPERIMENTS_DIR / "quickstart.yaml").read_text()
    monkeypatch.setattr(experiments, "EXPERIMENTS_DIR", tmp_path)
    for broken, message in [(text + "\nepochs: 3\n", "epochs: unknown key"),
                            (text.replace("training_order:", "order:"), "order: unknown key"),
                            (text.replace("tiny_grid: {n: 32, resamples: 100}", ""), "tiny_grid: missing"),
                            (text.replace("  deltanet: {", "  delta: {"), "must give exactly the models"),
                            (text.replace("grid: {n: 256", "grid: {documents: 256"), "grid:")]:
        (tmp_path / "quickstart.yaml").write_text(broken)
        with pytest.raises(MechEvalError, match=message):
            QuickstartPlan.load()


def test_bars_of_runs_that_share_a_label_name_their_rate_and_seed():
    from hf_mecheval.reports.report import run_tick_labels

    rows = [{"label": "mamba (conv 2)", "learning_rate": 0.01, "seed": 0},
            {"label": "mamba (conv 2)", "learning_rate": 0.003, "seed": 0},
            {"label": "mamba (conv 3)", "learning_rate": 0.01, "seed": 0},
            {"label": "based", "learning_rate": 0.001, "seed": 0}, {"label": "based", "learning_rate": 0.001, "seed": 1}]
    assert run_tick_labels(rows) == ["mamba (conv 2), lr 0.01", "mamba (conv 2), lr 0.003", "mamba (conv 3)",
                                     "based, lr 0.001, s0", "based, lr 0.001, s1"]


def test_the_mechanism_plane_names_each_model_once_beside_the_axes_and_keeps_every_run_inside(tmp_path, monkeypatch):
    from matplotlib.colors import to_rgba

    from hf_mecheval.reports import report
    from hf_mecheval.reports.labels import ARCHITECTURE_ORDER

    # the width sweep's picture: two models induce (@value 1), three retrieve at the query (@query 1),
    # so the runs stand in two crowds; one Transformer's @value (1.31) lies beyond the paper's plane
    def run(label, n, value, query):
        return [{"run": f"{label}{i}", "label": label, "architecture": label.split()[0], "hidden_size": 256,
                 "layers": 2, "conv_kernel": None, "task": "ar_32", "learning_rate": 1e-3, "seed": i,
                 "test_accuracy": 1.0, "mechanism": "induction" if value else "direct_query", "@key": 0.0, "@value": value,
                 "@query": query, "layer_scores": {"layers.1.input@value": value}} for i in range(n)]
    rows = (run("based", 4, 1.0, 0.0) + run("transformer", 1, 1.31, 0.0) + run("deltanet", 2, 0.0, 1.0)
            + run("hyena", 4, 0.0, 1.0) + run("mamba (conv 4)", 8, 0.0, 1.0))
    drawn, save = {}, report.save_figure

    def keep_what_is_drawn(fig, path):                   # the planes' axes, legend and points as drawn, then the PNG
        if not path.name.startswith("scatter_"):
            return save(fig, path)
        renderer = fig.canvas.get_renderer()
        fig.tight_layout()
        ax = fig.axes[0]
        legend = ax.get_legend()
        drawn[path.name] = {
            "texts": [t.get_text() for t in ax.texts],
            "names": [t.get_text() for t in legend.get_texts()],
            "legend": legend.get_window_extent(renderer), "axes": ax.get_window_extent(renderer),
            "limits": (ax.get_xlim(), ax.get_ylim()),
            "points": [(c.get_label(), to_rgba(c.get_edgecolor()[0], 1.0), [tuple(o) for o in c.get_offsets()])
                       for c in ax.collections if c.get_label() and not c.get_label().startswith("_")]}
        return save(fig, path)
    monkeypatch.setattr(report, "save_figure", keep_what_is_drawn)
    report.figures(rows, tmp_path)
    for name, x, y in (("scatter_query_key.png", "@query", "@key"), ("scatter_value_query.png", "@value", "@query")):
        seen = drawn[name]
        assert seen["texts"] == []                       # no text on the plane to run into a neighbour
        assert seen["names"] == ["based ×4", "deltanet ×2", "hyena ×4", "mamba (conv 4) ×8", "transformer"]
        assert not seen["legend"].overlaps(seen["axes"]), name
        colours = {label.split(" ×")[0]: colour for label, colour, _ in seen["points"]}
        # a colour per model, its architecture's as in every other figure (Transformer C0, Based C1, ...)
        assert colours == {model: to_rgba(f"C{ARCHITECTURE_ORDER.index(model.split()[0])}")
                           for model in ("based", "deltanet", "hyena", "mamba (conv 4)", "transformer")}
        (x0, x1), (y0, y1) = seen["limits"]
        for label, _, points in seen["points"]:
            model = label.split(" ×")[0]
            expected = sorted((r[x], r[y]) for r in rows if r["label"] == model)
            assert sorted(points) == expected, (name, label)
            assert all(x0 < px < x1 and y0 < py < y1 for px, py in points), (name, label, seen["limits"])


def test_the_mechanism_plane_over_several_tasks_colours_the_architecture_and_shapes_the_task(tmp_path, monkeypatch):
    from matplotlib.colors import to_rgba

    from hf_mecheval.reports import report
    from hf_mecheval.reports.labels import ARCHITECTURE_ORDER

    # the ATR languages' sweep in small: two architectures on three tasks, Based on one
    rows = [{"run": f"{task}_{label}", "label": label, "architecture": label.split()[0], "hidden_size": 64,
             "layers": 2, "conv_kernel": None, "task": task, "learning_rate": 1e-3, "seed": 0,
             "test_accuracy": 0.9, "mechanism": None, "@key": 0.1 * i, "@value": 0.5, "@query": 0.2}
            for i, (task, label) in enumerate([(t, m) for t in ("atr_easy", "atr_gen", "atr_medium")
                                               for m in ("transformer", "mamba (conv 4)")] + [("atr_gen", "based")])]
    figures = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path: figures.append(fig) or path)
    report._mechanism_plane(rows, "query", "key", tmp_path / "plane.png")
    drawn = {c.get_label(): (to_rgba(c.get_edgecolor()[0], 1.0), c.get_paths()[0].vertices.tobytes())
             for c in figures[0].axes[0].collections if c.get_label() and not c.get_label().startswith("_")}
    assert sorted(drawn) == sorted(f"{r['task']}: {r['label']}" for r in rows)
    for name, (colour, _) in drawn.items():        # an architecture's colour on every task
        assert colour == to_rgba(f"C{ARCHITECTURE_ORDER.index(name.split(': ')[1].split()[0])}"), name
    shape_of_task = {}
    for name, (_, shape) in drawn.items():          # one shape per task, a different one for each task
        shape_of_task.setdefault(name.split(": ")[0], set()).add(shape)
    assert all(len(shapes) == 1 for shapes in shape_of_task.values()), shape_of_task
    assert len({next(iter(shapes)) for shapes in shape_of_task.values()}) == 3


def test_accuracy_against_width_draws_each_architecture_in_its_own_colour(tmp_path, monkeypatch):
    from matplotlib.colors import to_rgba

    from hf_mecheval.reports import report

    # Mamba and Hyena alone: by their index in the sweep they would be C0 and C1 (the Transformer's
    # and Based's colours in every other figure); each line takes its architecture's instead
    rows = [{"run": f"{label}{width}", "label": label, "architecture": label.split()[0], "hidden_size": width,
             "layers": 2, "conv_kernel": None, "task": "ar_32", "learning_rate": 1e-3, "seed": 0,
             "test_accuracy": accuracy, "validation_accuracy": accuracy, "mechanism": None}
            for label, accuracies in (("hyena", (0.2, 0.3)), ("mamba (conv 4)", (0.7, 0.9)))
            for width, accuracy in zip((64, 256), accuracies)]
    lines, save = {}, report.save_figure

    def keep_lines(fig, path):
        if path.name == "accuracy.png":
            lines.update({line.get_label(): (to_rgba(line.get_color()), list(line.get_ydata()))
                          for line in fig.axes[0].get_lines()})
        return save(fig, path)
    monkeypatch.setattr(report, "save_figure", keep_lines)
    report.figures(rows, tmp_path)
    assert lines == {"hyena": (to_rgba("C4"), [20.0, 30.0]), "mamba (conv 4)": (to_rgba("C2"), [70.0, 90.0])}


def test_the_short_convolution_figure_breaks_a_rates_line_where_that_rate_has_no_run(tmp_path, monkeypatch):
    from hf_mecheval.reports import report

    # Mamba: kernels 0, 2, 4 at 1e-2 and 1, 3 at 3e-3 (seeds 0 and 1 at 3); no line may join two
    # points over a kernel its rate never ran
    rows = [{"run": f"k{k}s{seed}", "label": f"mamba (conv {k})", "architecture": "mamba", "hidden_size": 64,
             "layers": 2, "conv_kernel": k, "task": "ar_32", "learning_rate": lr, "seed": seed,
             "test_accuracy": accuracy, "validation_accuracy": accuracy, "mechanism": None}
            for k, lr, seed, accuracy in ((0, 1e-2, 0, 0.0), (2, 1e-2, 0, 0.7), (4, 1e-2, 0, 0.9),
                                          (1, 3e-3, 0, 0.1), (3, 3e-3, 0, 0.8), (3, 3e-3, 1, 0.6))]
    lines, save = {}, report.save_figure

    def keep_lines(fig, path):
        if path.name == "conv_kernel.png":
            lines.update({line.get_label(): [round(y, 6) if y == y else None for y in line.get_ydata()]
                          for line in fig.axes[0].get_lines()})
        return save(fig, path)
    monkeypatch.setattr(report, "save_figure", keep_lines)
    report.figures(rows, tmp_path)
    assert lines == {"mamba, lr 0.01": [0.0, None, 70.0, None, 90.0],
                     "mamba, lr 0.003": [None, 10.0, None, 70.0, None]}


def test_the_layer_heatmap_orders_runs_by_rate_as_a_number_not_by_run_name():
    from hf_mecheval.reports.report import in_run_order

    # the order a glob over run folders gives: 0.01, 1e-03, 1e-04, 3e-03 (text), widths 256 before 64
    rows = [{"label": "based", "hidden_size": 256, "learning_rate": lr, "seed": 0} for lr in (0.01, 1e-3, 1e-4, 3e-3)]
    rows += [{"label": "based", "hidden_size": 64, "learning_rate": 1e-3, "seed": s} for s in (1, 0)]
    rows += [{"label": "mamba (conv 4)", "hidden_size": 64, "learning_rate": 1e-2, "seed": None}]
    order = [(r["label"], r["hidden_size"], r["learning_rate"], r["seed"]) for r in in_run_order(rows)]
    assert order == [("based", 64, 1e-3, 0), ("based", 64, 1e-3, 1), ("based", 256, 1e-4, 0), ("based", 256, 1e-3, 0),
                     ("based", 256, 3e-3, 0), ("based", 256, 0.01, 0), ("mamba (conv 4)", 64, 1e-2, None)]
    # several tasks: each task's runs together, in that order within it
    tasks = [{"task": task, "label": label, "hidden_size": 64, "learning_rate": 1e-3, "seed": 0}
             for task, label in (("atr_gen", "mamba"), ("atr_easy", "transformer"), ("atr_easy", "mamba"),
                                 ("atr_gen", "transformer"))]
    assert [(r["task"], r["label"]) for r in in_run_order(tasks)] == [
        ("atr_easy", "mamba"), ("atr_easy", "transformer"), ("atr_gen", "mamba"), ("atr_gen", "transformer")]


def test_the_layer_heatmap_says_why_a_row_is_blank(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from hf_mecheval.reports import report

    def row(label, layers, mechanism, scores):
        return {"run": label, "label": label, "architecture": label, "hidden_size": 64, "layers": layers,
                "conv_kernel": None, "task": "ar_32", "learning_rate": 1e-3, "seed": 0, "test_accuracy": 0.9,
                "mechanism": mechanism, "@key": 0.0, "@value": 0.0, "@query": 1.0, "layer_scores": scores}

    # a 2-layer model that fails (the grid measured nothing: every score None), a 1-layer one that
    # retrieves (its second layer's cells blank: it has none), and a label whose grid lacked the key
    failing = row("hyena", 2, "failed", {f"layers.{l}.input@{p}": None for l in (0, 1) for p in ("key", "value", "query")})
    one_layer = row("mamba", 1, "direct_key_query", {"layers.0.input@key": 1.0, "layers.0.input@value": 0.0,
                                                     "layers.0.input@query": 0.0})
    unmeasured = row("h3", 1, "direct_query", {"layers.0.input@key": None})
    drawn = {}
    monkeypatch.setattr(report, "save_figure", lambda fig, path: drawn.setdefault(path.name, fig) and path)
    report.figures([failing, one_layer, unmeasured], tmp_path)
    ax = drawn["layers.png"].axes[0]
    said = {round(t.get_position()[1]): t.get_text() for t in ax.texts}
    row_of = {t.get_text().split(" d=")[0]: i for i, t in enumerate(ax.get_yticklabels())}
    assert said == {row_of["hyena"]: "no restoration measured (the model fails the task)",
                    row_of["h3"]: "no restoration measured"}
    plt.close("all")


def test_bars_of_runs_on_several_tasks_name_the_task():
    from hf_mecheval.reports.report import run_tick_labels

    rows = [{"label": "mamba (conv 4)", "learning_rate": 0.001, "seed": 0, "task": "atr_easy"},
            {"label": "mamba (conv 4)", "learning_rate": 0.001, "seed": 0, "task": "atr_gen"},
            {"label": "transformer", "learning_rate": 0.001, "seed": 0, "task": "atr_gen"}]
    assert run_tick_labels(rows) == ["atr_easy: mamba (conv 4)", "atr_gen: mamba (conv 4)", "atr_gen: transformer"]
    assert run_tick_labels([{**r, "task": "ar_32"} for r in rows[:1]]) == ["mamba (conv 4)"]


def test_the_report_table_names_each_run_apart_from_the_others():
    from hf_mecheval.reports.report import markdown_table

    def row(label, task, width=64, lr=1e-3, seed=0):
        return {"label": label, "task": task, "hidden_size": width, "learning_rate": lr, "seed": seed,
                "test_accuracy": 0.5, "mechanism": "induction", "confidence": "high", "@key": 0.0, "@value": 1.0,
                "@query": 0.0}
    # an ATR-languages sweep: one model on two tasks, one at two seeds, one at another width
    rows = [row("mamba (conv 4)", "atr_easy"), row("mamba (conv 4)", "atr_gen"),
            row("transformer", "atr_gen"), row("transformer", "atr_gen", seed=1), row("transformer", "atr_gen", 128)]
    names = [line.split(" | ")[0][2:] for line in markdown_table(rows).splitlines()[2:]]
    assert names == ["atr_easy: mamba (conv 4) (d=64)", "atr_gen: mamba (conv 4) (d=64)",
                     "atr_gen: transformer (d=64), lr 0.001, s0", "atr_gen: transformer (d=64), lr 0.001, s1",
                     "atr_gen: transformer (d=128)"]
    # one task, each model once (the quickstart's table): the model and its width only
    assert markdown_table([row("based", "ar_32")]).splitlines()[2].startswith("| based (d=64) | 50.0 % |")


def test_accuracy_against_width_draws_the_line_through_the_rate_chosen_on_validation(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from hf_mecheval.reports import report

    def row(width, lr, seed, validation, test):
        return {"label": "mamba (conv 4)", "architecture": "mamba", "hidden_size": width, "learning_rate": lr,
                "seed": seed, "validation_accuracy": validation, "test_accuracy": test, "conv_kernel": 4}

    # at 128 the rate with the best mean validation (3e-3, two seeds) is not the one with the best test
    rows = [row(128, 3e-3, 0, 0.80, 0.70), row(128, 3e-3, 1, 0.90, 0.80), row(128, 1e-2, 0, 0.84, 0.95),
            row(256, 1e-3, 0, 0.60, 0.55), row(256, 3e-3, 0, 0.0, 0.0)]
    drawn = {}
    monkeypatch.setattr(report, "save_figure", lambda fig, path: drawn.setdefault(path.name, fig) and path)
    report.figures(rows, tmp_path)
    ax = drawn["accuracy.png"].axes[0]
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [128, 256]
    assert list(line.get_ydata()) == pytest.approx([75.0, 55.0])       # 3e-3's mean test at 128; 1e-3 at 256
    dots = ax.collections[0].get_offsets()                             # every run, as a dot
    assert sorted(map(tuple, dots.tolist())) == sorted((r["hidden_size"], 100 * r["test_accuracy"]) for r in rows)
    plt.close("all")
