"""REPRODUCTION.md's "The paper's grid": AR at every width, the short-convolution ablations at
width 256, one and three layers and the Transformer without positions, every ATR language; all
under the reference recipe, from ``results/<sweep>/runs.json`` of

    ref_width_ar          AR at widths 16, 32, 128 and 256   (reference/width_ar.yaml)
    ref_width_ablations   Mamba conv 0-3, Based short kernels at 256 (reference/width_ablations.yaml)
    ref_depth             1 and 3 layers, no positions, at 64 (reference/depth.yaml)
    ref_atr_languages     atr_medium, atr_8192, atr_gen; the Transformer and Mamba on atr_easy (reference/atr_languages.yaml)
    ref_ar_beyond         Mamba-2 and Gated DeltaNet on AR at widths 64, 128, 256 (reference/ar_beyond.yaml)

beside the width-64, 2-layer column of the reference setting (``ref_recipe_ar``,
``ref_recipe_ablations``, ``ref_recipe_atr``, reference-recipe rows only). Each table picks,
per configuration, the learning rate with the best mean validation accuracy and reports test
accuracy there (``reference_setting.Selection``). The verdicts are stated at the width the
paper states each claim (its AR table and ablations at 256), and each AR claim again at every
width, so that a claim that holds at one width and not another says at which. A claim whose
learning rates and seeds have not all finished reads "not run yet". The ATR block also gives each
model's test accuracy by document length (``test_by_length`` of metrics.json), a table and a figure.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..runs.files import run_cost, run_seconds
from .reference_setting import (CELL_HEAD, FAILS, PAPER_AR_WIDTH_256, PAPER_MAMBA_CONV_WIDTH_256,
                                REFERENCE_RECIPE, Plan, Selection, _order, _table, _width, accuracy_text,
                                ar_claims, args_label, atr_induction_claim, atr_key, claim_states, finished,
                                measured, mechanisms, planned_runs, recipe, restoration, sweep_run_args,
                                verdict_of)

GRID_SWEEPS = ("ref_width_ar", "ref_width_ablations", "ref_depth", "ref_atr_languages", "ref_ar_beyond")
# the packaged sweep file of each block (what is planned there: a verdict waits for all of it)
SWEEP_FILES = {"ref_width_ar": "reference/width_ar", "ref_width_ablations": "reference/width_ablations",
               "ref_depth": "reference/depth", "ref_atr_languages": "reference/atr_languages",
               "ref_ar_beyond": "reference/ar_beyond",
               "ref_recipe_ar": "reference/recipe_ar", "ref_recipe_ablations": "reference/recipe_ablations",
               "ref_recipe_atr": "reference/recipe_atr"}
WIDTHS = (16, 32, 64, 128, 256)
PAPER_WIDTH = 256
BLOCKS = {"AR at every width": ("ref_width_ar",), "short-convolution ablations at 256": ("ref_width_ablations",),
          "layers and positions at 64": ("ref_depth",), "ATR languages at 64": ("ref_atr_languages",),
          "AR beyond the paper: Mamba-2, Gated DeltaNet": ("ref_ar_beyond",)}


# ---------------------------------------------------------------------------------- rows
def _reference(results: dict[str, list[dict]], sweep: str) -> list[dict]:
    return [dict(r, sweep=sweep) for r in results.get(sweep, []) if recipe(r) == REFERENCE_RECIPE]


def grid_rows(results: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each block's rows, the width-64 (2-layer) column of the reference setting included:
    "ar" (2 layers, every width; Mamba-2's and Gated DeltaNet's rows too, which no claim reads),
    "ablations" (Mamba and Based, every short convolution, widths 64 and 256: conv 4 and Based's
    default 3 are "ar"'s runs), "depth" (width 64, 1-3 layers), "atr"."""
    depth = _reference(results, "ref_depth")
    # the 2-layer runs with the reference's positions (depth.yaml) are also the width-64 column of
    # those models in the width grid, beside width_ar's positions runs at 256
    with_positions = [r for r in depth if r["layers"] == 2 and "positions" in _label_extras(r["label"])]
    ar = [r for s in ("ref_recipe_ar", "ref_width_ar", "ref_ar_beyond") for r in _reference(results, s)
          if r["layers"] == 2]
    ablations = _reference(results, "ref_recipe_ablations") + _reference(results, "ref_width_ablations")
    ablations += [r for r in ar if r["label"] in ("mamba (conv 4)", "based") and r["hidden_size"] in (64, PAPER_WIDTH)]
    depth += [r for r in ar if r["hidden_size"] == 64 and r["architecture"] in {d["architecture"] for d in depth}]
    ar += with_positions
    # the ATR block trains every configuration at the reference's 32 epochs; the reference
    # setting's ATR runs (Mamba with its convolution at 16) fill in only what the block does not plan
    languages = planned(("ref_atr_languages",), atr_key)
    atr = [r for r in _reference(results, "ref_recipe_atr") if (r["label"], r["task"]) not in languages]
    atr += _reference(results, "ref_atr_languages")
    return {"ar": ar, "ablations": ablations, "depth": depth, "atr": atr}


