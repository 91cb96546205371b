"""The ``mecheval`` command line. Argument parsing only: every command calls library code.

Errors caused by the user's input (``MechEvalError``) print one line and exit with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Sequence

from .errors import MechEvalError


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a positive integer, got 0")
    return value


def _seed(text: str) -> int:
    value = _non_negative_int(text)
    if value > 2**32 - 1:          # transformers.set_seed seeds numpy's legacy generator (32 bits)
        raise argparse.ArgumentTypeError(f"expected a seed below 2**32, got {value}")
    return value


def _until(text: str, now: float | None = None) -> float:
    """``HH:MM`` (local time: its next occurrence, so 01:00 said at 23:00 is tomorrow's) or an ISO
    date and time (``2026-12-05T06:55``) -> a ``time.time()`` timestamp; a moment past is refused."""
    import datetime as dt

    now = time.time() if now is None else now
    try:
        if len(text) <= 5 and ":" in text:
            hour, minute = (int(part) for part in text.split(":"))
            today = dt.datetime.fromtimestamp(now).replace(hour=hour, minute=minute, second=0, microsecond=0)
            moment = today if today.timestamp() > now else today + dt.timedelta(days=1)
        else:
            moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HH:MM or a date and time such as 2026-12-05T06:55, got {text!r}") \
            from None
    if moment.timestamp() <= now:
        raise argparse.ArgumentTypeError(f"{text} is already past")
    return moment.timestamp()


MAX_GRAMMAR_SEEDS = 10_000     # each is a grammar to sample and data to generate: more is a typo


def _seed_range(text: str) -> list[int]:
    """``7`` or ``0-29`` (inclusive)."""
    try:
        lo, _, hi = text.partition("-")
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SEED or FIRST-LAST, got {text!r}") from None
    if hi - lo + 1 > MAX_GRAMMAR_SEEDS:
        raise argparse.ArgumentTypeError(f"at most {MAX_GRAMMAR_SEEDS:,} seeds at once, got {hi - lo + 1:,} ({text})")
    seeds = list(range(lo, hi + 1))
    if not seeds or seeds[0] < 0:
        raise argparse.ArgumentTypeError(f"expected SEED or FIRST-LAST with 0 <= FIRST <= LAST, got {text!r}")
    return seeds


def _preset_names() -> list[str]:
    from .tasks.presets import PRESETS

    return list(PRESETS)


# ------------------------------------------------------------------------------ data
def _data_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .atomic_files import refuse_special_file, write_parquet_atomic

    from .locks import locked_file
    from .tasks.presets import build_task

    overrides = _grammar_override(args.preset, args.grammar_seed)
    task = build_task(args.preset, **overrides)
    task.check_size(args.n)
    out = Path(args.out)
    if out.is_dir() or args.out.endswith(("/", os.sep)):       # Path() drops the slash that says "a folder"
        raise MechEvalError(f"{args.out} is a folder; give a file name")
    refuse_special_file(out)           # before the work, not after it
    with locked_file(out):              # a second writer of the same file is refused, not mixed in
        if out.exists() and not args.overwrite:    # before the work, not after it
            raise MechEvalError(f"{out} already exists; pass --overwrite to replace it")
        data = task.generate(args.n, args.split, args.seed, workers=args.workers)
        write_parquet_atomic(data.to_arrow(), out, overwrite=args.overwrite)
    print(f"wrote {len(data)} {args.split} documents of {args.preset} to {args.out}")
    return 0


def _grammar_override(preset: str, grammar_seed: int | None) -> dict:
    from .tasks.presets import get_preset

    if grammar_seed is None:
        return {}
    if get_preset(preset).task != "atr":
        raise MechEvalError(f"--grammar-seed applies to ATR presets only, not {preset}")
    return {"grammar_seed": grammar_seed}


def _data_stats(args: argparse.Namespace) -> int:
    import numpy as np

    from .tasks.presets import build_task
    from .tasks.stats import format_statistics, task_statistics

    report = {}
    for preset in args.presets:
        grammar_seeds = args.grammar_seeds or [None]
        per_grammar = [
            task_statistics(build_task(preset, **_grammar_override(preset, g)).generate(args.n, args.split, args.seed))
            for g in grammar_seeds
        ]
        stats = {k: float(np.mean([s[k] for s in per_grammar])) for k in per_grammar[0]}
        report[preset] = stats
        if not args.json:
            title = preset if args.grammar_seeds is None else f"{preset} (mean over grammar seeds {args.grammar_seeds[0]}-{args.grammar_seeds[-1]})"
            print(f"== {title}: {args.n} {args.split} documents, seed {args.seed}")
            print(format_statistics(stats))
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


def _data_publish(args: argparse.Namespace) -> int:
    from .tasks.publish import materialize, push_to_hub

    api = None
    if args.push_to_hub:     # the name, the network and the credentials are checked before the work
        from .hub import create_repo

        api = create_repo(args.push_to_hub, repo_type="dataset")
    folder = materialize(
        args.presets, args.out, train_size=args.train_size, eval_size=args.eval_size, seed=args.seed,
        grammar_seed=args.grammar_seed, overwrite=args.overwrite, workers=args.workers, repo_id=args.push_to_hub,
    )
    print(f"wrote {', '.join(args.presets)} to {folder} (load with datasets.load_dataset({str(folder)!r}, NAME))")
    if args.push_to_hub:
        print(f"pushed to {push_to_hub(folder, args.push_to_hub, api=api)}")
    return 0


# ------------------------------------------------------------------------------ training
def _train(args: argparse.Namespace) -> int:
    from .training.run import main as train_main

    return train_main(args.arguments, prog="mecheval train")


def _sweep(args: argparse.Namespace) -> int:
    from .runs.files import GridSettings
    from .training.command_line import values_as_flags
    from .training.sweep import Sweep, format_table, launch, results_table, collect, write_results

    sweep = Sweep.load(args.file)
    if args.n is not None and not args.grid:
        raise MechEvalError("-n goes with --grid (the documents of the intervention grid)")
    if args.dry_run:
        runs = sweep.select(args.only)
        for run in runs:
            print(run.name, " ".join(values_as_flags(run.args)))
        print(f"{len(runs)} runs")
        return 0
    grid = GridSettings(n=args.n or GridSettings.n) if args.grid else None
    outcome = launch(sweep, args.out, launcher=args.launcher, workers=args.workers, stack=args.stack,
                     only=args.only, threads=args.threads, grid=grid, overwrite=args.overwrite)
    root = write_results(sweep, args.out, overwrite=args.overwrite)
    print(format_table(results_table(collect(sweep, args.out), sweep.grid_fields)), end="")
    print(f"{len(outcome['finished'])} runs finished, {len(outcome['skipped'])} already done, "
          + (f"{len(outcome['in_use'])} left to another process training them, " if outcome["in_use"] else "")
          + f"{len(outcome['failed'])} failed; results in {root}")
    _print_failed(outcome)
    return 1 if outcome["failed"] else 0


def _print_failed(outcome: dict) -> None:
    for name in outcome["in_use"]:
        print(f"in use: {name} is being trained by another process; left to it", file=sys.stderr)
    for line in outcome["failed"]:
        print(f"failed: {line}", file=sys.stderr)


# ------------------------------------------------------------------------------ interventions
def _evaluate(args: argparse.Namespace) -> int:
    from .reports.evaluate_run import evaluate_run, summary_lines

    result = evaluate_run(args.run_dir, out=args.out, n=args.n, split=args.split, seed=args.seed,
                          sites=args.sites, batch_size=args.batch_size, n_resamples=args.resamples,
                          overwrite=args.overwrite)
    print("\n".join(summary_lines(result)))
    return 0


# ------------------------------------------------------------------------------ reports
def _report(args: argparse.Namespace) -> int:
    from .reports.report import markdown_table, write_report

    if args.results:
        return _report_results(args)
    if args.check or args.update:
        raise MechEvalError("--check and --update go with --results DIR")
    if not args.runs:
        raise MechEvalError("give run directories, or --results DIR")
    result = write_report(args.runs, args.out, overwrite=args.overwrite)
    print(markdown_table(result["rows"]), end="")
    print(f"report: {args.out}/report.md, on one page: {args.out}/report.html")
    return 0


def _report_results(args: argparse.Namespace) -> int:
    from .reports.reproduction import (check_document, read_document, results_tables, update_document,
                                       write_results_report)

    if args.runs:
        raise MechEvalError("give either run directories or --results DIR, not both")
    for document in filter(None, (args.update, args.check)):
        read_document(document)          # a document it cannot read fails now, not after every figure
    if args.check and not args.update:   # a check alone reads: it writes no figure, report or claims.md
        tables = results_tables(args.results)
    else:
        made = write_results_report(args.results)
        tables = made["tables"]
        print(f"{len(made['figures'])} figures, each sweep's report.md and {args.results}/claims.md written from "
              f"{args.results}/*/runs.json")
    if args.update:
        print(f"updated tables in {args.update}: {', '.join(update_document(args.update, tables)) or 'none'}")
    if args.check:
        stale = check_document(args.check, tables)
        if stale:
            print(f"{args.check}: tables differ from {args.results}: {', '.join(stale)}", file=sys.stderr)
            return 1
        print(f"{args.check}: every table matches {args.results}")
    return 0


def _quickstart(args: argparse.Namespace) -> int:
    from .reports.quickstart import quickstart

    from .errors import RunsFailed

    try:
        quickstart(args.out, tiny=args.tiny, workers=args.workers, seed=args.seed, overwrite=args.overwrite)
    except RunsFailed as exc:          # a failed run: 1, as the other commands that train
        print(f"mecheval: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _push(args: argparse.Namespace) -> int:
    from .runs.model_card import push_run

    print(f"pushed {args.run_dir} to {push_run(args.run_dir, args.repo, private=args.private, dataset_repo=args.dataset)}")
    return 0


def _halve(args: argparse.Namespace) -> int:
    from .reports.weights import halve_weights

    for run_dir in args.run_dirs:
        record = halve_weights(run_dir)
        print(f"{run_dir}: float16 weights, test accuracy {100 * record['float16_test_accuracy']:.2f} % "
              f"(float32: {100 * record['float32_test_accuracy']:.2f} %)")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from .reports.reproduce import reproduce

    result = reproduce(args.preset, args.out, launcher=args.launcher, workers=args.workers, n=args.n,
                       dry_run=args.dry_run, stack=args.stack, only=args.only, threads=args.threads,
                       overwrite=args.overwrite)
    if args.dry_run:
        for name in result["runs"]:
            print(name)
        print(f"{len(result['runs'])} runs")
        return 0
    outcome = result["outcome"]
    print(f"report: {result['report']}/report.md; failed runs: {len(outcome['failed'])}"
          + (f"; left to another process: {len(outcome['in_use'])}" if outcome["in_use"] else ""))
    _print_failed(outcome)
    return 1 if outcome["failed"] else 0


def _queue(args: argparse.Namespace) -> int:
    from .runs.files import GridSettings
    from .training.queue import estimate_left, run_queue

    grid = GridSettings(n=args.n)
    if args.time_steps and not args.dry_run:
        raise MechEvalError("--time-steps goes with --dry-run (it prices the runs left; it trains nothing)")
    if args.until is not None and args.dry_run:
        raise MechEvalError("--until goes without --dry-run (it says which runs a lane starts)")
    if args.dry_run:
        if args.time_steps:
            import torch

            torch.set_num_threads(args.threads)          # as the lanes train: --threads each
        rows = estimate_left(args.file, args.out, grid, time_steps=args.time_steps, log=sys.stderr)
        width = max((len(r["run"]) for r in rows), default=0)
        for r in rows:
            trained = f", {100 * r['trained']:.0f} % trained" if r["trained"] else ""
            if r["timed"] is not None:
                t = r["timed"]
                cost = (f"~{r['cpu_hours']:.1f} CPU h (timed: {1000 * t['step']:.0f} ms a step x {t['steps']} steps "
                        f"x {t['scale']:.2f}{trained})")
            elif r["cpu_hours"] is not None:
                cost = f"~{r['cpu_hours']:.1f} CPU h (median of {r['like']} finished like it{trained})"
            else:
                cost = f"no finished run like it{trained}"
            print(f"{r['run']:<{width}}  {cost}")
        sweeps: dict[str, list[dict]] = {}
        for r in rows:
            sweeps.setdefault(r["run"].split("/", 1)[0], []).append(r)
        for name, left in sweeps.items():            # each sweep's share, in the queue's order
            priced = [r["cpu_hours"] for r in left if r["cpu_hours"] is not None]
            runs = f"sweep {name}: {len(left)} run{'s' * (len(left) != 1)} left"
            if not priced:                           # "about 0.0 CPU hours" would read as a price
                print(f"{runs}, none priced" + ("" if args.time_steps else " (--time-steps times them)"))
            else:
                print(f"{runs}, about {sum(priced):.1f} CPU hours"
                      + (f" for {len(priced)} ({len(left) - len(priced)} without a figure)" if len(priced) < len(left) else ""))
        by_runs = [r["cpu_hours"] for r in rows if r["like"]]
        by_timing = [r for r in rows if r["timed"] is not None]
        line = (f"{len(rows)} run{'s' * (len(rows) != 1)} left: about {sum(by_runs):.1f} CPU hours for the "
                f"{len(by_runs)} with a finished run like them (lr and seeds aside)")
        if args.time_steps:
            scale = by_timing[0]["timed"]["scale"] if by_timing else None
            line += (f", {sum(r['cpu_hours'] for r in by_timing):.1f} for the {len(by_timing)} timed here"
                     + (f" (their steps x {scale:.2f}: what the finished runs took over their timed steps)"
                        if scale is not None else ""))
        unpriced = len(rows) - len(by_runs) - len(by_timing)
        print(line + (f"; {unpriced} without one" if unpriced else ""))
        return 0
    if args.until is not None:
        import torch

        torch.set_num_threads(args.threads)          # runs are timed as they train: --threads each
    outcome = run_queue(args.file, args.out, threads=args.threads, grid=grid, until=args.until)
    print(f"queue: {len(outcome['finished'])} runs finished, {len(outcome['failed'])} failed"
          + (f", {len(outcome['later'])} left for later (not ending before --until)" if outcome["later"] else "")
          + "".join(f"\nfailed: {name}" for name in outcome["failed"]))
    return 1 if outcome["failed"] else 0


def _workers(text: str) -> str | int:
    if text == "auto":
        return text
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive integer, got {text!r}") from None


def _stack_size(text: str) -> str | int:
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a number >= 1, got {text!r}")
    return int(text)


def _launcher_arguments(parser: argparse.ArgumentParser, default_out: str) -> None:
    """Flags shared by the commands that run a sweep."""
    parser.add_argument("--launcher", choices=("local", "ray"), default="local",
                        help="local: processes on this machine; ray: a Ray cluster (RAY_ADDRESS) or a local one")
    parser.add_argument("--workers", type=_workers, default="auto",
                        help="training processes at once (local launcher); auto (default): one per GPU, or on a "
                             "CPU one per core with one thread each, fewer where free memory is short (3 GiB each; the "
                             "cores then shared out among them)")
    parser.add_argument("--threads", type=_positive_int, default=None,
                        help="CPU threads per training process (default: the cores shared out among the workers), "
                             "e.g. --workers 1 --threads 1 beside other work that holds a core")
    parser.add_argument("--only", nargs="+", metavar="PATTERN",
                        help="train only the runs whose names match one of these shell-style patterns "
                             "(mamba_*, *_lr3e-04_s0; --dry-run lists the names); the others are left as they are")
    parser.add_argument("--stack", type=_stack_size, default="auto",
                        help="train up to N runs that differ only in learning rate and seed together as one "
                             "stacked run; auto (default): on a GPU as many as fit in half its free memory, at "
                             "most 32; on a CPU up to 8 at widths up to 32, none wider")
    parser.add_argument("--out", default=default_out, help=f"parent folder of the sweep directory (default {default_out})")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace files in the sweep's folder named as its own (sweep.json, results.*; reproduce: "
                             "report/) that hf-mecheval did not write; finished runs are kept either way")


class _Parser(argparse.ArgumentParser):
    """argparse, whose refusal of bad input is one line on stderr (argparse's own prints the whole
    usage first, a screenful for ``sweep``, the error last), with a huge value echoed in it shortened
    (``shorten_values``); exit status 2 as argparse's."""

    def parse_args(self, args=None, namespace=None):
        self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message):
        from .errors import shorten_values

        # `mecheval --verison`: argparse misses the command before it reads the flag; say the flag
        flags = [a for a in getattr(self, "given", []) if a.startswith("-")]
        if message.startswith("the following arguments are required: COMMAND") and flags:
            message = f"unrecognized arguments: {' '.join(flags)}"
        # the top parser also reports a command's unknown flags: it cannot say which command's
        hint = (f"`{self.prog} --help` lists its flags" if " " in self.prog
                else f"`{self.prog} --help` lists the commands, `{self.prog} COMMAND --help` their flags")
        self.exit(2, f"{self.prog}: error: {shorten_values(message)} ({hint})\n")


