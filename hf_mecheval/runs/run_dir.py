"""The run directory: what a run writes into it (``RunDir``), when it may be replaced, which
checkpoint a resumed run continues from, and whether a run there is the run asked for.

* ``RunDir`` owns a run's own files: training starts it (command.txt, run.json) and finishes it
  (metrics.json, written last, so its presence marks a finished run), and every report, the model
  card, the evaluation and ``mecheval push`` read a run through it.

* Only a folder that is recognisably a run (``command.txt`` or ``run.json`` in it, and nothing a
  run does not write) is ever replaced, and never the current folder or one of its parents.
* A resumed run continues from the newest *complete* checkpoint: the Trainer writes
  ``trainer_state.json`` last, so a checkpoint without it (or with weights that cannot be read)
  was cut short by a kill or a full disk.
* A run's fingerprint is the part of its ``run.json`` that decides its result (model, task, data
  sizes and seed, the optimisation arguments); a finished or resumed run must have the fingerprint
  of the run asked for. It is computed from ``run.json`` as every version wrote it, so runs made
  before fingerprints existed are compared the same way.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
from pathlib import Path

from ..errors import MechEvalError, some_of
from ..atomic_files import is_temporary
from ..inputs import read_json
from .files import METRICS, RUN_RECORD, GridSettings, read_interventions
from .manifest import (MANIFEST, SAVED_NAME, files_under, read_manifest, removal_plan, remove_files,
                       remove_written_below, unlisted, write_run_file)

# every name a run (or a stacked run's directory) writes; checkpoints and temporaries by pattern
RUN_FILES = {"command.txt", "run.json", "config.json", "generation_config.json", "model.safetensors",
             "training_args.bin", "trainer_state.json", "metrics.json", "README.md", "restoration_history.json",
             "records.json", "finished.json"}
# the task's tokenizer, saved beside the model
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
RUN_FOLDERS = {"interventions"}
MARKS = ("command.txt", "run.json")
CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def _written_by_a_run(path: Path) -> bool:
    """Whether a run writes ``path`` (a file, or a folder: checkpoints and the grid), judged by
    its name, for a run folder from before the manifest. Links are never a run's."""
    name = path.name
    if path.is_symlink() or is_temporary(name):
        return False
    if path.is_dir():
        return name in RUN_FOLDERS or CHECKPOINT.fullmatch(name) is not None
    return name in RUN_FILES or name in TOKENIZER_FILES or name in _model_code_files()


def _model_code_files() -> set[str]:
    """The names of the model's code files, which a run saves beside the weights (its remote code)."""
    from ..models.modeling_mecheval import remote_code_files

    return {p.name for p in remote_code_files()}


def check_replaceable(folder: str | os.PathLike, flag: str = "--overwrite") -> None:
    """Refuse (one clear error) to replace ``folder`` unless it is missing, empty (temporaries
    aside) or a run directory: never a file, a link, the current folder or one of its parents, or
    a folder with anything in it that the run did not write (its manifest, ``runs/manifest.py``,
    must vouch for every file below it, and list only plain files inside it)."""
    _run_files(Path(folder), flag)


def _run_files(folder: Path, flag: str) -> list[str]:
    """``check_replaceable``; returns the files below ``folder`` that replacing the run removes."""
    if not os.path.lexists(folder) or (folder.is_dir() and not folder.is_symlink() and not holds_files(folder)):
        return []                        # nothing there to lose (a person's temporaries stay)
    if folder.is_symlink():
        raise MechEvalError(f"{flag} replaces only a run directory; {folder} is a link")
    if not folder.is_dir():
        raise MechEvalError(f"{flag} replaces only a run directory; {folder} is a file")
    here = Path.cwd().resolve()
    if folder.resolve() == here or folder.resolve() in here.parents:
        raise MechEvalError(f"{flag} would delete {folder}, which holds the current folder; give the run "
                            "its own folder")
    manifest = read_manifest(folder)
    if manifest is not None and manifest.problem:
        raise MechEvalError(f"{flag} replaces only a run directory, and {folder} is not only the run's: "
                            f"{manifest.problem}; move its files or choose another folder")
    present = files_under(folder)
    if manifest is not None:       # every file below the folder must be one the run wrote
        foreign = unlisted(folder, manifest)
        ours = [f for f in manifest.files] + [p for p in present if manifest.owns(p) and p not in manifest.files]
    else:                          # a run from before the manifest: judged by the names a run writes
        entries = list(folder.iterdir())
        foreign = sorted(p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in entries
                         if not is_temporary(p.name) and not _written_by_a_run(p))
        for sub in entries:        # and in its checkpoints and grid, the files a run writes there
            if sub.is_dir() and _written_by_a_run(sub):
                foreign += sorted(f.relative_to(folder).as_posix() for f in _foreign_below(sub))
        ours = list(present)
    marked = any((folder / m).is_file() for m in MARKS)
    if foreign or (present and not marked):
        why = (f"it holds {some_of(foreign)}, which no run writes" if foreign
               else "it is not a run directory (no command.txt or run.json)")
        raise MechEvalError(f"{flag} replaces only a run directory, and {folder} is not one: {why}; move "
                            "those files or choose another folder")
    try:
        removal_plan(folder, ours)                # links and folders among the entries: refused now
    except MechEvalError as exc:
        raise MechEvalError(f"{flag}: {exc}") from None
    return ours


