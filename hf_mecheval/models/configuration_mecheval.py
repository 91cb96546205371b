"""Configurations of the built-in architectures (each registered, with its mixers, at the end of its
mixer file: ``registry.py``).

All share :class:`MechEvalConfig`'s fields (Hugging Face names: ``vocab_size``,
``hidden_size``, ``num_hidden_layers``, ``max_position_embeddings`` — 0 means no position
embedding). Each architecture adds its own fields and says, per layer, which sequence mixer it
uses (``layer_mixers``), whether blocks have an MLP and which norm blocks use; the backbone reads
only that, never the architecture's name. Values are validated on construction: errors name the
field and the allowed values. Unknown keyword arguments are kept, as Hugging Face configs do.
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
LONG_FILTER_ORDER = {"reference": 16, "mecheval-v1": 64}
"""Each long-convolution form's default MLP width (``long_filter_order``)."""


def _default_long_filter_order(cfg) -> None:
    if cfg.long_filter_order is None:
        cfg.long_filter_order = LONG_FILTER_ORDER.get(cfg.long_conv_form, LONG_FILTER_ORDER["reference"])


def _int(cfg, name, minimum=None, maximum=None, allowed=None):
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, f"must be an integer, got {value!r}")
    if allowed is not None and value not in allowed:
        raise ConfigError(name, f"must be one of {', '.join(map(str, allowed))}, got {value}")
    if minimum is not None and value < minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(name, f"must be <= {maximum}, got {value}")


def _float(cfg, name, minimum=None, exclusive=False):
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {value}")
    if minimum is not None and (value <= minimum if exclusive else value < minimum):
        raise ConfigError(name, f"must be {'>' if exclusive else '>='} {minimum}, got {value}")


def _divides_hidden(cfg, name):
    """A positive integer that divides hidden_size (a head count or a head size)."""
    _int(cfg, name, minimum=1)
    value = getattr(cfg, name)
    if cfg.hidden_size % value:
        raise ConfigError(name, f"must divide hidden_size ({cfg.hidden_size}), got {value}")


def _choice(cfg, name, allowed):
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
        _int(self, "vocab_size", minimum=1)
        _int(self, "hidden_size", minimum=1)
        _int(self, "num_hidden_layers", minimum=1)
        _int(self, "max_position_embeddings", minimum=0)
        _int(self, "intermediate_size", minimum=1)
        _float(self, "layer_norm_eps", minimum=0, exclusive=True)
        _float(self, "initializer_range", minimum=0)
        _choice(self, "init_scheme", INIT_SCHEMES)
        _choice(self, "kernels", KERNEL_CHOICES)

    def layer_mixers(self) -> list[str]:
        """Name of the sequence mixer of each layer (as registered: ``MIXERS`` in ``registry.py``)."""
        raise NotImplementedError


class MechEvalTransformerConfig(MechEvalConfig):
    """Causal softmax attention; fused QKV without bias, output projection with bias."""

    model_type = "mecheval-transformer"
    max_position_embeddings: int = 1024
    num_attention_heads: int = 1

    def validate_fields(self) -> None:
        super().validate_fields()
        _divides_hidden(self, "num_attention_heads")

    def layer_mixers(self) -> list[str]:
        return ["attention"] * self.num_hidden_layers


class MechEvalBasedConfig(MechEvalConfig):
    """Alternating layers: even layers BaseConv (short conv of ``short_conv_kernel``, or an implicit
    long convolution when it is ``"long"``), odd layers Based linear attention (2nd-order Taylor
    feature map)."""

    model_type = "mecheval-based"
    short_conv_kernel: int | str = 3
    feature_dim: int = 8
    num_attention_heads: int = 1
    long_conv_form: str = "reference"
    """Form of the implicit long convolution (``short_conv_kernel`` "long"): "reference" = the
    reference's: h ∗ u + u with h an MLP Linear - ReLU - Linear over fixed positional features;
    "mecheval-v1" = hf-mecheval's first: h ∗ u + a trainable bias, h a sine MLP (the checkpoints
    made before this field existed). See ``mixer_base_conv.py``."""
    long_filter_order: int | None = None
    """Width of the MLP that parameterises implicit long filters; default: the form's
    (``LONG_FILTER_ORDER``: 16 for "reference", as the reference; 64 for "mecheval-v1")."""
    max_filter_length: int = 1024
    """Longest sequence an implicit long filter is defined for."""

    LEGACY_FIELDS = {**MechEvalConfig.LEGACY_FIELDS, "long_conv_form": "mecheval-v1"}

    def __post_init__(self, **kwargs):
        _default_long_filter_order(self)
        super().__post_init__(**kwargs)

    def validate_fields(self) -> None:
        super().validate_fields()
        if self.short_conv_kernel != "long":
            _int(self, "short_conv_kernel", allowed=(1, 2, 3, 4, 5, 6, 7, 8))
        _int(self, "feature_dim", minimum=1)
        _choice(self, "long_conv_form", FILTER_FORMS)
        _int(self, "long_filter_order", minimum=1)
        _int(self, "max_filter_length", minimum=2)
        _divides_hidden(self, "num_attention_heads")

    def layer_mixers(self) -> list[str]:
        return ["base_conv" if i % 2 == 0 else "based" for i in range(self.num_hidden_layers)]

    def conv_kernel_for_layer(self, layer: int) -> int | str:
        return self.short_conv_kernel


