"""One run, asked for: ``RunSpec``, built and checked once where the run is asked for and handed
on as it is.

    spec = RunSpec.from_flags(["--architecture", "mamba", "--output_dir", "runs/m"])   # mecheval train
    spec = RunSpec.from_values({"architecture": "mamba", "learning_rate": "1e-3"})     # a sweep's run
    spec.record                      # the run.json it writes (what a reused or resumed run must match)

A spec holds the four argument groups (``arguments.py``), the task and the model's configuration
(each built once, by ``validate``), and the sizes the recipe resolves to. Whatever the source —
command-line flags, a YAML or JSON file of defaults, a sweep grid, a job file a sweep's worker
reads (``jobs.py``) — values become typed arguments in one place: ``command_line.parse``.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
from typing import Any, Sequence

from ..errors import MechEvalError
from .arguments import DataArguments, MechEvalTrainingArguments, ModelArguments, RunArguments, resolved_sizes, validate
from .command_line import parse, parse_values


@dataclasses.dataclass(frozen=True)
class RunSpec:
    model: ModelArguments
    data: DataArguments
    run: RunArguments
    training: MechEvalTrainingArguments      # num_train_epochs resolved (the recipe's or the preset's)
    task: Any                                # tasks.base.Task, as the arguments configure it
    config: Any                              # the model's configuration (ours, or transformers' for hf:)
    train_size: int
    eval_size: int

    @staticmethod
    def from_arguments(model: ModelArguments, data: DataArguments, run: RunArguments,
                       training: MechEvalTrainingArguments) -> "RunSpec":
        """Every argument checked (``validate``: values, task, model, memory), the sizes resolved."""
        task, config = validate(model, data, run, training)
        train_size, eval_size, training.num_train_epochs = resolved_sizes(data, run, training)
        return RunSpec(model, data, run, training, task, config, train_size, eval_size)

    @staticmethod
    def from_flags(argv: Sequence[str]) -> "RunSpec":
        """From ``mecheval train``'s command line: [CONFIG.yaml|.json] then flags."""
        return RunSpec.from_arguments(*parse(argv))

    @staticmethod
    def from_values(values: dict, source: str | None = None) -> "RunSpec":
        """From a mapping of argument names to values (a sweep's run, a job file's); errors start
        with ``source`` when given. A run without ``output_dir`` gets "." (``at`` sets the real one)."""
        try:
            if isinstance(values, dict) and "output_dir" not in values:
                values = {**values, "output_dir": "."}
            return RunSpec.from_arguments(*parse_values(values))
        except MechEvalError as exc:
            if source is None:
                raise
            raise MechEvalError(f"{source}: {exc}") from None

    def at(self, output_dir) -> "RunSpec":
        """The same run in another run directory (nothing else is checked or built again)."""
        training = copy.copy(self.training)
        training.output_dir = str(output_dir)
        return dataclasses.replace(self, training=training)

    @property
    def groups(self) -> tuple:
        return self.model, self.data, self.run, self.training

    @property
    def output_dir(self) -> str:
        return self.training.output_dir

    def value(self, name: str):
        """The typed value of the argument ``name``."""
        return next(getattr(g, name) for g in self.groups if any(f.name == name for f in dataclasses.fields(g)))

    @functools.cached_property
    def record(self) -> dict:
        """What run.json holds: every resolved argument, the task and the model configuration, as
        read back from the file (``runs.run_dir.fingerprint`` compares these)."""
        from ..adapters.native_config import is_native

        sizes = {}
        if is_native(self.model.architecture):   # under the common names too (GPT-2 calls them n_embd, n_layer)
            sizes = {"hidden_size": self.config.hidden_size, "num_hidden_layers": self.config.num_hidden_layers}
        record = {"model": {"architecture": self.model.architecture, **sizes, **self.config.to_diff_dict()},
                  "task": {"preset": self.data.task, "config": self.task.config.to_dict(),
                           "train_size": self.train_size, "eval_size": self.eval_size,
                           "dataset_seed": self.data.dataset_seed},
                  "recipe": self.run.recipe,
                  "training": json.loads(self.training.to_json_string())}
        return json.loads(json.dumps(record, default=str))
