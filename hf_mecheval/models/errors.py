"""Error types that the command line turns into one clear line and a non-zero exit.

They live in the models package so that it is self-contained: a checkpoint ships these files as
its remote code (``modeling_mecheval.remote_code_files``). The rest of hf-mecheval imports them from ``hf_mecheval.errors``.
"""


_LONG = 200


def shorten_values(text: str) -> str:
    """``text`` with every run of more than 200 characters without a space or quote (a huge value
    a user gave, echoed back) cut to its first 60 and its length: an error stays one readable line."""
    out, run = [], []

    def flush():
        word = "".join(run)
        out.append(f"{word[:60]}... ({len(word):,} characters)" if len(word) > _LONG else word)
        run.clear()

    for char in text:
        if char.isspace() or char in "'\"":
            flush()
            out.append(char)
        else:
            run.append(char)
    flush()
    return "".join(out)


class MechEvalError(Exception):
    """Base class for every error hf-mecheval raises on bad user input. The message is one line
    with huge echoed values shortened (``shorten_values``)."""

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str):
            args = (shorten_values(args[0]),)
        super().__init__(*args)


class ConfigError(MechEvalError, ValueError):
    """A configuration value is invalid; the message names the field and what is allowed."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
