"""BaseConv (Arora et al. 2023, "Zoology"): ``y = conv(u) * Linear(u) + u``.

The convolution is a short causal depthwise convolution of width k, or, when the layer's kernel is
``"long"``, an implicit long convolution (computed by ``causal_conv``) in one of two forms, chosen
by the config's ``long_conv_form``:

* "reference" (the default): the reference's ``ImplicitLongConvolution``
  (:class:`ImplicitLongConv`): conv(u) = h ∗ u + u, with h = MLP(z)^T, an MLP Linear - ReLU -
  Linear of width ``long_filter_order`` over fixed positional features z, no decay window;
* "mecheval-v1": hf-mecheval's first long layer, kept so that its checkpoints load and compute as
  before: conv(u) = h ∗ u + conv_bias, h from :class:`ImplicitFilter` (sine MLP of width
  ``long_filter_order``, no decay window) and a trainable per-channel ``conv_bias``."""
from __future__ import annotations

import torch
from torch import nn

from .convolutions import ImplicitFilter, ImplicitLongConv, ShortConv
from .mixers import zero_padding
from .ops_long_conv import causal_conv
from .recurrent_cache import RecurrentStateLayer
from .sites import Site
from .errors import ConfigError
from .configuration_mecheval import MechEvalConfig, FILTER_FORMS, check_choice, check_int
from .registry import ArchitectureSpec, register_architecture


LONG_FILTER_ORDER = {"reference": 16, "mecheval-v1": 64}
"""Each long-convolution form's default MLP width (``long_filter_order``; Based's "long" layers too)."""


def default_long_filter_order(cfg) -> None:
    """Fill ``cfg.long_filter_order`` (None) with its long-convolution form's default width."""
    if cfg.long_filter_order is None:
        cfg.long_filter_order = LONG_FILTER_ORDER.get(cfg.long_conv_form, LONG_FILTER_ORDER["reference"])


class MechEvalBaseConvConfig(MechEvalConfig):
    """``y = conv(u) * Linear(u) + u``; per-layer kernels cycle through ``kernel_schedule``
    (an int = short causal depthwise conv of that width, "long" = implicit long convolution)."""

    model_type = "mecheval-baseconv"
    kernel_schedule: list = None
    long_conv_form: str = "reference"
    """Form of the "long" layers' implicit long convolution: "reference" = the reference's
    (``ImplicitLongConvolution``): h ∗ u + u with h an MLP Linear - ReLU - Linear over fixed
    positional features; "mecheval-v1" = hf-mecheval's first: h ∗ u + a trainable bias, h a sine
    MLP (the checkpoints made before this field existed). See the module's docstring."""
    long_filter_order: int | None = None
    """Width of the MLP that parameterises implicit long filters; default: the form's
    (``LONG_FILTER_ORDER``: 16 for "reference", as the reference; 64 for "mecheval-v1")."""
    max_filter_length: int = 1024
    """Longest sequence an implicit long filter is defined for."""

    LEGACY_FIELDS = {**MechEvalConfig.LEGACY_FIELDS, "long_conv_form": "mecheval-v1"}

    def __post_init__(self, **kwargs):
        if self.kernel_schedule is None:
            self.kernel_schedule = [3, "long"]
        default_long_filter_order(self)
        super().__post_init__(**kwargs)

    def validate_fields(self) -> None:
        super().validate_fields()
        if not isinstance(self.kernel_schedule, (list, tuple)) or not self.kernel_schedule:
            raise ConfigError("kernel_schedule", f"must be a non-empty list of widths or 'long', got {self.kernel_schedule!r}")
        for k in self.kernel_schedule:
            if k != "long" and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
                raise ConfigError("kernel_schedule", f"entries must be widths >= 1 or 'long', got {k!r}")
        check_choice(self, "long_conv_form", FILTER_FORMS)
        check_int(self, "long_filter_order", minimum=1)
        check_int(self, "max_filter_length", minimum=2)

    def layer_mixers(self) -> list[str]:
        return ["baseconv"] * self.num_hidden_layers

    def conv_kernel_for_layer(self, layer: int) -> int | str:
        return self.kernel_schedule[layer % len(self.kernel_schedule)]


