"""MQAR's report: the learning rate chosen on validation, accuracy per setting over seeds, the
table with near and far labels, Zoology's Figure 2 beside ours, and the figures; from rows made
by hand (the functions are pure functions of `mecheval report`'s rows)."""
from hf_mecheval.experiments import read_experiment
from hf_mecheval.reports.labels import ARCHITECTURE_ORDER
from hf_mecheval.reports.plots import architecture_colours
from hf_mecheval.reports.mqar import (_plane_point, chosen_runs, key_position_table, mqar_figures, mqar_table,
                                     setting_accuracy, zoology_table)

PNG = b"\x89PNG\r\n\x1a\n"


def row(label, width, lr, seed, validation, settings, task="mqar_cpu", **extra):
    return {"task": task, "label": label, "architecture": label, "hidden_size": width, "learning_rate": lr,
            "seed": seed, "validation_accuracy": validation, "test_accuracy": sum(settings.values()) / len(settings),
            "test_by_setting": [{"seq_len": L, "num_pairs": p, "documents": 10, "accuracy": a}
                                for (L, p), a in settings.items()], **extra}


GRID = {(64, 4): 1.0, (128, 4): 0.9, (128, 8): 0.8, (128, 16): 0.5, (256, 8): 0.4}
NEAR_FAR = {"near": {"mechanism": "induction", "@key": 0.0, "@value": 0.9, "@query": 0.1},
            "far": {"mechanism": "direct_query", "@key": 0.1, "@value": 0.1, "@query": 0.8}}
ROWS = [
    # the transformer at 1e-3 (two seeds, validation 0.7 and 0.9: mean 0.8) beats 3e-4 (0.75)
    row("transformer", 64, 1e-3, 0, 0.7, {k: v for k, v in GRID.items()}, mechanism="induction", **{
        "@key": 0.0, "@value": 0.95, "@query": 0.05}, by_distance=NEAR_FAR),
    row("transformer", 64, 1e-3, 1, 0.9, {k: v / 2 for k, v in GRID.items()}),
    row("transformer", 64, 3e-4, 0, 0.75, {k: 0.0 for k in GRID}),
    row("mamba", 64, 1e-2, 0, 0.2, {k: 0.1 for k in GRID}),
    row("mamba", 128, 1e-2, 0, 0.3, {k: 0.2 for k in GRID}),
    row("transformer", 64, 1e-3, 0, 0.9, {(64, 4): 0.96}, task="mqar_64_4"),
    row("hyena", 128, 3e-3, 0, 0.5, {(64, 4): 0.61}, task="mqar_64_4"),
    row("hyena", 128, 1e-3, 0, 0.6, {(64, 4): 0.66}, task="mqar_64_4"),
]


def test_the_rate_is_chosen_on_validation_and_seeds_are_averaged():
    chosen = chosen_runs(ROWS)
    assert [r["learning_rate"] for r in chosen[("mqar_cpu", "transformer", 64)]] == [1e-3, 1e-3]
    assert chosen[("mqar_64_4", "hyena", 128)][0]["learning_rate"] == 1e-3      # validation 0.6 > 0.5
    accuracy = setting_accuracy(chosen[("mqar_cpu", "transformer", 64)])
    assert accuracy == {k: 0.75 * v for k, v in GRID.items()}                 # (v + v / 2) / 2


def test_table_lists_settings_and_near_far_labels():
    table = mqar_table(ROWS)
    lines = table.splitlines()
    assert lines[0] == ("| task | model | width | lr | test | 64x4 | 128x4 | 128x8 | 128x16 | 256x8 | mechanism | near "
                        "| far |")
    transformer = next(line for line in lines if line.startswith("| mqar_cpu | transformer | 64 |"))
    assert "| 0.001 | 54.0 | 75.0 | 67.5 | 60.0 | 37.5 | 30.0 |" in transformer
    assert "induction (0.00 / 0.95 / 0.05)" in transformer and "direct_query (0.10 / 0.10 / 0.80)" in transformer
    assert transformer.endswith("| induction (0.00 / 0.90 / 0.10) | direct_query (0.10 / 0.10 / 0.80) |")
    assert "| mqar_cpu | mamba | 128 | 0.01 | 20.0 |" in table