def _label_extras(label: str) -> list[str]:
    """What ``model_label`` adds in brackets: "mamba (conv 4, positions)" -> ["conv 4", "positions"]
    ("transformer (no positions)" -> ["no positions"])."""
    return label.partition(" (")[2].rstrip(")").split(", ") if " (" in label else []


def cells(rows: list[dict], key) -> dict[tuple, Selection]:
    """The configurations of ``rows`` by ``key(row)`` (a tuple beginning with the label)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return {k: Selection(rs) for k, rs in sorted(groups.items(), key=lambda kv: (_order(kv[0][0]), kv[0][1:]))}


def by_width(rows: list[dict]) -> dict[tuple, Selection]:
    return cells(rows, lambda r: (r["label"], r["hidden_size"]))


def by_layers(rows: list[dict]) -> dict[tuple, Selection]:
    return cells(rows, lambda r: (r["label"], r["layers"]))


def planned(sweeps: tuple[str, ...], key) -> Plan:
    """The (learning rate, seed) runs the packaged sweep files of the blocks ``sweeps`` plan per
    configuration ``key(args)``."""
    return planned_runs([SWEEP_FILES[s] for s in sweeps], key)


def _depth_plan() -> Plan:
    """(label, layers) -> the runs planned for it at width 64 (2 layers from recipe_ar.yaml)."""
    return planned(("ref_depth", "ref_recipe_ar"), lambda a: (args_label(a), a.get("num_hidden_layers", 2)))


def planned_by_width() -> Plan:
    """(label, width) -> the runs planned for it, 2 layers (width 64 from recipe_ar.yaml)."""
    return planned(("ref_recipe_ar", "ref_width_ar", "ref_ar_beyond", "ref_recipe_ablations", "ref_width_ablations"),
                   lambda a: (args_label(a), a.get("hidden_size", 64)))


# ---------------------------------------------------------------------------------- tables
def _paper_cell(label: str, width: int, figures: dict) -> str:
    return str(figures[label]) if width == PAPER_WIDTH and label in figures else "—"


def _conv_paper(label: str) -> dict:
    return {label: PAPER_MAMBA_CONV_WIDTH_256[_width(label)]} if label.startswith("mamba") and \
        _width(label) in PAPER_MAMBA_CONV_WIDTH_256 else {}


def grid_tables(results: dict[str, list[dict]]) -> dict[str, str]:
    """Markdown per block whose rows are present, the verdicts at the paper's width and by
    width, and the blocks' compute."""
    rows = grid_rows(results)
    tables = {}
    if results.get("ref_width_ar"):
        width = by_width(rows["ar"])
        tables["grid_width_ar"] = _table(["model", "width", "paper (%)"] + CELL_HEAD,
                                         [[label, str(d), _paper_cell(label, d, PAPER_AR_WIDTH_256)] + s.cells()
                                          for (label, d), s in width.items()])
    if results.get("ref_width_ablations"):
        conv = cells(rows["ablations"], lambda r: (r["label"].split(" ")[0], r["hidden_size"], _width(r["label"])))
        tables["grid_ablations"] = _table(
            ["model (short-conv width)", "width", "paper (%)"] + CELL_HEAD,
            [[_conv_label(arch, k), str(d), _paper_cell(_conv_label(arch, k), d,
                                                       _conv_paper(_conv_label(arch, k)))] + s.cells()
             for (arch, d, k), s in conv.items()])
    if results.get("ref_depth"):
        tables["grid_depth"] = _table(["model", "layers"] + CELL_HEAD + ["restoration by layer (@key / @value / @query)"],
                                      [[label, str(n)] + s.cells() + [_by_layer(s)] for (label, n), s in
                                       by_layers(rows["depth"]).items()])
    if results.get("ref_atr_languages"):
        atr = atr_cells(rows["atr"])
        tables["grid_atr"] = _table(["task", "model", "epochs"] + CELL_HEAD,
                                    [[task, label, "/".join(str(e) for e in sorted({round(r.get("epochs") or 0)
                                                                                     for r in s.best}))] + s.cells()
                                     for (label, task), s in atr.items()])
        tables["grid_atr_by_length"] = atr_by_length_table(atr_lengths(atr))
    if any(results.get(s) for s in GRID_SWEEPS):
        tables["grid_verdicts"] = _table(["claim", "paper", "here", "verdict"],
                                         [[v["claim"], v["paper"], v["figures"], v["verdict"]]
                                          for v in grid_verdicts(rows)])
        tables["grid_by_width"] = _table(["claim"] + [f"width {d}" for d in WIDTHS],
                                         [[claim] + cols for claim, cols in claims_by_width(rows["ar"]).items()])
        tables["grid_compute"] = compute_table(results)
    if results.get("ref_width_ar"):
        tables["grid_run_cost"] = run_cost_table(rows["ar"])
    return tables


