"""Error types that the command line turns into one clear line and a non-zero exit."""


class MechEvalError(Exception):
    """Base class for every error hf-mecheval raises on bad user input."""


class ConfigError(MechEvalError, ValueError):
    """A configuration value is invalid; the message names the field and what is allowed."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
