"""Experiments as data: the quickstart's plan (``quickstart.yaml``) and the paper's own figures
(``paper.yaml``), beside the sweep files (``training/sweeps/``). The code that runs or reports an
experiment reads its file here; what an experiment is — its setting, models, rates, epochs, the
figures it is compared with — lives in the file, with the reasons for each choice.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence


from ..errors import ConfigError, MechEvalError
from ..inputs import load_yaml, refuse_non_finite

EXPERIMENTS_DIR = Path(__file__).resolve().parent       # package data: in the wheel too


def read_experiment(name: str, keys: Sequence[str]) -> dict:
    """The experiment file ``<name>.yaml``: a mapping with exactly ``keys`` (a key missing or
    unknown is one error naming it and the file)."""
    path = EXPERIMENTS_DIR / f"{name}.yaml"
    try:
        values = load_yaml(path.read_text(), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise MechEvalError(f"cannot read the experiment file {path}: {(str(exc).splitlines() or [''])[0]}") from None
    if not isinstance(values, dict):
        raise ConfigError(name, f"{path} must be a mapping with the keys {', '.join(keys)}")
    refuse_non_finite(values, str(path))
    for key in sorted(set(values) ^ set(keys)):
        raise ConfigError(key, f"{'unknown key' if key in values else 'missing'} in {path}; its keys: {', '.join(keys)}")
    return values
