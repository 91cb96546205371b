"""Error types that the command line turns into one clear line and a non-zero exit (defined in
``models/errors.py``, so that the models package stands alone as a checkpoint's remote code)."""
from .models.errors import ConfigError, MechEvalError, shorten_values

__all__ = ["ConfigError", "MechEvalError", "RunsFailed", "shorten_values", "some_of"]


class RunsFailed(MechEvalError):
    """Runs trained to their end but failed (diverged, or trained no step): the command line's
    exit status 1, not the 2 of bad input."""


def some_of(names: list[str], shown: int = 3) -> str:
    """The first ``shown`` names, and how many more there are: for an error that lists what it found."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