TASK_ORDER = ("atr_easy", "atr_gen", "atr_medium", "atr_8192")


def atr_cells(rows: list[dict]) -> dict[tuple, Selection]:
    """The ATR block's (label, task) configurations, by language (``TASK_ORDER``), then model."""
    atr = cells(rows, lambda r: (r["label"], r["task"]))
    return dict(sorted(atr.items(), key=lambda kv: (TASK_ORDER.index(kv[0][1]) if kv[0][1] in TASK_ORDER else 99,
                                                    _order(kv[0][0]))))


def by_length(sel: Selection) -> dict[tuple[int, int], tuple[float, frozenset[int]]] | None:
    """Test accuracy by document length of the chosen rate's runs: {(from, to): (accuracy, test
    documents)}, the accuracy a mean over seeds, the documents each seed's count there (one
    number where every seed scored the same test split); None where a run did not record it
    (``test_by_length`` of metrics.json, written by runs trained since it exists)."""
    if not all(r.get("test_by_length") for r in sel.best):
        return None
    buckets: dict[tuple[int, int], list[tuple[float, int]]] = {}
    for r in sel.best:
        for b in r["test_by_length"]:
            buckets.setdefault((b["length_from"], b["length_to"]), []).append((b["accuracy"], b["documents"]))
    return {k: (sum(a for a, _ in v) / len(v), frozenset(n for _, n in v)) for k, v in sorted(buckets.items())}


def atr_lengths(atr: dict[tuple, Selection]) -> dict[tuple, dict | None]:
    """``by_length`` of each (label, task) configuration of ``atr_cells``, in its order."""
    return {key: by_length(s) for key, s in atr.items()}


def _length_bucket(lo: int, hi: int) -> str:
    return f"{lo}-{hi - 1}"


def _documents_at(models: dict[str, dict | None], length: tuple[int, int]) -> set[int]:
    """Every count of test documents of ``length`` that the models (label: ``by_length``) recorded."""
    return set().union(*(found[length][1] for found in models.values() if found and length in found))


def _documents(counts: set[int]) -> str:
    """A length's test documents: the number, or "varies" where runs scored other test splits
    (another --eval_size or --dataset_seed), "—" where no run has the length."""
    return ("varies" if len(counts) > 1 else str(*counts)) if counts else "—"


def atr_by_length_table(lengths: dict[tuple, dict | None]) -> str:
    """Test accuracy (%) by document length in tokens of each ATR configuration (``atr_lengths``),
    each language's row of test documents per length first."""
    columns = sorted({k for found in lengths.values() if found for k in found})
    lines = []
    for task in dict.fromkeys(task for _, task in lengths):          # in atr's order
        models = {label: found for (label, t), found in lengths.items() if t == task}
        # the documents of each length: the same for every model scoring the language's one test
        # split ("varies" where runs scored other splits: another --eval_size or --dataset_seed)
        counts = [_documents_at(models, k) for k in columns]
        if any(counts):
            lines.append([task, "(test documents)"] + [_documents(n) for n in counts])
        for label, found in models.items():
            lines.append([task, label] + ([f"{100 * found[k][0]:.1f}" if k in found else "—" for k in columns]
                                          if found else ["not recorded"] + [""] * (len(columns) - 1)))
    return _table(["task", "model"] + [f"{_length_bucket(*k)} tokens" for k in columns], lines)