class MechEvalBaseConvConfig(MechEvalConfig):
    """``y = conv(u) * Linear(u) + u``; per-layer kernels cycle through ``kernel_schedule``
    (an int = short causal depthwise conv of that width, "long" = implicit long convolution)."""

    model_type = "mecheval-baseconv"
    kernel_schedule: list = None
    long_conv_form: str = "reference"
    """Form of the "long" layers' implicit long convolution: "reference" = the reference's
    (``ImplicitLongConvolution``): h ∗ u + u with h an MLP Linear - ReLU - Linear over fixed
    positional features; "mecheval-v1" = hf-mecheval's first: h ∗ u + a trainable bias, h a sine
    MLP (the checkpoints made before this field existed). See ``mixer_base_conv.py``."""
    long_filter_order: int | None = None
    """Width of the MLP that parameterises implicit long filters; default: the form's
    (``LONG_FILTER_ORDER``: 16 for "reference", as the reference; 64 for "mecheval-v1")."""
    max_filter_length: int = 1024
    """Longest sequence an implicit long filter is defined for."""

    LEGACY_FIELDS = {**MechEvalConfig.LEGACY_FIELDS, "long_conv_form": "mecheval-v1"}

    def __post_init__(self, **kwargs):
        if self.kernel_schedule is None:
            self.kernel_schedule = [3, "long"]
        _default_long_filter_order(self)
        super().__post_init__(**kwargs)

    def validate_fields(self) -> None:
        super().validate_fields()
        if not isinstance(self.kernel_schedule, (list, tuple)) or not self.kernel_schedule:
            raise ConfigError("kernel_schedule", f"must be a non-empty list of widths or 'long', got {self.kernel_schedule!r}")
        for k in self.kernel_schedule:
            if k != "long" and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
                raise ConfigError("kernel_schedule", f"entries must be widths >= 1 or 'long', got {k!r}")
        _choice(self, "long_conv_form", FILTER_FORMS)
        _int(self, "long_filter_order", minimum=1)
        _int(self, "max_filter_length", minimum=2)

    def layer_mixers(self) -> list[str]:
        return ["base_conv"] * self.num_hidden_layers

    def conv_kernel_for_layer(self, layer: int) -> int | str:
        return self.kernel_schedule[layer % len(self.kernel_schedule)]


class MechEvalH3Config(MechEvalConfig):
    """H3: shift SSM on K, diagonal SSM on K·V (per head, head_dim x head_dim), Q gating."""

    model_type = "mecheval-h3"
    d_state: int = 1024
    """State size N of the diagonal SSM (in the "reference" form N/2 complex modes, as the
    reference's S4D kernel) and length of the shift SSM's register."""
    head_dim: int = 2
    ssm_form: str = "reference"
    """Form of the two SSMs. "reference" = the paper's reference code's (its zoology fork's ``H3``
    with empty ``kernel_args``): a shift SSM with trainable B and C plus its own skip ``ssm_k_D``
    on K; an S4D-Lin diagonal SSM (complex, A = -1/2 + iπn, N/2 modes, bilinear discretisation)
    and a skip D per head, shared by the head's head_dim x head_dim outer-product channels.
    "mecheval-v1" = hf-mecheval's first: the shift SSM as a short convolution of width d_state
    (no separate skip), a real S4D diagonal SSM (A = -(n+1), zero-order hold) and a skip per model
    channel (the checkpoints made before this field existed). See ``mixer_h3.py``."""

    LEGACY_FIELDS = {**MechEvalConfig.LEGACY_FIELDS, "ssm_form": "mecheval-v1"}

    def validate_fields(self) -> None:
        super().validate_fields()
        _int(self, "d_state", minimum=1)
        _divides_hidden(self, "head_dim")
        _choice(self, "ssm_form", FILTER_FORMS)
        if self.ssm_form == "reference" and self.d_state < 2:
            raise ConfigError("d_state", f"must be >= 2 in the reference form (d_state / 2 complex modes), "
                                         f"got {self.d_state}")

    def layer_mixers(self) -> list[str]:
        return ["h3" if self.ssm_form == "reference" else "h3_v1"] * self.num_hidden_layers