def test_zoology_table_stands_beside_figure_2():
    published = read_experiment("zoology", ["figure2"])["figure2"]
    table = zoology_table(ROWS, published).splitlines()
    assert table[2:] == ["| mqar_64_4 | 64 | transformer | 98 | 96.0 | 0.001 |",
                         "| mqar_64_4 | 128 | hyena | 75 | 66.0 | 0.001 |"]
    assert zoology_table(ROWS[:5], published) == ""          # no run of Zoology's settings


def test_figures_are_drawn(tmp_path):
    made = mqar_figures(ROWS, tmp_path)
    assert [p.name for p in made] == ["mqar_pairs.png", "mqar_length.png", "mqar_near_far.png"]
    # ROWS hold runs of one of Zoology's settings (mqar_64_4): with its values, its figure too
    published = read_experiment("zoology", ["figure2"])["figure2"]
    assert [p.name for p in mqar_figures(ROWS, tmp_path, published=published)][-1] == "mqar_zoology.png"
    for p in made:
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000


def test_zoology_settings_get_figure_2_and_a_panel_per_setting(tmp_path, monkeypatch):
    """Zoology's settings are a task of one setting each: no line against pairs or length to draw;
    the mechanism plane has a panel per setting and width; mqar_zoology.png puts ours beside the
    figure's values, a panel per setting with our runs, against width."""
    import hf_mecheval.reports.mqar as mqar
    published = read_experiment("zoology", ["figure2"])["figure2"]
    rows = [row("transformer", 64, 1e-3, 0, 0.9, {(64, 4): 0.96}, task="mqar_64_4", mechanism="induction",
                by_distance=NEAR_FAR),
            row("transformer", 128, 1e-3, 0, 0.9, {(64, 4): 1.0}, task="mqar_64_4"),
            row("hyena", 64, 1e-3, 0, 0.6, {(128, 8): 0.3}, task="mqar_128_8", by_distance=NEAR_FAR)]
    figures = {}
    real_save = mqar.save_figure

    def keep(fig, path, **kw):
        figures[path.name] = fig
        return real_save(fig, path, **kw)
    monkeypatch.setattr(mqar, "save_figure", keep)
    made = mqar_figures(rows, tmp_path, published=published)
    assert [p.name for p in made] == ["mqar_near_far.png", "mqar_zoology.png"]
    titles = sorted(ax.get_title() for ax in figures["mqar_near_far.png"].axes if ax.get_title())
    assert titles == ["mqar_128_8, width 64: near (o) and far (s) queries",
                      "mqar_64_4, width 64: near (o) and far (s) queries"]
    panels = {ax.get_title(): ax for ax in figures["mqar_zoology.png"].axes}
    assert sorted(panels) == ["mqar_128_8: 128 tokens, 8 pairs", "mqar_64_4: 64 tokens, 4 pairs"]
    lines = [(line.get_linestyle(), list(line.get_xdata()), list(line.get_ydata()))
             for line in panels["mqar_64_4: 64 tokens, 4 pairs"].get_lines()]
    assert ("-", [64, 128], [0.96, 1.0]) in lines                  # ours, at both widths
    assert ("--", [64, 128], [0.98, 0.98]) in lines                # Zoology's transformer
    assert len(lines) == 2                                          # Zoology's models we did not run: not drawn
    hyena = [(line.get_linestyle(), list(line.get_ydata())) for line in panels["mqar_128_8: 128 tokens, 8 pairs"].get_lines()]
    assert hyena == [("-", [0.3]), ("--", [0.19, 0.65]), ("-", []), ("--", [])]   # the last two: the legend's styles
    # without Zoology's values, or without runs of its settings, no such figure
    assert "mqar_zoology.png" not in [p.name for p in mqar_figures(rows, tmp_path / "a")]
    assert "mqar_zoology.png" not in [p.name for p in mqar_figures(ROWS[:5], tmp_path / "b", published=published)]