def _conv_label(arch: str, kernel: int) -> str:
    return f"{arch} (conv {'long' if kernel == 99 else kernel})"


def _by_layer(sel: Selection) -> str:
    """Each layer's input restoration (key corrupted) at the key / value / query, mean over the
    chosen rate's seeds: "L0 0.00/0.02/0.98; L1 ..."."""
    layers = sorted({int(k.split(".")[1]) for r in sel.best for k in (r.get("layer_scores") or {})})
    parts = []
    for layer in layers:
        values = []
        for p in ("key", "value", "query"):
            xs = [(r.get("layer_scores") or {}).get(f"layers.{layer}.input@{p}") for r in sel.best]
            xs = [x for x in xs if x is not None]
            values.append(f"{sum(xs) / len(xs):.2f}" if xs else "n/a")
        parts.append(f"L{layer} {'/'.join(values)}")
    return "; ".join(parts) or "n/a"


# ---------------------------------------------------------------------------------- verdicts
def _at_width(sel: dict[tuple, Selection], plan: Plan,
              width: int) -> tuple[dict[str, Selection], callable]:
    """``sel`` (``by_width``) at one width, by label, and each label's state there (``ar_claims``)."""
    at = {label: s for (label, d), s in sel.items() if d == width}
    state = claim_states(sel, plan)
    return at, lambda label: state((label, width))


def grid_verdicts(rows: dict[str, list[dict]]) -> list[dict]:
    """The claims at the width the paper states them (AR and ablations at 256), the depth and
    position claims at 64, and ATR's at 64; each claim's text names its width."""
    conv = [r for r in rows["ablations"] if r["sweep"] == "ref_width_ablations"]     # conv 4 is in "ar"
    at, state = _at_width(by_width(rows["ar"] + conv), planned_by_width(), PAPER_WIDTH)
    out = [dict(v, claim=f"{v['claim']} (width {PAPER_WIDTH})") for v in ar_claims(at, state)]
    depth, depth_plan = by_layers(rows["depth"]), _depth_plan()

    def depth_claim(text, paper, keys, holds, figures, mechanism=False):
        ok = all(finished(depth, k, depth_plan) and (not mechanism or measured(depth[k])) for k in keys)
        out.append({"claim": text, "paper": paper, "figures": figures() if ok else "—",
                    "verdict": verdict_of(holds()) if ok else "not run yet"})

    m1, m2, t1 = ("mamba (conv 4)", 1), ("mamba (conv 4)", 2), ("transformer", 1)
    depth_claim("A 1-layer Mamba still solves AR (within 10 points of 2 layers; width 64)", "solves", (m1, m2),
                lambda: depth[m1].accuracy() >= max(FAILS, depth[m2].accuracy() - 0.1),
                lambda: f"1 layer {accuracy_text(depth[m1])}, 2 layers {accuracy_text(depth[m2])}")
    depth_claim("A 1-layer Transformer cannot solve AR (width 64)", "fails", (t1,),
                lambda: depth[t1].accuracy() <= FAILS, lambda: accuracy_text(depth[t1]))
    three = sorted({k[0] for k in depth_plan if k[1] == 3}, key=_order)      # the models planned with 3 layers

    def two_then_three(label: str) -> str:
        two, three_layers = depth[(label, 2)], depth[(label, 3)]
        return (f"{label}: {accuracy_text(two)} {mechanisms(two)} → "
                f"{accuracy_text(three_layers)} {mechanisms(three_layers)}")

    depth_claim("With 3 layers the picture of 2 holds: each model solves or fails as with 2, by the same mechanism "
                "(width 64)", "as with 2 layers", [(l, n) for l in three for n in (2, 3)] or [("transformer", 3)],
                lambda: all(_same_picture(depth[(l, 2)], depth[(l, 3)]) for l in three),
                lambda: "; ".join(map(two_then_three, three)), mechanism=True)
    t0 = ("transformer (no positions)", 2)
    depth_claim("The Transformer without position embeddings fails AR (width 64)", "fails", (t0,),
                lambda: depth[t0].accuracy() <= FAILS, lambda: accuracy_text(depth[t0]))
    atr = cells(rows["atr"], lambda r: (r["label"], r["task"]))
    atr_plan = planned(("ref_recipe_atr", "ref_atr_languages"), atr_key)
    for task in TASK_ORDER:
        keys = [("transformer", task), ("mamba (conv 4)", task)]
        ready = all(finished(atr, k, atr_plan) and measured(atr[k]) for k in keys)
        out.append(atr_induction_claim(f"{task}: the Transformer uses induction, Mamba (conv 4) does not (width 64)",
                                       atr.get(keys[0]), atr.get(keys[1]), ready))
    return out


