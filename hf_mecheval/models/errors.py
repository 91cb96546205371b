"""Error types that the command line turns into one clear line and a non-zero exit.

They live in the models package so that it is self-contained: a checkpoint ships these files as
its remote code (``remote_code.py``). The rest of hf-mecheval imports them from ``hf_mecheval.errors``.
"""


class MechEvalError(Exception):
    """Base class for every error hf-mecheval raises on bad user input."""


class ConfigError(MechEvalError, ValueError):
    """A configuration value is invalid; the message names the field and what is allowed."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