def test_an_architecture_keeps_its_colour_whichever_others_have_landed():
    few = architecture_colours(["transformer", "mamba (conv 4)"])
    more = architecture_colours(["transformer", "h3", "based", "mamba (conv 4)", "gated_deltanet"])
    assert few == {"transformer": "C0", "mamba (conv 4)": "C2"}
    assert {k: more[k] for k in few} == few and more["gated_deltanet"] == "C8"
    # two labels of one architecture: its default configuration keeps it (Mamba's is conv 4, though
    # conv 0 sorts first), the other takes the first colour no architecture drawn holds; so does a
    # label outside the nine, and the others keep theirs
    assert architecture_colours(["mamba (conv 0)", "mamba (conv 4)"]) == {"mamba (conv 4)": "C2", "mamba (conv 0)": "C0"}
    assert architecture_colours(["mamba (conv 2)", "mamba (conv 3)"]) == {"mamba (conv 2)": "C2", "mamba (conv 3)": "C0"}
    assert architecture_colours(["hf:gpt2", "transformer"]) == {"hf:gpt2": "C1", "transformer": "C0"}
    width_sweep = architecture_colours(["based", "based (positions)", "baseconv", "deltanet", "h3", "hyena",
                                        "mamba (conv 4)", "mamba (conv 4, positions)", "transformer"])
    assert width_sweep == {"transformer": "C0", "based": "C1", "mamba (conv 4)": "C2", "deltanet": "C3", "hyena": "C4",
                           "h3": "C5", "baseconv": "C6", "based (positions)": "C7", "mamba (conv 4, positions)": "C8"}
    # a figure's label with its depth after a comma is still its architecture's
    assert architecture_colours(["transformer, 3 layers", "based, 3 layers"]) == {"transformer, 3 layers": "C0",
                                                                                 "based, 3 layers": "C1"}
    nine = architecture_colours(ARCHITECTURE_ORDER + ("hf:gpt2", "hf:pythia"))
    assert [nine[a] for a in ARCHITECTURE_ORDER] == [f"C{i}" for i in range(9)]
    assert nine["hf:gpt2"] == nine["hf:pythia"] == "C9"      # only one colour left: they share it


def test_the_near_far_plane_reads_direct_retrieval_from_either_position(tmp_path):
    # Mamba on MQAR restores at the key, Hyena at the query: both stand at @key + @query = 1
    assert _plane_point({"@key": 0.94, "@value": 0.0, "@query": 0.02}) == (0.0, 0.96)
    assert _plane_point({"@key": 0.0, "@value": 0.01, "@query": 1.03}) == (0.01, 1.03)
    assert _plane_point({"@key": 0.9, "@value": 0.0, "@query": None}) is None     # not measured
    # a model with a group not measured is left out of the figure, not drawn at 0
    unmeasured = {"near": {"@key": 0.9, "@value": 0.0, "@query": None}, "far": NEAR_FAR["far"]}
    rows = [dict(ROWS[0], by_distance=unmeasured)] + ROWS[1:]
    assert "mqar_near_far.png" not in [p.name for p in mqar_figures(rows, tmp_path)]


def test_reproduction_tables_come_from_each_mqar_sweep():
    """REPRODUCTION.md's Part 3: the CPU sweep's table from cpu_mqar's rows only, Zoology's two
    tables from cpu_mqar_zoology's only; a sweep not run yet gives no table (its block stays)."""
    from hf_mecheval.reports.reproduction import mqar_tables
    cpu, zoology = ROWS[:5], ROWS[5:]
    tables = mqar_tables({"cpu_mqar": cpu, "cpu_mqar_zoology": zoology})
    assert sorted(tables) == ["mqar", "mqar_zoology", "mqar_zoology_mechanism"]
    assert "| mqar_cpu | mamba | 128 | 0.01 | 20.0 |" in tables["mqar"] and "mqar_64_4" not in tables["mqar"]
    assert "| mqar_64_4 | 128 | hyena | 75 | 66.0 | 0.001 |" in tables["mqar_zoology"]
    assert "| mqar_64_4 | hyena | 128 | 0.001 | 66.0 |" in tables["mqar_zoology_mechanism"]
    assert "mqar_cpu" not in tables["mqar_zoology_mechanism"]
    assert mqar_tables({"cpu_mqar_zoology": zoology}).keys() == {"mqar_zoology", "mqar_zoology_mechanism"}
    assert mqar_tables({"cpu_ar": cpu}) == {}


