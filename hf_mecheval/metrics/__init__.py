"""Plain metric functions: restoration, bootstrap intervals, accuracy; and the mechanism
classifier built on them. The same restoration as an ``evaluate`` module ships in
``interchange_restoration/``: ``evaluate.load(interchange_restoration_path())``."""
from pathlib import Path

from .restoration import (accuracy, bootstrap_interval, near_far, per_example_restoration, restoration,
                          summarize_restoration)


def interchange_restoration_path() -> str:
    """The folder of the ``evaluate`` module (its script and metric card), installed with the package."""
    return str(Path(__file__).resolve().parent / "interchange_restoration")


__all__ = ["accuracy", "bootstrap_interval", "interchange_restoration_path", "near_far", "per_example_restoration",
           "restoration", "summarize_restoration"]