class MechEvalHyenaConfig(MechEvalConfig):
    """Order-2 Hyena: short depthwise conv on a 3d in-projection, implicit long filter (positional
    MLP with sine activations, exponential decay), FFT convolution."""

    model_type = "mecheval-hyena"
    short_conv_kernel: int = 3
    filter_form: str = "reference"
    """Form of the implicit filter and long convolution. "reference" = the paper's reference code's:
    no skip term (h ∗ v), an MLP with two inner layers and one shared sine frequency over
    trainable positional features, decay slowest in channel 0; "mecheval-v1" = hf-mecheval's
    first: a trainable skip (h ∗ v + bias * v), one inner layer, two sine frequencies, fixed
    features, decay fastest in channel 0 (the checkpoints made before this field existed). See
    ``mixer_hyena.py``."""
    filter_order: int = 64
    """Width of the filter's MLP."""
    filter_emb_dim: int = 3
    """Positional features the filter's MLP reads: the time and (emb_dim - 1) / 2 sine/cosine pairs."""
    filter_sine_freq: float = 1.0
    """Initial frequency of the filter's sine activations."""
    max_filter_length: int = 1024
    """Longest sequence the implicit filter is defined for."""

    LEGACY_FIELDS = {**MechEvalConfig.LEGACY_FIELDS, "filter_form": "mecheval-v1"}

    def validate_fields(self) -> None:
        super().validate_fields()
        _int(self, "short_conv_kernel", minimum=1)
        _choice(self, "filter_form", FILTER_FORMS)
        _int(self, "filter_order", minimum=1)
        _int(self, "filter_emb_dim", minimum=3)
        if self.filter_emb_dim % 2 == 0:
            raise ConfigError("filter_emb_dim", f"must be odd (time + sin/cos pairs), got {self.filter_emb_dim}")
        _float(self, "filter_sine_freq", minimum=0, exclusive=True)
        _int(self, "max_filter_length", minimum=2)

    def layer_mixers(self) -> list[str]:
        return ["hyena"] * self.num_hidden_layers


class MechEvalMambaConfig(MechEvalConfig):
    """Selective SSM (Mamba-1) blocks with RMSNorm and no MLP."""

    model_type = "mecheval-mamba"
    d_state: int = 16
    expand: int = 2
    conv_kernel: int = 4
    """Width of the depthwise causal short convolution; 0 = no convolution at all."""
    dt_rank: int | str = "auto"
    """Rank of the dt projection; "auto" = ceil(hidden_size / 16)."""
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4

    use_mlp = False
    block_norm = "rmsnorm"

    def validate_fields(self) -> None:
        super().validate_fields()
        _int(self, "d_state", minimum=1)
        _int(self, "expand", minimum=1)
        _int(self, "conv_kernel", minimum=0, maximum=16)
        if self.dt_rank != "auto":
            _int(self, "dt_rank", minimum=1)
        _float(self, "dt_min", minimum=0, exclusive=True)
        _float(self, "dt_max", minimum=self.dt_min)
        _float(self, "dt_init_floor", minimum=0)
        if self.kernels == "cuda" and self.conv_kernel not in (0, 2, 3, 4):
            raise ConfigError("conv_kernel", f"the CUDA path (causal-conv1d) runs widths 2, 3, 4 (or 0 = none), "
                                             f"got {self.conv_kernel}; use kernels='torch' or 'auto'")

    @property
    def intermediate_ssm_size(self) -> int:
        return self.expand * self.hidden_size

    @property
    def time_step_rank(self) -> int:
        return math.ceil(self.hidden_size / 16) if self.dt_rank == "auto" else self.dt_rank

    def layer_mixers(self) -> list[str]:
        return ["mamba"] * self.num_hidden_layers


class MechEvalDeltaNetConfig(MechEvalConfig):
    """Delta-rule linear attention with short convolutions on q, k, v (flash-linear-attention's
    DeltaNet: SiLU + L2-normalised q/k, sigmoid beta, per-head RMSNorm on the output, no biases)."""

    model_type = "mecheval-deltanet"
    num_attention_heads: int = 1
    use_short_conv: bool = True
    conv_kernel: int = 4
    chunk_size: int = 64

    def validate_fields(self) -> None:
        super().validate_fields()
        _divides_hidden(self, "num_attention_heads")
        if not isinstance(self.use_short_conv, bool):
            raise ConfigError("use_short_conv", f"must be true or false, got {self.use_short_conv!r}")
        _int(self, "conv_kernel", minimum=1)
        _int(self, "chunk_size", minimum=1)

    def layer_mixers(self) -> list[str]:
        return ["delta_net"] * self.num_hidden_layers