class BaseConv(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        D = config.hidden_size
        kernel = config.conv_kernel_for_layer(layer_idx)
        self.projection = nn.Linear(D, D, bias=True)
        # the v1 long layer keeps its own filter and bias; every other convolution is ``self.conv``
        self.long_v1 = kernel == "long" and config.long_conv_form == "mecheval-v1"
        if self.long_v1:
            self.filter = ImplicitFilter(D, config.max_filter_length, order=config.long_filter_order, decay=False)
            self.conv_bias = nn.Parameter(torch.zeros(D))
        elif kernel == "long":
            self.conv = ImplicitLongConv(D, config.max_filter_length, hidden=config.long_filter_order,
                                         kernels=config.kernels)
        else:
            self.conv = ShortConv(D, kernel, bias=True, kernels=config.kernels)
        self.kernels = config.kernels
        self.conv_output = Site("convolution output, (batch, length, hidden)")

    def _conv(self, u: torch.Tensor) -> torch.Tensor:
        if self.long_v1:
            return causal_conv(u, self.filter(u.shape[1]), kernels=self.kernels) + self.conv_bias
        return self.conv(u)

    def forward(self, u: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # u: (B, L, D); the convolution is all that mixes along the sequence
        return self.conv_output(self._conv(zero_padding(u, mask))) * self.projection(u) + u

    def forward_with_state(self, u: torch.Tensor, mask: torch.Tensor | None = None):
        """forward(u, mask) and the state ``step`` continues from: the convolution's window, or
        every input of a long convolution."""
        conv_in = zero_padding(u, mask)
        state = conv_in if self.long_v1 else self.conv.state_after(conv_in)
        return self.conv_output(self._conv(conv_in)) * self.projection(u) + u, state

    def step(self, u_t: torch.Tensor, state, mask: torch.Tensor | None = None):
        """state: short conv -> its input window; long conv -> all inputs so far (B, t, D)."""
        conv_in = zero_padding(u_t, mask)
        if self.long_v1:
            history = conv_in[:, None] if state is None else torch.cat([state, conv_in[:, None]], dim=1)
            kernel = self.filter(history.shape[1]).flip(-1)                # (D, t): tap for each past step
            c = (history * kernel.T).sum(1) + self.conv_bias
            state = history
        else:
            c, state = self.conv.step(conv_in, state)                      # ShortConv or ImplicitLongConv
        return c * self.projection(u_t) + u_t, state

    # the step state in the generation cache (recurrent_cache.py): a short convolution's window as
    # transformers' conv state; a long convolution's input history has no transformers
    # counterpart (the layer's input_history)
    cache_layer_class = RecurrentStateLayer

    @property
    def _long(self) -> bool:
        return self.long_v1 or isinstance(self.conv, ImplicitLongConv)

    def state_to_cache(self, state: torch.Tensor, layer: RecurrentStateLayer) -> None:
        if self._long:
            layer.store(history=state)                                     # (B, t, D)
        else:
            layer.store(window=state)                                      # (B, K-1, D)

    def state_from_cache(self, layer: RecurrentStateLayer) -> torch.Tensor:
        return layer.input_history if self._long else layer.window


register_architecture(ArchitectureSpec(
    name="baseconv", config_class=MechEvalBaseConvConfig, mixers={"baseconv": BaseConv}, class_stem="BaseConv",
    tiny_config={"kernel_schedule": [3, "long"], "long_filter_order": 8, "max_filter_length": 16},
    # the contract test checks each mixer name at its first layer: "long" first, in both forms
    test_variants=({"kernel_schedule": ["long", 3]},
                   {"kernel_schedule": ["long", 3], "long_conv_form": "mecheval-v1"})))
