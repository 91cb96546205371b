"""``mecheval quickstart``: a small version of the paper's main experiment on a CPU.

Trains eight models on a reduced AR setting, runs the intervention grid on each, and writes
``runs/quickstart/`` (``report.md``, figures, ``summary.json``/``.csv``, one run directory per
model). The report checks the paper's headline on this setting and says plainly which parts it
reproduces and which it does not, with the figures. Runs that already finished are reused, so
an interrupted quickstart continues where it stopped — only if they were trained with the
arguments asked for now: a ``--tiny`` folder is refused for the full quickstart, naming what differs.

The reduced setting (``SETTING``): AR with 32 keys and 32 values (``num_kv`` 64), 4 pairs per
document (13 tokens), 2 layers of width 64, 24 000 training documents, reference recipe
otherwise but for its initialisation and clipping (every linear weight N(0, 0.02), clipping at 1.0:
the rule it was calibrated under); learning rate and epochs per architecture from ``LEARNING_RATES`` / ``EPOCHS``
(chosen on validation accuracy in calibration runs, see there); H3 with state size 64 instead of
1024 (its kernel costs O(d_state) per channel and position). Interventions on 256 test documents.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import MechEvalError
from ..io_utils import write_text_atomic
from ..runs.files import format_score
from .report import collect_runs, markdown_table, write_report

# The quickstart's rates and epochs were calibrated under hf-mecheval's earlier rule (every linear
# weight N(0, 0.02), gradients clipped at 1.0, Hyena's and BaseConv's first long convolutions), so it keeps that rule (its figures in the README
# hold for it) until it is calibrated again under the reference's initialisation and no clipping.
SETTING = {"task": "ar_32", "task_config": {"num_kv": 64, "num_pairs": 4}, "train_size": 24000, "eval_size": 256,
           "hidden_size": 64, "num_hidden_layers": 2, "init_scheme": "normal", "mixer_forms": "mecheval-v1",
           "max_grad_norm": 1.0}
TINY = {"task": "ar_32", "task_config": {"num_kv": 16, "num_pairs": 2}, "train_size": 256, "eval_size": 32,
        "max_steps": 20, "hidden_size": 16, "num_hidden_layers": 2}

# (run name, architecture, extra model config)
MODELS = [
    ("transformer", "transformer", {"max_position_embeddings": 32}),
    ("based", "based", {}),
    ("mamba_conv4", "mamba", {"conv_kernel": 4}),
    ("mamba_conv0", "mamba", {"conv_kernel": 0}),
    ("hyena", "hyena", {}),
    ("h3", "h3", {"d_state": 64}),
    ("baseconv", "baseconv", {}),
    ("deltanet", "deltanet", {}),
]
# Learning rate and epochs per model, chosen on validation accuracy in calibration runs on this
# setting (24 000 documents an epoch). Mamba with its convolution: 90 % after 6 epochs at 3e-3
# (80 % after 6 at 2e-3, 96 % after 8; 16 epochs at 1e-3 did as well as 8 at 2e-3, in twice the
# time). Based, at 2e-3: 91 % after 3 epochs, 99 % after 4. DeltaNet, at 2e-3: 100 % after 1. The
# Transformer forms its induction head only after ~9 000 steps at 3e-4 (still 25-30 % after 8
# epochs at 1e-3 or 2e-3, 10 at 5e-4 or 12 at 3e-4), hence its 16. The models that fail get the
# budget a working model needs at the same rate: Mamba without its convolution the recipe of Mamba
# with one; Hyena, H3 and BaseConv the 3 epochs at 2e-3 in which Based solves AR.
EPOCHS = {"transformer": 16, "based": 3, "mamba_conv4": 6, "mamba_conv0": 6, "hyena": 3, "h3": 3, "baseconv": 3,
          "deltanet": 1}
LEARNING_RATES = {"transformer": 3e-4, "based": 2e-3, "mamba_conv4": 3e-3, "mamba_conv0": 3e-3, "hyena": 2e-3,
                  "h3": 2e-3, "baseconv": 2e-3, "deltanet": 2e-3}

# training order: the longest runs first, so that the workers finish at about the same time
TRAINING_ORDER = ["transformer", "mamba_conv4", "mamba_conv0", "h3", "hyena", "baseconv", "based", "deltanet"]


def _train_args(name: str, arch: str, extra: dict, setting: dict, seed: int = 0) -> dict:
    config = dict(extra)
    args = {"task": setting["task"], "task_config": setting["task_config"], "architecture": arch,
            "hidden_size": setting["hidden_size"], "num_hidden_layers": setting["num_hidden_layers"],
            "train_size": setting["train_size"], "eval_size": setting["eval_size"],
            "learning_rate": LEARNING_RATES[name], "eval_strategy": "no", "save_strategy": "no",
            "logging_steps": 1000, "seed": seed}
    if "max_position_embeddings" in config:
        args["max_position_embeddings"] = config.pop("max_position_embeddings")
    args["model_config"] = config
    for key in ("init_scheme", "mixer_forms", "max_grad_norm"):
        if key in setting:
            args[key] = setting[key]
    if "max_steps" in setting:
        args["max_steps"] = setting["max_steps"]
    else:
        args["num_train_epochs"] = EPOCHS[name]
    return args


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
               workers: int | str = "auto", seed: int = 0) -> dict:
    """Train the eight runs (``workers`` processes at once; ``auto``: one 1-thread process per core
    on a CPU), each followed by its intervention grid, then write the report. ``seed``: every
    run's initialisation and data-order seed (the documents do not change)."""
    from ..training.jobs import Run
    from ..training.sweep import check_existing_runs, train_runs

    setting = TINY if tiny else SETTING
    out = Path(out)
    runs_dir = out / "runs"
    models = {name: (arch, extra) for name, arch, extra in MODELS}
    runs = [Run(name, _train_args(name, *models[name], setting, seed)) for name in TRAINING_ORDER]
    # a finished run is reused only if it is the run asked for (a --tiny one is not a full one)
    check_existing_runs(runs, runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)      # an unwritable output fails here, before any work
    started = time.perf_counter()
    evaluate = ["-n", "32", "--resamples", "100"] if tiny else ["-n", "256", "--resamples", "1000"]
    outcome = train_runs(runs, runs_dir, workers=workers, progress=progress, evaluate=evaluate)
    if outcome["failed"]:
        raise MechEvalError(f"quickstart: {len(outcome['failed'])} run(s) failed: {'; '.join(outcome['failed'])}")
    if outcome["in_use"]:
        raise MechEvalError(f"quickstart: {', '.join(outcome['in_use'])} in use by another process (a second "
                            f"quickstart into the same folder?); run again when it has finished")
    rows = {name: r for (name, _, _), r in zip(MODELS, collect_runs([runs_dir / n for n, _, _ in MODELS]))}
    checks = headline(rows)
    minutes = (time.perf_counter() - started) / 60
    lines = [f"Setting: {json.dumps(setting)}; seed {seed}; learning rates {json.dumps(LEARNING_RATES)}; epochs "
             f"{json.dumps(EPOCHS) if 'max_steps' not in setting else setting['max_steps']}; "
             f"interventions on {32 if tiny else 256} test documents, key corrupted, residual stream at the input of "
             f"the last layer. Wall time of this invocation: {minutes:.1f} min.", "", "## The paper's headline here", ""]
    lines += [f"- {'**reproduced**' if c['holds'] else '**not reproduced**'}: {c['claim']} — {c['figures']}"
              for c in checks]
    report = write_report([runs_dir / n for n, _, _ in MODELS], out, overwrite=True, title="hf-mecheval quickstart",
                          preamble="\n".join(lines))
    summary = {"setting": setting, "seed": seed, "learning_rates": LEARNING_RATES, "epochs": EPOCHS, "minutes": minutes, "checks": checks,
               "rows": report["rows"], "figures": report["figures"]}
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n", overwrite=True)
    print(markdown_table(report["rows"]), end="")
    for c in checks:
        print(f"{'reproduced    ' if c['holds'] else 'NOT reproduced'}  {c['claim']}  ({c['figures']})")
    print(f"report: {out / 'report.md'} ({minutes:.1f} min)")
    return summary
