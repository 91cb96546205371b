"""Error types that the command line turns into one clear line and a non-zero exit (defined in
``models/errors.py``, so that the models package stands alone as a checkpoint's remote code)."""
from .models.errors import ConfigError, MechEvalError, shorten_values

__all__ = ["ConfigError", "MechEvalError", "shorten_values"]
