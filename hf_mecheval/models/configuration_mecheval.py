"""What every architecture's configuration shares: :class:`MechEvalConfig` and the checks its
subclasses run on their own fields. Each architecture's config class sits in its mixer file
(``mixer_mamba.py``: ``MechEvalMambaConfig``), beside the mixer whose settings are its fields, and is
registered with it at the end of that file (``registry.py``).

All share :class:`MechEvalConfig`'s fields (Hugging Face names: ``vocab_size``,
``hidden_size``, ``num_hidden_layers``, ``max_position_embeddings`` — 0 means no position
embedding). Each architecture adds its own fields and says, per layer, which sequence mixer it
uses (``layer_mixers``), whether blocks have an MLP and which norm blocks use; the backbone reads
only that, never the architecture's name. Values are validated on construction (``check_*``
below): errors name the field and the allowed values. Unknown keyword arguments are kept, as
Hugging Face configs do.
"""
from __future__ import annotations

import math

from transformers import PreTrainedConfig

from .errors import ConfigError

KERNEL_CHOICES = ("auto", "torch", "cuda")
INIT_SCHEMES = ("reference", "normal")
FILTER_FORMS = ("reference", "mecheval-v1")
"""Forms of Hyena's implicit filter (``filter_form``), of BaseConv's implicit long convolution
(``long_conv_form``) and of H3's SSMs (``ssm_form``): the paper's reference code's, or
hf-mecheval's first."""
FORM_FIELDS = ("filter_form", "long_conv_form", "ssm_form")
"""The config fields that choose a form (``--mixer_forms`` sets whichever an architecture has)."""


def check_int(cfg, name, minimum=None, maximum=None, allowed=None):
    """``cfg.<name>`` is an integer (not a bool) within the bounds, or one of ``allowed``."""
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, f"must be an integer, got {value!r}")
    if allowed is not None and value not in allowed:
        raise ConfigError(name, f"must be one of {', '.join(map(str, allowed))}, got {value}")
    if minimum is not None and value < minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(name, f"must be <= {maximum}, got {value}")


def check_float(cfg, name, minimum=None, exclusive=False):
    """``cfg.<name>`` is a finite number >= ``minimum`` (> where ``exclusive``)."""
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {value}")
    if minimum is not None and (value <= minimum if exclusive else value < minimum):
        raise ConfigError(name, f"must be {'>' if exclusive else '>='} {minimum}, got {value}")


def check_divides_hidden(cfg, name):
    """A positive integer that divides hidden_size (a head count or a head size)."""
    check_int(cfg, name, minimum=1)
    value = getattr(cfg, name)
    if cfg.hidden_size % value:
        raise ConfigError(name, f"must divide hidden_size ({cfg.hidden_size}), got {value}")


def check_choice(cfg, name, allowed):
    """``cfg.<name>`` is one of ``allowed``."""
    value = getattr(cfg, name)
    if value not in allowed:
        raise ConfigError(name, f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")


class MechEvalConfig(PreTrainedConfig):
    """Fields shared by every architecture."""

    model_type = "mecheval"
    vocab_size: int = 8196
    hidden_size: int = 64
    num_hidden_layers: int = 2
    max_position_embeddings: int = 0
    """Learned absolute positions (0 = none)."""
    intermediate_size: int | None = None
    """MLP width (default 4 * hidden_size); unused where the architecture has no MLP."""
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    init_scheme: str = "reference"
    """How a new model's weights are drawn. "reference": as the paper's code (its zoology fork and
    mamba-ssm) draws them: every linear weight N(0, initializer_range), biases 0, and the block's
    residual output projections (the MLP's second layer, attention's and Hyena's output) N(0,
    initializer_range / sqrt(2 * num_hidden_layers)); inside Mamba and Mamba-2 mixers PyTorch's
    nn.Linear default U(+-1/sqrt(fan_in)) instead, the output projection's then divided by
    sqrt(num_hidden_layers). Each mixer names its projections in ``reference_init``. "normal": every
    linear weight N(0, initializer_range), with no exceptions (an ablation: the rule hf-mecheval
    used before it matched the reference's)."""
    kernels: str = "auto"
    """"auto": fused CUDA kernels where CUDA and the optional packages are present, a compiled C++
    kernel on a CPU where one builds (Mamba's scan), else PyTorch; "torch": always the PyTorch
    reference; "cuda": require the CUDA kernels (error otherwise)."""
    use_cache: bool = False
    """Whether a forward returns the generation cache (``RecurrentCache``) when not told
    (``use_cache=``); ``generate()`` asks for it itself. Off by default: training and the
    interventions read every position and need no state."""
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2

    # What the backbone needs to know; architecture configs override these.
    use_mlp = True
    block_norm = "layernorm"  # or "rmsnorm"
    # Fields added after checkpoints were saved without them, with the value those checkpoints
    # were built with where it differs from today's default (``from_dict``); architecture configs
    # add their own.
    LEGACY_FIELDS = {"init_scheme": "normal"}

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """transformers' ``from_dict``, reading a saved config (it names its ``transformers_version``)
        that predates a field of ``LEGACY_FIELDS`` as what its checkpoint was built with."""
        if "transformers_version" in config_dict:
            config_dict = {**cls.LEGACY_FIELDS, **config_dict}
        return super().from_dict(config_dict, **kwargs)

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        self.validate_fields()

    @classmethod
    def field_names(cls) -> list[str]:
        """This architecture's own configuration fields (shared ones first)."""
        names: list[str] = []
        for klass in reversed(cls.__mro__):
            if isinstance(klass, type) and issubclass(klass, MechEvalConfig):
                names += [n for n in vars(klass).get("__annotations__", {}) if n not in names]
        return names

    def validate_fields(self) -> None:
        check_int(self, "vocab_size", minimum=1)
        check_int(self, "hidden_size", minimum=1)
        check_int(self, "num_hidden_layers", minimum=1)
        check_int(self, "max_position_embeddings", minimum=0)
        check_int(self, "intermediate_size", minimum=1)
        check_float(self, "layer_norm_eps", minimum=0, exclusive=True)
        check_float(self, "initializer_range", minimum=0)
        check_choice(self, "init_scheme", INIT_SCHEMES)
        check_choice(self, "kernels", KERNEL_CHOICES)

    def layer_mixers(self) -> list[str]:
        """Name of the sequence mixer of each layer (as registered: ``MIXERS`` in ``registry.py``)."""
        raise NotImplementedError