def _family(label: str) -> str:
    """A mechanism label's kind: induction, direct retrieval (at the query, or the key and query),
    mixed or failed; seeds of one cell may differ in which position a direct retrieval reads."""
    return "direct" if label.startswith("direct") else label


def _same_picture(two: Selection, three: Selection) -> bool:
    """Both solve (≥ 50 %) or both fail, and the same kinds of mechanism (``_family``) over each
    cell's seeds at its chosen rate."""
    kinds = lambda sel: {_family(r.get("mechanism") or "n/a") for r in sel.best}
    return (two.accuracy() >= FAILS) == (three.accuracy() >= FAILS) and kinds(two) == kinds(three)


def claims_by_width(ar_rows: list[dict]) -> dict[str, list[str]]:
    """Each AR claim (the first six of ``ar_claims``) judged at every width: "holds", "does not
    hold" or "not run yet"; the paper states them at 256."""
    table: dict[str, list[str]] = {}
    sel, plan = by_width(ar_rows), planned_by_width()      # the sweep files read once for all widths
    for width in WIDTHS:
        at, state = _at_width(sel, plan, width)
        for v in ar_claims(at, state)[:6]:
            table.setdefault(v["claim"], []).append(v["verdict"].replace("**", ""))
    return table


# ---------------------------------------------------------------------------------- compute
def compute_table(results: dict[str, list[dict]]) -> str:
    """Each block's measured CPU hours (the runs' own CPU time, which sharing the machine does not
    inflate), wall hours, and how many of its planned runs have finished."""
    lines = []
    for block, sweeps in BLOCKS.items():
        rows = [r for s in sweeps for r in results.get(s, [])]
        planned_runs = sum(len(sweep_run_args(SWEEP_FILES[s])) for s in sweeps)
        cpu = sum(run_seconds(r, "train_cpu_seconds") or 0 for r in rows) / 3600
        wall = sum(run_seconds(r, "train_wall_seconds") or 0 for r in rows) / 3600
        lines.append([block, f"{len(rows)} of {planned_runs}", f"{cpu:.1f}", f"{wall:.1f}"])
    return _table(["block", "runs finished", "CPU hours", "wall hours"], lines)


def run_cost_table(rows: list[dict]) -> str:
    """What one 50 016-step AR run costs, per architecture and width: the median wall and CPU
    minutes of its runs at one thread (beside one other run, as the sweeps run), and how many
    runs that median is of; where a cell has none, of its runs at two threads (a lane with the
    machine's two cores, marked so). A run's cost at a thread count is read from its segments at
    that count (``runs.files.run_cost``); a run trained in a stack counts its share of the stack's."""
    costs: dict[tuple, dict[int, list[tuple[float, float]]]] = {}
    for r in rows:
        if round(r.get("epochs") or 0) != 16:
            continue
        for threads in (1, 2):
            cost = run_cost(r, threads)
            if cost is not None:
                costs.setdefault((r["label"], r["hidden_size"]), {}).setdefault(threads, []).append(cost)

    def median(values):
        values = sorted(values)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    lines = []
    for label in sorted({k[0] for k in costs}, key=_order):
        cells = []
        for width in WIDTHS:
            by_threads = costs.get((label, width), {})
            threads = min(by_threads, default=None)
            if threads is None:
                cells.append("—")
                continue
            runs = by_threads[threads]
            cells.append(f"{median([wall for wall, _ in runs]) / 60:.0f} / {median([cpu for _, cpu in runs]) / 60:.0f} "
                         f"({len(runs)}{'' if threads == 1 else f', {threads} threads'})")
        lines.append([label] + cells)
    return _table(["model"] + [f"width {d}: wall / CPU min (runs)" for d in WIDTHS], lines)


