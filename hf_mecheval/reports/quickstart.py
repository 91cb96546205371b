"""``mecheval quickstart``: a small version of the paper's main experiment on a CPU.

Trains eight models on a reduced AR setting, runs the intervention grid on each, and writes
``runs/quickstart/`` (``report.md``, ``report.html``, figures, ``summary.json``,
``runs.csv``/``.json``, one run directory per model); while it trains, it shows each run in
flight (``training/progress.py``). The report checks the paper's headline on this setting and
says plainly which parts it reproduces and which it does not, with the figures. Runs that
already finished are reused, so an interrupted quickstart continues where it stopped — only if
they were trained with the arguments asked for now: a ``--tiny`` folder is refused for the full
quickstart, naming what differs.

The experiment itself is data: ``hf_mecheval/experiments/quickstart.yaml`` (``QuickstartPlan``)
holds the reduced setting (AR with 32 keys and 32 values, 4 pairs per document, 2 layers of width
64, 24 000 training documents, the rule it was calibrated under), each model's learning rate and
epochs with the calibration behind them, and the intervention grid (256 test documents).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from ..errors import ConfigError, MechEvalError, RunsFailed
from ..experiments import read_experiment
from ..atomic_files import write_text_atomic
from ..runs.files import GridSettings, format_score
from ..runs.manifest import claim_output_folder, recording
from .report import collect_runs, markdown_table, write_report

# the models the headline's claims are about (``headline``): the plan must train exactly these
HEADLINE_MODELS = ("transformer", "based", "mamba_conv4", "mamba_conv0", "hyena", "h3", "baseconv", "deltanet")


@dataclasses.dataclass(frozen=True)
class QuickstartPlan:
    """``experiments/quickstart.yaml``: the setting every run shares (and ``--tiny``'s), each
    model's own arguments (report order), the training order and the intervention grids."""
    setting: dict
    tiny: dict
    models: dict
    training_order: list
    grid: GridSettings
    tiny_grid: GridSettings

    @staticmethod
    def load() -> "QuickstartPlan":
        names = [f.name for f in dataclasses.fields(QuickstartPlan)]
        values = read_experiment("quickstart", names)
        if not isinstance(values["models"], dict) or sorted(values["models"]) != sorted(HEADLINE_MODELS):
            raise ConfigError("models", f"experiments/quickstart.yaml must give exactly the models "
                                        f"{', '.join(HEADLINE_MODELS)}, each a mapping of training arguments")
        if sorted(values["training_order"] or []) != sorted(HEADLINE_MODELS):
            raise ConfigError("training_order", "experiments/quickstart.yaml must order every model once")
        for key in ("grid", "tiny_grid"):
            try:
                values[key] = dataclasses.replace(GridSettings(), **values[key])
            except TypeError as exc:
                raise ConfigError(key, f"experiments/quickstart.yaml: {exc}") from None
        return QuickstartPlan(**values)

    def run_args(self, name: str, tiny: bool = False, seed: int = 0) -> dict:
        """Run ``name``'s training arguments: the setting's, then the model's (``--tiny``: its
        max_steps instead of the model's epochs), no evaluation or checkpoint during training."""
        setting = self.tiny if tiny else self.setting
        args = {**setting, **self.models[name], "eval_strategy": "no", "save_strategy": "no",
                "logging_steps": 1000, "seed": seed}
        if "max_steps" in setting:
            args.pop("num_train_epochs", None)
        return args

    def learning_rates(self) -> dict:
        return {name: model["learning_rate"] for name, model in self.models.items()}

    def epochs(self) -> dict:
        return {name: model.get("num_train_epochs") for name, model in self.models.items()}


PLAN = QuickstartPlan.load()


def headline(rows: dict[str, dict]) -> list[dict]:
    """The paper's claims on this setting, each with a verdict and the figures behind it."""
    def acc(n):
        return rows[n]["test_accuracy"]

    def mech(n):
        return rows[n].get("mechanism")

    checks = []
    for n in ("transformer", "based"):
        checks.append({"claim": f"{n} solves AR by induction (@value high, @query low)",
                       "holds": acc(n) >= 0.9 and mech(n) == "induction",
                       "figures": f"accuracy {acc(n):.2f}, @value {format_score(rows[n].get('@value'))}, @query "
                                  f"{format_score(rows[n].get('@query'))}, label {mech(n)}"})
    checks.append({"claim": "Mamba with its short convolution (width 4) solves AR; without it (width 0) it does not",
                   "holds": acc("mamba_conv4") >= 0.8 and acc("mamba_conv0") <= acc("mamba_conv4") - 0.3,
                   "figures": f"accuracy conv 4 {acc('mamba_conv4'):.2f}, conv 0 {acc('mamba_conv0'):.2f}"})
    mamba = rows["mamba_conv4"]
    scored = all(mamba.get(f"@{p}") is not None for p in ("key", "value", "query"))
    checks.append({"claim": "Mamba (conv 4) does not use induction: @value low, @key + @query high "
                            "(the short convolution moves the key forward)",
                   "holds": scored and mamba["@value"] <= 0.3 and mamba["@key"] + mamba["@query"] >= 0.5,
                   "figures": f"@key {format_score(mamba.get('@key'))}, @value {format_score(mamba.get('@value'))}, "
                              f"@query {format_score(mamba.get('@query'))}, label {mech('mamba_conv4')}"})
    for n in ("hyena", "h3", "baseconv"):
        solved = acc(n) >= 0.9
        checks.append({"claim": f"{n}: fails AR, or solves it by direct retrieval rather than induction",
                       "holds": (not solved) or mech(n) in ("direct_query", "direct_key_query"),
                       "figures": f"accuracy {acc(n):.2f}, label {mech(n)}"})
    checks.append({"claim": "DeltaNet solves AR by direct retrieval at the query, not induction",
                   "holds": acc("deltanet") >= 0.9 and mech("deltanet") in ("direct_query", "direct_key_query"),
                   "figures": f"accuracy {acc('deltanet'):.2f}, @value {format_score(rows['deltanet'].get('@value'))}, "
                              f"@query {format_score(rows['deltanet'].get('@query'))}, label {mech('deltanet')}"})
    return checks


def quickstart(out: str | Path = "runs/quickstart", tiny: bool = False, progress: bool = True,
               workers: int | str = "auto", seed: int = 0, plan: QuickstartPlan | None = None,
               overwrite: bool = False) -> dict:
    """Train the eight runs (``workers`` processes at once; ``auto``: one 1-thread process per core
    on a CPU), each followed by its intervention grid, then write the report. ``seed``: every
    run's initialisation and data-order seed (the documents do not change). ``out`` must hold only
    what a quickstart wrote there (its runs aside), unless ``overwrite``: checked before any run."""
    from ..training.jobs import Run
    from ..training.sweep import check_existing_runs, train_runs

    plan = plan or PLAN
    setting = plan.tiny if tiny else plan.setting
    out = Path(out)
    runs_dir = out / "runs"
    claim_output_folder(out, overwrite, beside="runs")   # the report must not replace a person's files
    runs = [Run(name, plan.run_args(name, tiny, seed)) for name in plan.training_order]
    for run in runs:            # every run checked as `mecheval train` checks it, before any starts
        run.checked()
    # a finished run is reused only if it is the run asked for (a --tiny one is not a full one)
    check_existing_runs(runs, runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)      # an unwritable output fails here, before any work
    started = time.perf_counter()
    grid = plan.tiny_grid if tiny else plan.grid
    outcome = train_runs(runs, runs_dir, workers=workers, progress=progress, grid=grid)
    if outcome["failed"]:
        raise RunsFailed(f"quickstart: {len(outcome['failed'])} run(s) failed: {'; '.join(outcome['failed'])}")
    if outcome["in_use"]:
        raise MechEvalError(f"quickstart: {', '.join(outcome['in_use'])} in use by another process (a second "
                            f"quickstart into the same folder?); run again when it has finished")
    rows = dict(zip(plan.models, collect_runs([runs_dir / n for n in plan.models])))
    checks = headline(rows)
    minutes = (time.perf_counter() - started) / 60
    preamble = (f"Setting: {json.dumps(setting)}; seed {seed}; learning rates {json.dumps(plan.learning_rates())}; "
                f"epochs {json.dumps(plan.epochs()) if 'max_steps' not in setting else setting['max_steps']}; "
                f"interventions on {grid.n} test documents, key corrupted, residual stream at the input of "
                f"the last layer. Wall time of this invocation: {minutes:.1f} min.")
    report = write_report([runs_dir / n for n in plan.models], out, overwrite=True, title="hf-mecheval quickstart",
                          preamble=preamble, verdicts=checks, verdicts_title="The paper's headline here")
    summary = {"setting": setting, "seed": seed, "learning_rates": plan.learning_rates(), "epochs": plan.epochs(),
               "minutes": minutes, "checks": checks,
               "rows": report["rows"], "figures": report["figures"]}
    with recording(out, expected=["summary.json"]):      # listed as the quickstart's, so that a rerun may replace it
        write_text_atomic(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n", overwrite=True)
    print(markdown_table(report["rows"]), end="")
    for c in checks:
        print(f"{'reproduced    ' if c['holds'] else 'NOT reproduced'}  {c['claim']}  ({c['figures']})")
    print(f"report: {out / 'report.md'}, on one page: {out / 'report.html'} ({minutes:.1f} min)")
    return summary