def _grid_arguments(parser: argparse.ArgumentParser) -> None:
    """``mecheval evaluate``'s flags that choose the grid (their defaults: ``GridSettings``')."""
    from .runs.files import GridSettings
    from .tasks.seeding import SPLITS

    parser.add_argument("-n", type=_positive_int, default=GridSettings.n,
                        help=f"documents (default {GridSettings.n}; MQAR: queries, those of the first documents)")
    parser.add_argument("--split", choices=SPLITS, default=GridSettings.split, help=f"split (default {GridSettings.split})")
    parser.add_argument("--seed", type=_non_negative_int, help="data seed (default: the run's)")
    parser.add_argument("--sites", nargs="+", help="only these sites (default: all; see model.site_names())")
    parser.add_argument("--batch-size", type=_positive_int, default=64, help="documents per batch")
    parser.add_argument("--resamples", type=_non_negative_int, default=GridSettings.resamples,
                        help="bootstrap resamples")


def build_parser() -> argparse.ArgumentParser:
    from .tasks.seeding import SPLITS

    presets = _preset_names()
    parser = _Parser(
        prog="mecheval",
        description="Mechanistic evaluation of Transformers and state-space models on AR, ATR and MQAR.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"hf-mecheval {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    data = commands.add_parser("data", help="generate, describe and publish task data",
                               description="Generate, describe and publish task data.")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    gen = data_commands.add_parser("generate", help="write one split of a preset as parquet",
                                   description="Write one split of a preset as parquet (the columns of a published dataset).")
    gen.add_argument("preset", choices=presets, metavar="PRESET", help=f"one of: {', '.join(presets)}")
    gen.add_argument("--split", choices=SPLITS, default="train", help="split (default: train)")
    gen.add_argument("-n", type=_positive_int, required=True, help="number of documents")
    gen.add_argument("--seed", type=_non_negative_int, default=0, help="data seed (default: 0)")
    gen.add_argument("--grammar-seed", type=_non_negative_int, help="ATR: another language than the preset's")
    gen.add_argument("--out", required=True, help="output FILE.parquet")
    gen.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    gen.add_argument("--workers", type=_positive_int, default=1, help="processes (default: 1)")
    gen.set_defaults(func=_data_generate)

    stats = data_commands.add_parser("stats", help="print statistics a model could exploit",
                                     description="Print document length, key→value distance, adjacency, tree "
                                                 "depth, branching and repeated-label statistics of presets.")
    stats.add_argument("presets", nargs="+", choices=presets, metavar="PRESET", help=f"one or more of: {', '.join(presets)}")
    stats.add_argument("--split", choices=SPLITS, default="test", help="split (default: test)")
    stats.add_argument("-n", type=_positive_int, default=2000, help="documents per preset (default: 2000)")
    stats.add_argument("--seed", type=_non_negative_int, default=0, help="data seed (default: 0)")
    stats.add_argument("--grammar-seeds", type=_seed_range, metavar="G|FIRST-LAST",
                       help="ATR: average over these grammars (e.g. 0-29) instead of the preset's language")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.set_defaults(func=_data_stats)

    pub = data_commands.add_parser("publish", help="materialise presets as a Hub-style parquet folder with a dataset card",
                                   description="Materialise presets (all splits) as parquet plus a dataset card, so that "
                                               "datasets.load_dataset(FOLDER, PRESET) works offline; optionally upload.")
    pub.add_argument("presets", nargs="+", choices=presets, metavar="PRESET", help=f"one or more of: {', '.join(presets)}")
    pub.add_argument("--out", required=True, help="output folder")
    pub.add_argument("--train-size", type=_positive_int, help="training documents (default: the preset's: 100032 for AR and ATR)")
    pub.add_argument("--eval-size", type=_positive_int, help="validation and test documents each (default: the preset's: 1024 for AR and ATR)")
    pub.add_argument("--seed", type=_non_negative_int, default=0, help="data seed (default: 0)")
    pub.add_argument("--grammar-seed", type=_non_negative_int, help="ATR: another language than the presets'")
    pub.add_argument("--overwrite", action="store_true", help="replace existing files")
    pub.add_argument("--workers", type=_positive_int, default=1, help="processes (default: 1)")
    pub.add_argument("--push-to-hub", metavar="REPO", help="also upload the folder as dataset repository REPO")
    pub.set_defaults(func=_data_publish)

    train = commands.add_parser(
        "train", add_help=False, help="train one model (all flags of training/train.py; `mecheval train --help`)",
        description="Train one model with the transformers Trainer.")
    train.add_argument("arguments", nargs=argparse.REMAINDER,
                       help="[CONFIG.yaml] then flags: --task, --architecture, --hidden_size, --learning_rate, "
                            "--output_dir, ... (see --help)")
    train.set_defaults(func=_train)

    sweep = commands.add_parser("sweep", help="run a sweep file and write its results table",
                                description="Run every unfinished run of a sweep file (finished runs are skipped, "
                                            "interrupted ones resumed) and write results.{json,csv,md}: the best "
                                            "learning rate per configuration by validation, reported on test.")
    sweep.add_argument("file", help="a sweep YAML file, or a packaged sweep by name: ar_main, atr, ar_mamba_conv, "
                                    "cpu/ar, reference/ar, ... (hf_mecheval/training/sweeps/)")
    _launcher_arguments(sweep, default_out="runs/sweeps")
    sweep.add_argument("--grid", action="store_true",
                       help="also run the intervention grid on each run as soon as it finishes (and on finished "
                            "runs without one), as mecheval reproduce does")
    sweep.add_argument("-n", type=_positive_int, default=None,
                       help="with --grid: documents for the interventions (default 320)")
    sweep.set_defaults(func=_sweep)

    ev = commands.add_parser("evaluate", help="run the intervention grid on a trained run (JSON + plots)",
                             description="Corrupt the key and the value, patch every site of every layer at the key, "
                                         "value, divider, query and answer positions (MQAR: each query's own key, "
                                         "value, query and answer, one query at a time), and write "
                                         "interventions.json, heatmaps and bar plots, and the mechanism label.")
    ev.add_argument("run_dir", help="a finished run directory (from mecheval train)")
    ev.add_argument("--out", help="output folder (default RUN_DIR/interventions)")
    _grid_arguments(ev)
    ev.add_argument("--overwrite", action="store_true", help="replace existing results")
    ev.set_defaults(func=_evaluate)

    rep = commands.add_parser("report", help="tables and figures from run directories",
                              description="Accuracy, restoration @key/@value/@query at the last layer's input and "
                                          "mechanism labels of runs, as report.md, CSV/JSON and figures, and all of "
                                          "it on one self-contained page, report.html.")
    rep.add_argument("runs", nargs="*", help="run directories (evaluated ones include intervention results)")
    rep.add_argument("--out", default="runs/report", help="output folder (default runs/report)")
    rep.add_argument("--overwrite", action="store_true",
                     help="write into --out even where it holds files hf-mecheval did not write there")
    rep.add_argument("--results", metavar="DIR",
                     help="instead of runs: regenerate the figures, report.md files and claims.md of a results "
                          "folder (REPRODUCTION.md's results/) from its <sweep>/runs.json")
    rep.add_argument("--check", metavar="DOC", help="with --results: exit 1 if DOC's generated tables differ (alone, "
                                                    "it only reads: no figure or report is written)")
    rep.add_argument("--update", metavar="DOC", help="with --results: rewrite DOC's generated tables")
    rep.set_defaults(func=_report)

    qs = commands.add_parser("quickstart", help="train 8 models on a reduced AR setting, run the interventions, report",
                             description="The CPU quickstart: Transformer, Based, Mamba (conv 4 and conv 0), Hyena, H3, "
                                         "BaseConv and DeltaNet on a reduced AR setting, the intervention grid on each, "
                                         "and a report that checks the paper's headline. Finished parts of the "
                                         "same setting are reused.")
    qs.add_argument("--out", default="runs/quickstart", help="output folder (default runs/quickstart)")
    qs.add_argument("--tiny", action="store_true", help="a seconds-long smoke version (for tests)")
    qs.add_argument("--workers", type=_workers, default="auto",
                    help="training processes at once; auto (default): one per core with one thread each on a CPU")
    qs.add_argument("--seed", type=_seed, default=0,
                    help="initialisation and data-order seed of every run (default 0; the documents stay the same), "
                         "to see how much the figures move")
    qs.add_argument("--overwrite", action="store_true",
                    help="write the report even where --out holds files hf-mecheval did not write (replacing "
                         "those of the same name)")
    qs.set_defaults(func=_quickstart)

    push = commands.add_parser("push", help="upload a run (model, code, tokenizer, model card, metrics) to the Hub",
                               description="Upload the model with its config, its own "
                                           "code (loads with trust_remote_code=True without hf-mecheval) and "
                                           "generation config, the tokenizer, a model card written for the "
                                           "repository, run.json, metrics.json and the intervention results as a "
                                           "model repository; the run folder itself is left as it was.")
    push.add_argument("run_dir", help="a finished run directory")
    push.add_argument("repo", help="model repository, e.g. your-name/mamba-ar32-d64")
    push.add_argument("--private", action="store_true", help="create the repository as private")
    push.add_argument("--dataset", metavar="REPO", default=None,
                      help="the dataset repository the card links for the task's documents, where `mecheval data "
                           "publish --push-to-hub REPO` put them (default mecheval/ar, mecheval/atr or mecheval/mqar "
                           "by the run's task)")
    push.set_defaults(func=_push)

    halve = commands.add_parser("halve", help="store finished runs' weights in half precision, to commit them",
                                description="Replace each finished run's float32 model.safetensors by float16 weights "
                                            "and write weights.json beside them: the sha256 of the float32 file and of "
                                            "the float16 one, and the run's test accuracy with each (float16: "
                                            "measured again with the halved weights).")
    halve.add_argument("run_dirs", nargs="+", metavar="run_dir", help="finished run directories")
    halve.set_defaults(func=_halve)

    queue = commands.add_parser(
        "queue", help="train the runs of several sweeps in a priority order; start it once per core for lanes",
        description="Train, one at a time with its intervention grid, the first run of a queue file (a YAML list "
                    "of {sweep: NAME, only: [PATTERN, ...]}, first to last) that is not done and that no other "
                    "queue process holds; read the file again before every run; stop when nothing is left to "
                    "take or when OUT/queue.stop exists. Start it once per core: the processes share the work.")
    queue.add_argument("file", help="the queue file (e.g. hf_mecheval/experiments/queue.yaml)")
    queue.add_argument("--out", default="runs/reproduce", help="parent folder of the sweeps' directories "
                                                               "(default runs/reproduce, as mecheval reproduce)")
    queue.add_argument("--threads", type=_positive_int, default=1, help="CPU threads of each training (default 1)")
    queue.add_argument("-n", type=_positive_int, default=320, help="documents for the interventions (default 320)")
    queue.add_argument("--dry-run", action="store_true",
                       help="list the runs left, in order, each with its expected CPU hours (from finished runs "
                            "like it), and exit")
    queue.add_argument("--time-steps", action="store_true",
                       help="with --dry-run: price the runs that no finished run is like by timing a few training "
                            "steps of each kind here (at --threads; a minute or more), scaled by what the finished "
                            "runs took beyond their own timed steps")
    queue.add_argument("--until", type=_until, metavar="TIME",
                       help="start only runs expected to end before TIME (HH:MM, the next such time, or "
                            "2026-12-05T06:55): their steps left timed here, with a margin; the others are left "
                            "for later")
    queue.set_defaults(func=_queue)

    from .reports.reproduce import PRESETS as REPRODUCE_PRESETS
    rp = commands.add_parser("reproduce", help="a full reference sweep, then interventions on every run and the report",
                             description="Run a reference sweep (GPU scale: hundreds of runs), the intervention grid "
                                         "on every finished run, and the report. Finished runs are reused.")
    rp.add_argument("--preset", required=True, choices=list(REPRODUCE_PRESETS), help="which experiment")
    _launcher_arguments(rp, default_out="runs/reproduce")
    rp.add_argument("-n", type=_positive_int, default=320, help="documents for the interventions (default 320)")
    rp.set_defaults(func=_reproduce)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .children import follow_parent

    follow_parent()              # started by a sweep (an evaluation): stop with it
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:
        # every flag (--help included) belongs to the training parser; argparse's REMAINDER
        # would take a leading flag as one of `mecheval`'s own
        from .training.run import main as train_main

        return train_main(argv[1:], prog="mecheval train")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except MechEvalError as exc:
        print(f"mecheval: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an unwritable or unreadable path anywhere below
        where = f": {exc.filename}" if exc.filename else ""
        print(f"mecheval: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mecheval: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
