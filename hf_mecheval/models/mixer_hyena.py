"""Order-2 Hyena operator (Poli et al. 2023, "Hyena Hierarchy").

    x0, x1, v = split(short_conv(in_proj(x)))        each (B, L, D)
    v = v * x1                                        first gate
    y = long_conv(v, h)                               h: implicit filter as long as the sequence
    out = out_proj(y * x0)                            second gate

Two forms, chosen by the config's ``filter_form``:

* "reference" (the default): as the paper's reference code (its zoology fork's ``Hyena``). The long
  convolution has no skip term, y = h ∗ v, and h (D, L) comes from :class:`HyenaFilter`: an MLP
  with three sine activations (one shared trainable frequency) over trainable positional features,
  times a fixed exponential decay window (channel 0 slowest).
* "mecheval-v1": hf-mecheval's first Hyena, kept so that its checkpoints load and compute as
  before: y = h ∗ v + bias * v with a trainable per-channel skip ``bias``, and h from
  :class:`ImplicitFilter` (two sine activations with their own frequencies over fixed features,
  decay window with channel 0 fastest).

The recurrent form keeps the short conv's window and the whole history of gated v: the filter is
as long as the sequence, so each step convolves the history. Padding is zeroed where it enters
each convolution: the short conv's input (in_proj has a bias) and the gated v (the short conv's
bias makes it non-zero at padded positions).
"""
from __future__ import annotations

import torch
from torch import nn

from .convolutions import HyenaFilter, ImplicitFilter, ShortConv
from .mixers import zero_padding
from .ops_long_conv import causal_conv
from .recurrent_cache import RecurrentStateLayer
from .sites import Site
from .errors import ConfigError
from .configuration_mecheval import MechEvalConfig, FILTER_FORMS, check_choice, check_float, check_int
from .registry import ArchitectureSpec, register_architecture


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
    the module's docstring."""
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
        check_int(self, "short_conv_kernel", minimum=1)
        check_choice(self, "filter_form", FILTER_FORMS)
        check_int(self, "filter_order", minimum=1)
        check_int(self, "filter_emb_dim", minimum=3)
        if self.filter_emb_dim % 2 == 0:
            raise ConfigError("filter_emb_dim", f"must be odd (time + sin/cos pairs), got {self.filter_emb_dim}")
        check_float(self, "filter_sine_freq", minimum=0, exclusive=True)
        check_int(self, "max_filter_length", minimum=2)

    def layer_mixers(self) -> list[str]:
        return ["hyena"] * self.num_hidden_layers


class HyenaOperator(nn.Module):
    reference_init = {"out_proj": "residual"}      # the reference's Hyena.out_proj (modeling_mecheval.reference_linear_init)

    def __init__(self, config, layer_idx: int):
        super().__init__()
        D = config.hidden_size
        self.layer_idx = layer_idx
        self.hidden_size = D
        self.filter_form = config.filter_form
        self.kernels = config.kernels                          # the direct long convolution's path (ops_long_conv)
        self.in_proj = nn.Linear(D, 3 * D)
        self.short_conv = ShortConv(3 * D, config.short_conv_kernel, kernels=config.kernels)
        if self.filter_form == "reference":
            self.filter = HyenaFilter(D, config.max_filter_length, order=config.filter_order,
                                      emb_dim=config.filter_emb_dim, sine_freq=config.filter_sine_freq)
            self.bias = None                                 # no skip term in the long conv
        else:                                                # "mecheval-v1": built in the same order as ever
            self.filter = ImplicitFilter(D, config.max_filter_length, order=config.filter_order,
                                         emb_dim=config.filter_emb_dim, sine_freq=config.filter_sine_freq,
                                         decay=True)
            self.bias = nn.Parameter(torch.randn(D))          # skip term of the long conv, per channel
        self.out_proj = nn.Linear(D, D)
        self.conv_output = Site("short-conv output, (batch, length, 3 * hidden) = (x0, x1, v)")

    def _skip(self, v: torch.Tensor) -> torch.Tensor | float:
        # the long conv's skip term: bias * v in the v1 form, none in the reference form
        return 0.0 if self.bias is None else self.bias * v

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_with_state(x, mask)[0]

    def forward_with_state(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """forward(x, mask) and the state ``step`` continues from: (short-conv window (B, K-1, 3D),
        gated-v history (B, L, D))."""
        L = x.shape[1]
        conv_in = zero_padding(self.in_proj(x), mask)            # (B, L, 3D)
        z = self.conv_output(self.short_conv(conv_in))
        x0, x1, v = z.chunk(3, dim=-1)                           # (B, L, D) each
        v = zero_padding(v * x1, mask)
        y = causal_conv(v, self.filter(L), kernels=self.kernels) + self._skip(v)   # filter: (D, L)
        return self.out_proj(y * x0), (self.short_conv.state_after(conv_in), v)

    def step(self, x_t: torch.Tensor, state=None, mask: torch.Tensor | None = None):
        """x_t: (B, D). state = (short-conv window (B, K-1, 3D), gated-v history (B, t, D)) or None."""
        window, history = (None, None) if state is None else state
        z, window = self.short_conv.step(zero_padding(self.in_proj(x_t), mask), window)  # (B, 3D)
        x0, x1, v = z.chunk(3, dim=-1)
        v = zero_padding(v * x1, mask)                                 # (B, D)
        history = v[:, None] if history is None else torch.cat([history, v[:, None]], dim=1)  # (B, t+1, D)
        t = history.shape[1]
        h = self.filter(t).flip(-1)                                    # (D, t): column s = tap for lag t-1-s
        y = torch.einsum("bsd,ds->bd", history, h) + self._skip(v)
        return self.out_proj(y * x0), (window, history)

    # the step state in the generation cache (recurrent_cache.py): the short conv's window as
    # transformers' conv state; the gated-v history, which the filter as long as the sequence
    # reads whole, has no transformers counterpart (the layer's input_history)
    cache_layer_class = RecurrentStateLayer

    def state_to_cache(self, state, layer: RecurrentStateLayer) -> None:
        layer.store(window=state[0], history=state[1])

    def state_from_cache(self, layer: RecurrentStateLayer):
        return layer.window, layer.input_history


register_architecture(ArchitectureSpec(
    name="hyena", config_class=MechEvalHyenaConfig, mixers={"hyena": HyenaOperator}, class_stem="Hyena",
    tiny_config={"filter_order": 8, "max_filter_length": 16},
    test_variants=({"filter_form": "mecheval-v1"},)))
