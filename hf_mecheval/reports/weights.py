"""A finished run's weights in half precision, to commit: ``mecheval halve RUN_DIR ...``.

At width 256 a run's float32 weights take about 12 MB; a repository that keeps the paper's grid
keeps only the best run of each configuration, in float16 (half the bytes). The float16 file
replaces ``model.safetensors`` (``from_pretrained`` loads it into the float32 model the config
names), and ``weights.json`` says what it is and what it reproduces: the sha256 of the float32
file it came from and of the float16 file, and the run's test accuracy with each (float32: as the
run measured it at its end, ``metrics.json``; float16: measured again here, on the same test
documents, with the float16 weights loaded into the float32 model).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from ..atomic_files import atomic_path
from ..errors import MechEvalError
from ..runs import RunDir
from ..runs.manifest import recording, write_run_file

WEIGHTS = "model.safetensors"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def measured_test_accuracy(run_dir: Path, batch_size: int = 256) -> float:
    """The run's accuracy on its test documents (argmax over the vocabulary at the position that
    predicts each answer), with the weights now in ``run_dir``."""
    import torch

    from .evaluate_run import load_run

    model, task, record = load_run(run_dir)
    model.eval()
    size, seed = record["task"].get("eval_size"), record["task"].get("dataset_seed", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1 or not isinstance(seed, int):
        raise MechEvalError(f"{Path(run_dir) / 'run.json'}: task.eval_size must be a number of test documents "
                            f"and task.dataset_seed a seed, got {size!r} and {seed!r}")
    data = task.generate(size, "test", seed)
    ids = torch.from_numpy(data.padded()).long()              # (N, L), right-padded: causal models ignore it
    answer_pos = torch.from_numpy(data.columns["answer_pos"]).long()
    answers = ids[torch.arange(len(ids)), answer_pos]
    right = 0
    with torch.no_grad():
        for start in range(0, len(ids), batch_size):
            rows = torch.arange(start, min(start + batch_size, len(ids)))
            logits = model(input_ids=ids[rows]).logits          # (b, L, V)
            predicted = logits[torch.arange(len(rows)), answer_pos[rows] - 1].argmax(-1)
            right += int((predicted == answers[rows]).sum())
    return right / len(ids)


def halve_weights(run_dir: str | Path) -> dict:
    """Replace the finished run's float32 weights by float16 ones and write weights.json; returns
    its record. A run already halved is refused (its float32 file is gone). The float16 weights are
    measured in a copy of the run before they replace anything: a run its model cannot be loaded
    from (a damaged config, a task it does not fit) or a halving stopped half-way keeps its float32
    weights."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    run = RunDir(run_dir)
    run.require(RunDir.RECORD, RunDir.METRICS, WEIGHTS)
    path = run.path / WEIGHTS
    if (run.path / RunDir.HALF_WEIGHTS).exists():
        raise MechEvalError(f"{run.path} already holds half-precision weights ({RunDir.HALF_WEIGHTS})")
    try:
        tensors = load_file(str(path))
    except SafetensorError as exc:       # truncated, empty, or a Git LFS pointer instead of the file
        raise MechEvalError(f"{path} is not a readable safetensors file: {exc}") from None
    if any(t.dtype != torch.float32 for t in tensors.values() if t.is_floating_point()):
        raise MechEvalError(f"{path} is not float32: only a run's own float32 weights are halved")
    record = {"dtype": "float16", "float32_sha256": sha256(path),
              "float32_test_accuracy": run.metrics()["final"]["test_accuracy"]}
    with tempfile.TemporaryDirectory(prefix="mecheval-halve-") as scratch:
        copy = Path(scratch) / run.path.name         # the run's own files (config, run.json, ...), float16 weights
        copy.mkdir()
        for item in run.path.iterdir():
            if item.is_file() and item.name != WEIGHTS:
                shutil.copyfile(item, copy / item.name)
        save_file({k: (t.half() if t.is_floating_point() else t).contiguous() for k, t in tensors.items()},
                  str(copy / WEIGHTS), metadata={"format": "pt"})
        record["float16_sha256"] = sha256(copy / WEIGHTS)
        try:
            record["float16_test_accuracy"] = measured_test_accuracy(copy)
        except MechEvalError as exc:        # it names the copy's files, which are the run's own: name those
            raise MechEvalError(str(exc).replace(str(copy), str(run.path))) from None
        with recording(run.path), atomic_path(path, overwrite=True) as tmp:   # the float32 file stays until it is whole
            shutil.copyfile(copy / WEIGHTS, tmp)
    write_run_file(run.path, RunDir.HALF_WEIGHTS, json.dumps(record, indent=2) + "\n")
    return record