class MechEvalMamba2Config(MechEvalConfig):
    """Mamba-2 (SSD) blocks with RMSNorm and no MLP, as Mamba: a selective SSM whose decay is one
    scalar per head and step (mamba-ssm's Mamba2 defaults, head size and state scaled to these
    widths; see ``mixer_mamba2.py``)."""

    model_type = "mecheval-mamba2"
    d_state: int = 64
    """State size N per head (mamba-ssm: 128)."""
    expand: int = 2
    head_dim: int = 16
    """Channels per SSM head (mamba-ssm: 64); heads = expand * hidden_size / head_dim."""
    n_groups: int = 1
    """Groups of heads that share B and C (and a norm group)."""
    conv_kernel: int = 4
    """Width of the depthwise causal short convolution on [x, B, C]; 0 = no convolution at all."""
    chunk_size: int = 64
    """Steps per chunk of the chunked SSD (the PyTorch path); does not change the result."""
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4

    use_mlp = False
    block_norm = "rmsnorm"

    def validate_fields(self) -> None:
        super().validate_fields()
        _int(self, "d_state", minimum=1)
        _int(self, "expand", minimum=1)
        _int(self, "head_dim", minimum=1)
        if self.intermediate_ssm_size % self.head_dim:
            raise ConfigError("head_dim", f"must divide expand * hidden_size ({self.intermediate_ssm_size}), "
                                          f"got {self.head_dim}")
        _int(self, "n_groups", minimum=1)
        if self.num_ssm_heads % self.n_groups:
            raise ConfigError("n_groups", f"must divide the number of heads ({self.num_ssm_heads}), got {self.n_groups}")
        _int(self, "conv_kernel", minimum=0, maximum=16)
        _int(self, "chunk_size", minimum=1)
        _float(self, "dt_min", minimum=0, exclusive=True)
        _float(self, "dt_max", minimum=self.dt_min)
        _float(self, "dt_init_floor", minimum=0, exclusive=True)

    @property
    def intermediate_ssm_size(self) -> int:
        return self.expand * self.hidden_size

    @property
    def num_ssm_heads(self) -> int:
        return self.intermediate_ssm_size // self.head_dim

    def layer_mixers(self) -> list[str]:
        return ["mamba2"] * self.num_hidden_layers


class MechEvalGatedDeltaNetConfig(MechEvalConfig):
    """Gated delta-rule linear attention (flash-linear-attention's GatedDeltaNet: short convolutions
    + SiLU on q, k, v, L2-normalised q/k, sigmoid beta, Mamba-2-style decay, output gate with a
    per-head gated RMSNorm, no biases), in blocks with an MLP, like DeltaNet (LayerNorm, the shared
    GELU MLP; fla's own model uses RMSNorm and a SwiGLU MLP). By default one head with
    dk = dv = hidden_size: DeltaNet's state, so that the two differ by the gates."""

    model_type = "mecheval-gated-deltanet"
    num_attention_heads: int = 1
    head_dim: int | None = None
    """Query/key size per head; None = hidden_size / num_attention_heads."""
    expand_v: int = 1
    """Value size per head = expand_v * head_dim. flash-linear-attention uses 2 (and several
    heads): set expand_v=2 for its layout; the default 1 keeps the step time within 3x of the
    Transformer's at hidden 64 on a CPU (see ``mixer_gated_delta_net.py``)."""
    use_short_conv: bool = True
    conv_kernel: int = 4
    chunk_size: int = 64
    """Steps per chunk of the chunked delta rule (the PyTorch path); does not change the result."""

    def validate_fields(self) -> None:
        super().validate_fields()
        if self.head_dim is None:
            _divides_hidden(self, "num_attention_heads")
        else:
            _int(self, "num_attention_heads", minimum=1)
            _int(self, "head_dim", minimum=1)
        _int(self, "expand_v", minimum=1)
        if not isinstance(self.use_short_conv, bool):
            raise ConfigError("use_short_conv", f"must be true or false, got {self.use_short_conv!r}")
        _int(self, "conv_kernel", minimum=1)
        _int(self, "chunk_size", minimum=1)

    @property
    def key_head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads if self.head_dim is None else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.expand_v * self.key_head_dim

    def layer_mixers(self) -> list[str]:
        return ["gated_delta_net"] * self.num_hidden_layers