def _foreign_below(subfolder: Path) -> list[Path]:
    """Files in a run's subfolder (a checkpoint, the grid) that no run writes (folders without a
    manifest): a run writes its own names, what a save writes, and the grid's figures."""
    found = []
    for root, dirs, files in os.walk(subfolder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            p = Path(root, name)
            if is_temporary(name):
                continue
            if p.is_symlink() or not (_written_by_a_run(p) or SAVED_NAME.fullmatch(name) is not None
                                      or (subfolder.name in RUN_FOLDERS and p.suffix == ".png")):
                found.append(p)
    return found


def remove_run_subfolder(folder: Path, sub: Path) -> None:
    """Remove the run's subfolder ``sub`` (a checkpoint) of ``folder``: the files the run wrote
    there, refusing (before anything is removed) where anything else is among them."""
    if sub.is_symlink():
        raise MechEvalError(f"{sub} is a link, not the run's checkpoint; remove the link before --resume")
    manifest = read_manifest(folder)
    prefix = sub.relative_to(folder).as_posix() + "/"
    if manifest is None:
        foreign = _foreign_below(sub)
        if foreign:
            raise MechEvalError(f"{sub} holds {foreign[0].relative_to(folder)}, which no run writes; move it before --resume")
        remove_files(folder, [p for p in files_under(folder) if p.startswith(prefix)])
        return
    try:
        remove_written_below(folder, manifest, below=prefix)
    except MechEvalError as exc:
        raise MechEvalError(f"{sub}: {exc}; move it before --resume") from None


def clear_run_dir(folder: str | os.PathLike, flag: str = "--overwrite") -> None:
    """Empty a run directory (``check_replaceable`` first, which checks every file to be removed
    before any is): the files its manifest vouches for, or, for a run from before the manifest,
    every file in it (``check_replaceable`` found only a run's files). Temporaries the manifest
    does not list stay. The folder itself stays: the lock of the process replacing the run is on it."""
    folder = Path(folder)
    ours = _run_files(folder, flag)
    remove_files(folder, ours)
    with contextlib.suppress(FileNotFoundError):
        (folder / MANIFEST).unlink()


def holds_files(folder: str | os.PathLike) -> bool:
    folder = Path(folder)
    return folder.is_dir() and any(not is_temporary(p.name) for p in folder.iterdir())


# ---------------------------------------------------------------------------------- checkpoints
def checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The run's checkpoint-N folders, newest (largest N) first."""
    run_dir = Path(run_dir)
    found = [p for p in run_dir.iterdir() if CHECKPOINT.fullmatch(p.name) and p.is_dir() and not p.is_symlink()] \
        if run_dir.is_dir() else []
    return sorted(found, key=lambda p: int(CHECKPOINT.fullmatch(p.name).group(1)), reverse=True)


def checkpoint_problem(path: Path) -> str | None:
    """Why the checkpoint ``path`` cannot be resumed from, or None: its trainer state (the
    Trainer writes it last) and its weights must be readable."""
    import dataclasses

    from safetensors import safe_open
    from transformers.trainer_callback import TrainerState

    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except FileNotFoundError:
        return "incomplete (no trainer_state.json: its saving was cut short)"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        return f"trainer_state.json is damaged ({type(exc).__name__})"
    # the Trainer builds TrainerState(**state): a key it does not know (another transformers' file) stops it there
    if not isinstance(state, dict):
        return f"trainer_state.json is not a JSON object (a {type(state).__name__})"
    unknown = sorted(set(state) - {f.name for f in dataclasses.fields(TrainerState)})
    if unknown:
        return f"trainer_state.json has keys this transformers' TrainerState does not know: {', '.join(unknown[:3])}"
    try:
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            list(f.keys())
    except Exception as exc:  # whatever the damage (missing, truncated, not safetensors), it is named
        return f"model.safetensors: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    # the optimizer's and scheduler's state (torch.save: a zip archive); a damaged one would stop the resume
    # inside the Trainer, where the previous checkpoint could still have been used
    for name in ("optimizer.pt", "scheduler.pt"):
        if (path / name).exists() and not _intact_archive(path / name):
            return f"{name} is damaged (not a complete torch.save archive)"
    return None


def _intact_archive(path: Path) -> bool:
    """Whether ``path`` is a zip archive (torch.save's format) whose every member reads back
    with its checksum."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, ValueError):
        return False


def resume_checkpoint(run_dir: str | os.PathLike, remove_unusable: bool = True) -> Path:
    """The newest complete checkpoint of ``run_dir``. Newer ones that cannot be used (a save cut
    short) are removed when ``remove_unusable`` (so the Trainer never mixes them into its
    rotation) and named on stderr; none usable is one clear error."""
    import sys

    linked = [p.name for p in Path(run_dir).glob("checkpoint-*") if p.is_symlink()]
    if linked:        # the Trainer would save into it, or rotate it away: outside the run's folder
        raise MechEvalError(f"--resume: {Path(run_dir) / linked[0]} is a link, not one of the run's checkpoints; "
                            "remove the link, then continue the run")
    found = checkpoints(run_dir)
    if not found:
        raise MechEvalError(f"--resume: {run_dir} has no checkpoint-* folder to continue from")
    unusable = []
    for path in found:
        problem = checkpoint_problem(path)
        if problem is None:
            for bad, why in unusable if remove_unusable else ():
                remove_run_subfolder(Path(run_dir), bad)
                print(f"resume: removed {bad}: {why}", file=sys.stderr)
            return path
        unusable.append((path, problem))
    bad, why = unusable[0]
    raise MechEvalError(f"cannot resume from {run_dir}: no complete checkpoint ({bad.name}: {why})")


# ---------------------------------------------------------------------------------- fingerprints
# the training arguments that change what a run learns (output, logging, evaluation and saving do not)
RESULT_TRAINING_FIELDS = (
    "learning_rate", "seed", "data_seed", "num_train_epochs", "max_steps", "per_device_train_batch_size",
    "gradient_accumulation_steps", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "weight_decay",
    "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "optim", "optim_args", "label_smoothing_factor",
    "bf16", "fp16", "dataloader_drop_last", "neftune_noise_alpha", "average_tokens_across_devices",
)
IGNORED_MODEL_FIELDS = ("transformers_version", "use_cache")
"""Model fields that do not decide a run's result (``use_cache``: what a forward returns by default)."""


def read_model_config(run_dir: str | os.PathLike):
    """The run's config.json as the transformers configuration it describes, once it is found to be
    a JSON object naming a model type; where transformers cannot read it (an unknown model type, a
    field of the wrong type), one line naming the run."""
    from transformers import AutoConfig

    read_json(Path(run_dir) / "config.json", {"model_type": str})
    try:
        return AutoConfig.from_pretrained(run_dir)
    except (ValueError, OSError, KeyError, TypeError, AttributeError, OverflowError, RuntimeError) as exc:
        raise MechEvalError(f"cannot read the model configuration in {run_dir}: {(str(exc).splitlines() or [''])[0]}") \
            from None


def recorded_model(model: dict) -> dict:
    """A run record's model fields, completed with what a record from before a field existed was
    built with (its config class's ``LEGACY_FIELDS``: e.g. ``init_scheme`` "normal", Hyena's
    ``filter_form`` "mecheval-v1"); transformers' own models' fields as they are."""
    from ..models import ARCHITECTURES

    for spec in ARCHITECTURES.values():
        if spec.config_class.model_type == model.get("model_type"):
            return {**spec.config_class.LEGACY_FIELDS, **model}
    return model


def init_scheme_of(model: dict) -> str | None:
    """A run record's model ``init_scheme`` (None for transformers' own models)."""
    return recorded_model(model).get("init_scheme")


def fingerprint(record: dict) -> dict:
    """What decides a run's result, from its run.json record (flat ``section.field`` keys)."""
    model, task, training = (record.get(k) if isinstance(record.get(k), dict) else {}
                             for k in ("model", "task", "training"))
    flat = {f"model.{k}": v for k, v in recorded_model(model).items() if k not in IGNORED_MODEL_FIELDS}
    flat.update({f"task.{k}": task.get(k) for k in ("preset", "train_size", "eval_size", "dataset_seed")})
    config = task.get("config") if isinstance(task.get("config"), dict) else {}
    flat.update({f"task.config.{k}": v for k, v in config.items()})
    flat["recipe"] = record.get("recipe")
    flat.update({f"training.{k}": training.get(k) for k in RESULT_TRAINING_FIELDS})
    return json.loads(json.dumps(flat, default=str))      # as read back from a file


def differences(recorded: dict, requested: dict) -> list[str]:
    """``field: X there, Y asked`` for every field whose value differs between two records."""
    a, b = fingerprint(recorded), fingerprint(requested)
    return [f"{k}: {json.dumps(a.get(k))} there, {json.dumps(b.get(k))} asked" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def check_same_run(run_dir: str | os.PathLike, requested: dict, what: str) -> None:
    """Refuse to use (``what``: resume, reuse ...) the run in ``run_dir`` unless its run.json has
    the fingerprint of ``requested``; the error names the fields that differ."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise MechEvalError(f"cannot {what} {run_dir}: it has no run.json, so it is not a run this command made")
    diff = differences(read_json(path, dict), requested)
    if diff:
        more = f" (and {len(diff) - 3} more)" if len(diff) > 3 else ""
        raise MechEvalError(f"cannot {what} {run_dir}: it was trained with other arguments — {'; '.join(diff[:3])}"
                            f"{more}; use another output folder, or remove that run")


# ---------------------------------------------------------------------------------- a run's files
def finite_or_null(value):
    """``value`` (JSON-ready data) with every NaN or infinite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


class RunDir:
    """One run directory and the files of the run in it (the model's own files are written by
    ``save_pretrained``). Reading checks each file's shape (``files.py``), so a damaged or foreign
    file is one clear error naming it."""

    COMMAND = "command.txt"        # the exact command, to be typed again
    RECORD = "run.json"            # every resolved argument, the task and the model configuration
    METRICS = "metrics.json"       # final metrics and history; written last: a finished run has it
    CARD = "README.md"             # the model card (``model_card.py``)
    INTERVENTIONS = Path("interventions") / "interventions.json"    # from `mecheval evaluate`
    HALF_WEIGHTS = "weights.json"  # `mecheval halve`: the weights are float16, and what they reproduce

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    # -- state
    @property
    def finished(self) -> bool:
        return (self.path / self.METRICS).is_file()

    @property
    def evaluated(self) -> bool:
        return self.interventions_path.is_file()

    def require(self, *names: str) -> None:
        """Refuse a run that lacks any of ``names`` (default: run.json and metrics.json, the files
        of a finished run), naming what is missing."""
        names = names or (self.RECORD, self.METRICS)
        if not self.path.exists():             # a mistyped path: say so, not which files it lacks
            raise MechEvalError(f"run directory {self.path} does not exist")
        if not self.path.is_dir():
            raise MechEvalError(f"{self.path} is not a run directory (give the folder `mecheval train` wrote)")
        missing = [name for name in names if not (self.path / name).is_file()]
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            raise MechEvalError(f"{self.path} is not a finished run: {', '.join(missing)} {verb} missing")

    # -- reading
    def record(self) -> dict:
        """run.json, with the types the reports rely on."""
        return read_json(self.path / self.RECORD, RUN_RECORD)

    def metrics(self) -> dict:
        """metrics.json as a whole (``final`` and the optional ``history``)."""
        return read_json(self.path / self.METRICS, METRICS)

    @property
    def failure(self) -> str | None:
        """Why a finished run failed (it diverged or trained zero steps: ``metrics.json``'s
        ``final.failed``), or None."""
        return self.metrics()["final"].get("failed") if self.finished else None

    def finished_run(self) -> tuple[dict, dict]:
        """(run.json, metrics.json) of a finished run; refused with the missing file named otherwise."""
        self.require()
        return self.record(), self.metrics()

    @property
    def interventions_path(self) -> Path:
        return self.path / self.INTERVENTIONS

    def grid_matches(self, settings: "GridSettings") -> bool:
        """Whether the run has an intervention grid made with ``settings``."""
        grid = self.interventions()
        return grid is not None and settings.matches(grid, self.record()["task"].get("dataset_seed", 0))

    def interventions(self) -> dict | None:
        """interventions.json, or None before `mecheval evaluate` ran."""
        return read_interventions(self.interventions_path) if self.evaluated else None

    # -- writing (atomically: a reader never sees half a file)
    def start(self, command: str, record: dict) -> None:
        """A fresh run: empty the folder (only if it is a run, ``clear_run_dir``), then write the
        command and the resolved arguments."""
        clear_run_dir(self.path)
        write_run_file(self.path, self.COMMAND, command + "\n")
        write_run_file(self.path, self.RECORD, json.dumps(record, indent=2, default=str) + "\n")

    def finish(self, metrics: dict) -> None:
        """metrics.json: the run is finished (its model card is written from it: ``model_card.py``).
        A NaN or infinite number (a diverged run's loss) is written as null: strict JSON."""
        write_run_file(self.path, self.METRICS, json.dumps(finite_or_null(metrics), indent=2, allow_nan=False) + "\n")