# ---------------------------------------------------------------------------------- figures
def grid_figures(results: dict[str, list[dict]], out: Path) -> list[Path]:
    """accuracy and restoration against width, the ablations against width, restoration by layer
    for 1, 2 and 3 layers: each where its rows are present."""
    rows = grid_rows(results)
    made = []
    if results.get("ref_width_ar"):
        finished = _finished_cells(rows["ar"])      # the sweep files read once for both figures
        made.append(accuracy_width_figure(finished, out / "accuracy_by_width.png"))
        made.append(restoration_width_figure(finished, out / "restoration_by_width.png"))
    if results.get("ref_width_ablations"):
        done = _finished_cells(rows["ablations"])           # as above: no cell part-way through
        made.append(ablations_width_figure([r for r in rows["ablations"] if (r["label"], r["hidden_size"]) in done],
                                           out / "ablations_by_width.png"))
    if results.get("ref_depth"):
        made.append(layers_figure(rows["depth"], out / "restoration_by_layer.png"))
    if results.get("ref_atr_languages"):
        lengths = atr_lengths(atr_cells(rows["atr"]))
        if any(lengths.values()):
            made.append(atr_by_length_figure(lengths, out / "atr_by_length.png"))
    return made


FEWEST_DOCUMENTS = 10       # a length with fewer test documents is not drawn: one or two answers are noise


