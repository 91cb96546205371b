"""``datasets`` builders for the task presets, shipped inside the package (datasets >= 4 no
longer runs loading scripts).

    from hf_mecheval.tasks.builders import ATRBuilder            # ARBuilder, MQARBuilder likewise
    builder = ATRBuilder(config_name="atr_easy", train_size=10_000, seed=1)
    builder.download_and_prepare()
    ds = builder.as_dataset()            # DatasetDict: train / validation / test

For training, :meth:`Task.dataset` builds a split straight from Arrow (no per-example Python);
for the Hub, :mod:`.publish` writes parquet folders that ``load_dataset`` reads.
"""
from __future__ import annotations

import dataclasses

import datasets

from .base import GENERATOR_VERSION
from .presets import PRESETS, build_task


@dataclasses.dataclass
class TaskBuilderConfig(datasets.BuilderConfig):
    """One preset. ``train_size``/``eval_size`` default to the reference sizes; ``grammar_seed``
    (ATR) selects another language."""

    train_size: int | None = None
    eval_size: int | None = None
    seed: int = 0
    grammar_seed: int | None = None


class _TaskBuilder(datasets.GeneratorBasedBuilder):
    TASK: str = ""
    BUILDER_CONFIG_CLASS = TaskBuilderConfig

    def _task(self):
        overrides = {} if self.config.grammar_seed is None else {"grammar_seed": self.config.grammar_seed}
        return build_task(self.config.name, **overrides)

    def _info(self) -> datasets.DatasetInfo:
        task = self._task()
        preset = PRESETS[self.config.name]
        return datasets.DatasetInfo(
            description=f"{preset.description} Generator {GENERATOR_VERSION}; config {task.config.to_dict()}.",
            features=task.features(),
        )

    def _split_generators(self, dl_manager):
        preset = PRESETS[self.config.name]
        train = preset.train_size if self.config.train_size is None else self.config.train_size
        evaluation = preset.eval_size if self.config.eval_size is None else self.config.eval_size
        return [
            datasets.SplitGenerator(name=name, gen_kwargs={"split": split, "n": n})
            for name, split, n in [
                (datasets.Split.TRAIN, "train", train),
                (datasets.Split.VALIDATION, "validation", evaluation),
                (datasets.Split.TEST, "test", evaluation),
            ]
        ]

    def _generate_examples(self, split: str, n: int):
        yield from enumerate(self._task().generate(n, split, self.config.seed))


def _configs(task: str) -> list[TaskBuilderConfig]:
    return [
        TaskBuilderConfig(name=p.name, version=datasets.Version(GENERATOR_VERSION + ".0"), description=p.description)
        for p in PRESETS.values()
        if p.task == task
    ]


class ARBuilder(_TaskBuilder):
    """Associative recall presets (``ar_32``, ``ar_32_value_first``, ``ar_32_gen``)."""

    TASK = "ar"
    BUILDER_CONFIGS = _configs("ar")
    DEFAULT_CONFIG_NAME = "ar_32"


class ATRBuilder(_TaskBuilder):
    """Associative treecall presets (``atr_easy``, ``atr_medium``, ``atr_8192``, ``atr_gen``, ``atr_sibling``)."""

    TASK = "atr"
    BUILDER_CONFIGS = _configs("atr")
    DEFAULT_CONFIG_NAME = "atr_easy"


class MQARBuilder(_TaskBuilder):
    """Multi-query associative recall presets (``mqar``: Zoology's standard mixtures, ``mqar_cpu``,
    and Zoology's Figure 2 settings ``mqar_64_4``, ``mqar_128_8``, ``mqar_256_16``)."""

    TASK = "mqar"
    BUILDER_CONFIGS = _configs("mqar")
    DEFAULT_CONFIG_NAME = "mqar_cpu"
