"""Materialise task presets as a Hub-style dataset folder (parquet + dataset card).

    python dataset_scripts/ar/materialize.py  [--out FOLDER] [--train-size N] [--push-to-hub mecheval/ar]
    python dataset_scripts/atr/materialize.py [--out FOLDER] [--train-size N] [--push-to-hub mecheval/atr]
    python dataset_scripts/mqar/materialize.py [--out FOLDER] [--train-size N] [--push-to-hub mecheval/mqar]

They need only an installed hf-mecheval (the wheel will do), wherever they are run from; the
folder defaults to data/ar, data/atr or data/mqar in the current directory.

Afterwards ``datasets.load_dataset(FOLDER, "atr_easy")`` works offline, and once pushed,
``datasets.load_dataset("mecheval/atr", "atr_easy")``. Same as ``mecheval data publish``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_mecheval.cli import main as mecheval
from hf_mecheval.tasks.presets import PRESETS


def run(task: str, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Materialise every {task.upper()} preset as parquet + dataset card.")
    parser.add_argument("--out", default=str(Path("data") / task),
                        help=f"output folder (default: data/{task} in the current directory)")
    args, rest = parser.parse_known_args(argv)
    presets = [name for name, p in PRESETS.items() if p.task == task]
    return mecheval(["data", "publish", *presets, "--out", args.out, *rest])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
