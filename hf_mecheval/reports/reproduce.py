"""``mecheval reproduce --preset NAME``: a full reference sweep (GPU scale), the intervention grid
on every finished run, and the report.

    paper-ar        hf_mecheval/training/sweeps/ar_main.yaml        (claims 1, 2, 7)
    paper-atr       hf_mecheval/training/sweeps/atr.yaml            (claims 5, 7, 8)
    ablation-mamba  hf_mecheval/training/sweeps/ar_mamba_conv.yaml  (claims 3, 4)
    ablation-based  hf_mecheval/training/sweeps/ar_based_kernel.yaml (claim 3)
    atr-no-conv     hf_mecheval/training/sweeps/atr_no_conv.yaml    (claim 6)

CPU scale (REPRODUCTION.md: what this repository's committed results come from):

    cpu-ar          hf_mecheval/training/sweeps/cpu/ar.yaml         (claims 1, 2, 4, 7; 3 seeds)
    cpu-ablations   hf_mecheval/training/sweeps/cpu/ablations.yaml  (claim 3)
    cpu-atr         hf_mecheval/training/sweeps/cpu/atr.yaml        (claims 5, 6, 7, 8)

The reference setting at width 64 (REPRODUCTION.md, "The reference setting"; CPU-hours):

    ref-ar          hf_mecheval/training/sweeps/reference/ar.yaml   (ar_32 as the reference, 7 architectures)
    ref-ablations   hf_mecheval/training/sweeps/reference/ar_ablations.yaml (Mamba conv 0-3, Based short kernels)
    ref-atr         hf_mecheval/training/sweeps/reference/atr.yaml  (ATR easy, without Mamba's conv, ATR-gen)

Those three were made under hf-mecheval's earlier rule (N(0, 0.02) init, clipping at 1, the first
long-convolution forms), which they pin; the same setting with the reference recipe's defaults:

    ref-recipe-ar         hf_mecheval/training/sweeps/reference/recipe_ar.yaml
    ref-recipe-ablations  hf_mecheval/training/sweeps/reference/recipe_ablations.yaml
    ref-recipe-atr        hf_mecheval/training/sweeps/reference/recipe_atr.yaml

The paper's grid beyond width 64, with the reference recipe's defaults:

    ref-width-ar          hf_mecheval/training/sweeps/reference/width_ar.yaml (AR at widths 16, 32, 128, 256)
    ref-width-ablations   hf_mecheval/training/sweeps/reference/width_ablations.yaml (short convolutions at width 256)
    ref-depth             hf_mecheval/training/sweeps/reference/depth.yaml (1 and 3 layers, no positions; width 64)
    ref-atr-languages     hf_mecheval/training/sweeps/reference/atr_languages.yaml (atr_medium, atr_8192, atr_gen)
    ref-ar-beyond         hf_mecheval/training/sweeps/reference/ar_beyond.yaml (Mamba-2, Gated DeltaNet on AR, widths 64-256)

Multi-query associative recall (MQAR, Zoology's recall benchmark) at CPU scale:

    cpu-mqar              hf_mecheval/training/sweeps/cpu/mqar.yaml (nine architectures, widths 64 and 128, mqar_cpu)
    cpu-mqar-zoology      hf_mecheval/training/sweeps/cpu/mqar_zoology.yaml (Zoology's Figure 2 settings 64x4, 128x8)
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import ConfigError
from ..runs import RunDir
from ..runs.manifest import claim_output_folder
from ..runs.files import GridSettings
from ..training.sweep import SWEEPS_DIR, Sweep, launch, write_results

PRESETS = {"paper-ar": "ar_main.yaml", "paper-atr": "atr.yaml", "ablation-mamba": "ar_mamba_conv.yaml",
           "ablation-based": "ar_based_kernel.yaml", "atr-no-conv": "atr_no_conv.yaml",
           "cpu-ar": "cpu/ar.yaml", "cpu-ablations": "cpu/ablations.yaml", "cpu-atr": "cpu/atr.yaml",
           "ref-ar": "reference/ar.yaml", "ref-ablations": "reference/ar_ablations.yaml",
           "ref-atr": "reference/atr.yaml", "ref-recipe-ar": "reference/recipe_ar.yaml",
           "ref-recipe-ablations": "reference/recipe_ablations.yaml", "ref-recipe-atr": "reference/recipe_atr.yaml",
           "ref-width-ar": "reference/width_ar.yaml",
           "ref-width-ablations": "reference/width_ablations.yaml", "ref-depth": "reference/depth.yaml", "ref-atr-languages": "reference/atr_languages.yaml",
           "ref-ar-beyond": "reference/ar_beyond.yaml",
           "cpu-mqar": "cpu/mqar.yaml", "cpu-mqar-zoology": "cpu/mqar_zoology.yaml"}


def reproduce(preset: str, out: str | Path = "runs/reproduce", launcher: str = "local", workers: int | str = "auto",
              n: int = 320, dry_run: bool = False, stack: int | str = "auto", only: Sequence[str] | None = None,
              threads: int | None = None, overwrite: bool = False) -> dict:
    """``only``: train only the runs whose names match (``Sweep.select``); the report still covers
    every finished run of the preset. ``overwrite``: replace a person's files in the sweep's folder
    and its ``report/`` (refused, before any training, without it)."""
    if preset not in PRESETS:
        raise ConfigError("preset", f"must be one of {', '.join(PRESETS)}, got {preset!r}")
    sweep = Sweep.load(SWEEPS_DIR / PRESETS[preset])
    if dry_run:
        return {"runs": [r.name for r in sweep.select(only)]}
    report_dir = Path(out) / sweep.name / "report"
    claim_output_folder(report_dir, overwrite)         # days of training must not end in a refused report
    # each run's intervention grid right after its training, in the same worker (and for finished
    # runs that have none): a sweep stopped part-way leaves every finished run evaluated
    outcome = launch(sweep, out, launcher=launcher, workers=workers, stack=stack, grid=GridSettings(n=n),
                     only=only, threads=threads, overwrite=overwrite)
    write_results(sweep, out, overwrite=overwrite)
    runs = [Path(out) / sweep.name / "runs" / r.name for r in sweep.runs]
    finished = [r for r in runs if RunDir(r).finished]
    from .report import write_report      # matplotlib: not for `mecheval --help`, which reads PRESETS

    report = write_report(finished, report_dir, overwrite=overwrite, title=f"hf-mecheval: {preset}")
    return {"outcome": outcome, "report": report["out"]}