def atr_by_length_figure(recorded: dict[tuple, dict | None], path: Path) -> Path:
    """Test accuracy against document length, one panel per ATR language, one line per model that
    recorded it (``atr_lengths``; lengths with ``FEWEST_DOCUMENTS`` or more test documents)."""
    import matplotlib.pyplot as plt

    from .plots import save_figure

    lengths = {key: found for key, found in recorded.items() if found}
    tasks = list(dict.fromkeys(task for _, task in lengths))
    style = _styles({label for label, _ in lengths})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 4.2), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        models = {label: found for (label, t), found in lengths.items() if t == task}
        columns = sorted({k for found in models.values() for k, (_, n) in found.items() if min(n) >= FEWEST_DOCUMENTS})
        for label, found in models.items():
            ax.plot(range(len(columns)), [100 * found[k][0] if k in found else math.nan for k in columns],
                    label=label, **style[label])
        ax.set_xticks(range(len(columns)), [f"{_length_bucket(*k)}\n({_documents(_documents_at(models, k))})"
                                            for k in columns], fontsize=8)
        ax.set_xlabel("document length in tokens (test documents)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.set_title(task)
        ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel("test accuracy (%)")
    fig.suptitle(f"ATR test accuracy by document length, width 64, 32 epochs "
                 f"(lengths with {FEWEST_DOCUMENTS} or more test documents)")
    return save_figure(fig, path)


def _styles(labels) -> dict[str, dict]:
    """Line keywords per label: a colour and a marker per model, the colour its architecture's in
    every figure (``architecture_colours``); the model given the reference's positions ("mamba
    (conv 4, positions)") in its model's colour and marker, hollow and dashed, so that the two
    read as one architecture either way (ten colours would otherwise run out)."""
    from .plots import architecture_colours

    def model(label: str) -> str:
        extras = [e for e in _label_extras(label) if e != "positions"]
        name = label.partition(" (")[0]
        return f"{name} ({', '.join(extras)})" if extras else name

    models = sorted({model(label) for label in labels}, key=_order)
    colours = architecture_colours(models)
    styles = {}
    for label in labels:
        i = models.index(model(label))
        styles[label] = {"color": colours[model(label)], "marker": _marker(i)}
        if "positions" in _label_extras(label):
            styles[label].update(linestyle="--", markerfacecolor="white")
    return styles


def accuracy_width_figure(sel: dict[tuple, Selection], path: Path) -> Path:
    """AR test accuracy against width (log2 axis) of the (label, width) cells ``sel``: each
    architecture's best rate per width (mean over seeds, a line marked by architecture; points
    that would hide each other set side by side), every seed there a point, the paper's width-256
    figure a black bar."""
    import matplotlib.pyplot as plt

    from .plots import save_figure

    labels = sorted({label for label, _ in sel}, key=_order)
    style = _styles(labels)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    series = {label: sorted((d, s) for (l, d), s in sel.items() if l == label) for label in labels}
    placed = _dodge({label: [(d, 100 * s.accuracy()) for d, s in pts] for label, pts in series.items()}, close=3)
    for label, pts in series.items():
        xs = [x for x, _ in placed[label]]
        ax.plot(xs, [v for _, v in placed[label]], label=label, **style[label])
        for x, (_, s) in zip(xs, pts):
            ax.scatter([x] * len(s.best), [100 * r["test_accuracy"] for r in s.best],
                       color=style[label]["color"], s=14, alpha=0.5)
        if label in PAPER_AR_WIDTH_256:
            ax.scatter([PAPER_WIDTH * 2 ** 0.28], [PAPER_AR_WIDTH_256[label]], marker="_", s=300,
                       color=style[label]["color"], linewidths=3)
    ax.scatter([], [], marker="_", s=300, color="black", linewidths=3, label="paper, width 256")
    _width_axis(ax)
    ax.set_ylabel("AR test accuracy (%)")
    ax.set_ylim(-3, 105)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title("AR (ar_32) by width: best learning rate (line: mean over seeds; dots: seeds)")
    return save_figure(fig, path)


def _finished_cells(rows: list[dict]) -> dict[tuple, Selection]:
    """The (label, width) cells of ``rows`` that have run at every learning rate and seed planned
    for them: a cell part-way through would draw its best-so-far rate as its best."""
    return _complete(by_width(rows), planned_by_width())


def _complete(sel: dict[tuple, Selection], plan: Plan) -> dict[tuple, Selection]:
    """The cells of ``sel`` every run ``plan`` plans for which has finished."""
    return {key: s for key, s in sel.items() if finished(sel, key, plan)}


def _dodge(series: dict[str, list[tuple[int, float]]], close: float,
           step: float = 0.08) -> dict[str, list[tuple[float, float]]]:
    """``series``: each label's (width, value) points -> the same with widths moved along the log2
    axis where they would hide each other: at one width, the points whose values chain within
    ``close`` of each other are set ``step`` octave apart, centred on the width, in ``series``'
    order; a point alone stays at its width."""
    at_width: dict[int, list[tuple[float, str]]] = {}
    for label, pts in series.items():
        for d, v in pts:
            at_width.setdefault(d, []).append((v, label))
    order = {label: i for i, label in enumerate(series)}
    placed: dict[tuple[str, int], float] = {}
    for d, points in at_width.items():
        groups: list[list[tuple[float, str]]] = []
        for v, label in sorted(points):
            if groups and v - groups[-1][-1][0] <= close:
                groups[-1].append((v, label))
            else:
                groups.append([(v, label)])
        for group in groups:
            labels = sorted((label for _, label in group), key=order.get)
            for j, label in enumerate(labels):
                placed[(label, d)] = d * 2 ** (step * (j - (len(labels) - 1) / 2))
    return {label: [(placed[(label, d)], v) for d, v in pts] for label, pts in series.items()}


def _marker(i: int) -> str:
    """One marker per architecture, so that lines that meet stay told apart in black and white."""
    return "osD^vPX*"[i % 8]


def _width_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlim(WIDTHS[0] / 2 ** 0.4, WIDTHS[-1] * 2 ** 0.45)   # room for points set side by side
    ax.set_xticks(WIDTHS, [str(d) for d in WIDTHS])
    ax.minorticks_off()
    ax.set_xlabel("width (hidden size)")
    ax.grid(alpha=0.3)


def restoration_width_figure(sel: dict[tuple, Selection], path: Path) -> Path:
    """Restoration @value, @query and @key (the last layer's input, key corrupted) of the
    (label, width) cells ``sel``, each architecture's chosen runs against width, one panel per
    position; runs that failed the task (labelled "failed": their scores mean nothing) are left
    out."""
    import matplotlib.pyplot as plt

    from .plots import save_figure

    labels = sorted({label for label, _ in sel}, key=_order)
    style = _styles(labels)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
    for ax, p in zip(axes, ("value", "query", "key")):
        series = {label: [(d, restoration(s)[p]) for (l, d), s in sorted(sel.items(), key=lambda kv: kv[0][1])
                          if l == label and mechanisms(s) != "failed" and restoration(s)[p] is not None]
                  for label in labels}
        for label, pts in _dodge(series, close=0.05, step=0.12).items():
            if pts:
                ax.plot([x for x, _ in pts], [v for _, v in pts], label=label, **style[label])
        _width_axis(ax)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_ylim(-0.2, 1.2)
        ax.set_title(f"restoration @{p}")
    axes[0].set_ylabel("restoration (last layer's input, key corrupted)")
    axes[-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Where each architecture reads the key, by width (induction: @value ≈ 1; direct: @query/@key)")
    return save_figure(fig, path)


def ablations_width_figure(rows: list[dict], path: Path) -> Path:
    """Test accuracy against the short-convolution width at widths 64 and 256, one panel per
    architecture (Mamba, Based), the paper's width-256 Mamba figures as black bars."""
    from .reference_figures import conv_width_panels

    conv = cells(rows, lambda r: (r["label"].split(" ")[0], r["hidden_size"], _width(r["label"])))
    panels = {arch: [(f"width {d}", colour, [(k, s) for (a, w, k), s in conv.items() if a == arch and w == d])
                     for d, colour in ((64, "tab:blue"), (256, "tab:red"))
                     if any(a == arch and w == d for a, w, _ in conv)]
              for arch in ("mamba", "based") if any(a == arch for a, _, _ in conv)}
    return conv_width_panels(panels, path)


def layers_figure(rows: list[dict], path: Path) -> Path:
    """Restoration at each layer's input (key corrupted) at the key, value and query, for 1, 2 and
    3 layers: one row of panels per architecture, one panel per depth."""
    import matplotlib.pyplot as plt

    from .plots import save_figure

    sel = _complete(by_layers(rows), _depth_plan())          # no cell part-way through
    labels = sorted({label for label, _ in sel}, key=_order)
    depths = sorted({n for _, n in sel})
    fig, axes = plt.subplots(len(labels), len(depths), figsize=(3.6 * len(depths), 2.4 * len(labels)),
                             squeeze=False, sharey=True)
    colours = {"key": "tab:orange", "value": "tab:green", "query": "tab:blue"}
    for i, label in enumerate(labels):
        for j, n in enumerate(depths):
            ax = axes[i][j]
            s = sel.get((label, n))
            if s is None:
                ax.set_axis_off()
                continue
            measured = False
            for p, colour in colours.items():
                ys = []
                for layer in range(n):
                    xs = [(r.get("layer_scores") or {}).get(f"layers.{layer}.input@{p}") for r in s.best]
                    xs = [x for x in xs if x is not None]
                    ys.append(sum(xs) / len(xs) if xs else math.nan)
                measured = measured or any(not math.isnan(y) for y in ys)
                ax.plot(range(n), ys, marker="o", color=colour, label=f"@{p}")
            if not measured:      # a model that fails the task: the grid measures no restoration
                ax.text(0.5, 0.5, "no restoration measured\n(the model fails the task)", transform=ax.transAxes,
                        ha="center", va="center", fontsize=8, color="grey")
            ax.set_xticks(range(n), [f"L{layer}" for layer in range(n)])
            ax.tick_params(labelleft=True)       # every panel its own scale: a row may hold one panel only
            ax.axhline(0, color="grey", lw=0.5)
            ax.set_ylim(-0.2, 1.2)
            ax.set_title(f"{label}, {n} layer{'s' if n > 1 else ''} ({accuracy_text(s)})", fontsize=8)
    fig.supylabel("restoration at the layer's input (key corrupted)")
    # the title, then one legend for every panel under it (inside a panel it covered that panel's
    # lines), then the panels; in inches from the top, whatever the figure's height
    inches = lambda d: 1 - d / fig.get_figheight()
    fig.suptitle("Restoration by layer, width 64 (chosen rate; mean over seeds)", y=inches(0.08), va="top")
    handles = [plt.Line2D([], [], marker="o", color=colour, label=f"@{p}") for p, colour in colours.items()]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               bbox_to_anchor=(0.5, inches(0.4)), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, inches(0.6)))
    return save_figure(fig, path, layout=False)