def test_key_position_table_averages_the_chosen_rates_seeds_and_skips_runs_without_it(tmp_path):
    def buckets(*accuracies):
        edges = [(0, 16), (16, 32), (32, 64)]
        return [{"key_from": lo, "key_to": hi, "queries": 10, "accuracy": a} for (lo, hi), a in zip(edges, accuracies)]
    rows = [dict(ROWS[0], test_by_key_position=buckets(1.0, 0.5, 0.0)),
            dict(ROWS[1], test_by_key_position=buckets(0.8, 0.3)),      # a seed whose keys stop before 32
            dict(ROWS[2], test_by_key_position=buckets(0.0, 0.0, 0.0)),  # the rate not chosen
            ROWS[3]]                                                     # mamba: recorded nothing
    lines = key_position_table(rows).splitlines()
    assert lines[0] == "| task | model | width | lr | keys 0-15 | keys 16-31 | keys 32-63 |"
    assert lines[2:] == ["| mqar_cpu | transformer | 64 | 0.001 | 90.0 | 40.0 | 0.0 |"]
    assert key_position_table(ROWS) == ""
    # and the figure of it, beside the other three; none where no run recorded it
    assert [p.name for p in mqar_figures(rows, tmp_path)][-1] == "mqar_key_position.png"
    assert "mqar_key_position.png" not in [p.name for p in mqar_figures(ROWS, tmp_path / "none")]


def test_keys_all_in_one_bucket_give_no_key_position_table_or_figure(tmp_path):
    # Zoology's settings (4-8 pairs) put every key within the first 16 tokens: one bucket, whose
    # one column would only repeat the test accuracy
    one = [{"key_from": 0, "key_to": 16, "queries": 10, "accuracy": 0.4}]
    rows = [dict(r, test_by_key_position=one) for r in ROWS[:3]]
    assert key_position_table(rows) == ""
    assert "mqar_key_position.png" not in [p.name for p in mqar_figures(rows, tmp_path)]
    # a second bucket in any chosen cell brings both back, the cells without it left blank
    rows[0] = dict(rows[0], test_by_key_position=one + [{"key_from": 16, "key_to": 32, "queries": 5, "accuracy": 0.2}])
    assert key_position_table(rows).splitlines()[0] == "| task | model | width | lr | keys 0-15 | keys 16-31 |"
    assert "mqar_key_position.png" in [p.name for p in mqar_figures(rows, tmp_path / "two")]


def test_a_cell_part_way_through_its_planned_rates_is_not_shown(tmp_path):
    # the sweep plans Mamba at width 64 at 1e-2 and 3e-3: until 3e-3 has run, 1e-2 is only the best so far
    plan = {("mqar_cpu", "transformer", 64): {(1e-3, 0), (1e-3, 1), (3e-4, 0)},
            ("mqar_cpu", "mamba", 64): {(1e-2, 0), (3e-3, 0)}}
    chosen = chosen_runs(ROWS, plan)
    assert ("mqar_cpu", "transformer", 64) in chosen and ("mqar_cpu", "mamba", 64) not in chosen
    assert ("mqar_cpu", "mamba", 128) in chosen             # nothing planned for it: shown as it stands
    assert "| mqar_cpu | mamba | 64 |" not in mqar_table(ROWS, plan)
    assert "| mqar_cpu | mamba | 64 |" in mqar_table(ROWS)  # a sweep's own report shows every cell
    # so do the figures: with the Transformer's 3e-4 not run, its near and far queries are not drawn
    partial = [r for r in ROWS if not (r["label"] == "transformer" and r["learning_rate"] == 3e-4)]
    assert "mqar_near_far.png" not in [p.name for p in mqar_figures(partial, tmp_path, plan)]
    assert "mqar_near_far.png" in [p.name for p in mqar_figures(partial, tmp_path)]


def test_a_failed_run_and_a_run_whose_grid_has_not_run_say_so():
    rows = [row("h3", 64, 1e-3, 0, 0.0, {k: 0.0 for k in GRID}, failed="it diverged: its weights hold NaN"),
            row("mamba", 64, 1e-2, 0, 0.2, {k: 0.1 for k in GRID})]
    lines = mqar_table(rows).splitlines()
    assert lines[2].endswith("| the run failed: it diverged: its weights hold NaN | — | — |")
    assert lines[3].endswith("| grid not run yet | — | — |")


def test_the_near_far_plane_leaves_out_a_group_that_fails_the_task(tmp_path):
    # a model that fails still restores at the query on the few queries it answers: no mechanism point
    failing = {"near": {"mechanism": "failed", "@key": 0.01, "@value": 0.01, "@query": 1.04},
               "far": {"mechanism": "failed", "@key": 0.0, "@value": 0.02, "@query": 0.9}}
    rows = [dict(ROWS[0], by_distance=failing)] + ROWS[1:]
    assert "mqar_near_far.png" not in [p.name for p in mqar_figures(rows, tmp_path)]
