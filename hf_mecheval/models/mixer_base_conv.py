"""BaseConv (Arora et al. 2023, "Zoology"): ``y = conv(u) * Linear(u) + u``.

The convolution is a short causal depthwise convolution of width k, or an implicit long
convolution (MLP over sinusoidal positional features, no decay window, computed by
``causal_conv``) when the layer's kernel is ``"long"``."""
from __future__ import annotations

import torch
from torch import nn

from .convolutions import ImplicitFilter, ShortConv, causal_conv
from .mixers import zero_padding
from .sites import Site
from .configuration_mecheval import BaseConvConfig
from .registry import ArchitectureSpec, register_architecture


class BaseConv(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        D = config.hidden_size
        kernel = config.conv_kernel_for_layer(layer_idx)
        self.projection = nn.Linear(D, D, bias=True)
        self.long = kernel == "long"
        if self.long:
            self.filter = ImplicitFilter(D, config.max_filter_length, order=config.long_filter_order, decay=False)
            self.conv_bias = nn.Parameter(torch.zeros(D))
        else:
            self.conv = ShortConv(D, kernel, bias=True)
        self.conv_output = Site("convolution output, (batch, length, hidden)")

    def _conv(self, u: torch.Tensor) -> torch.Tensor:
        if self.long:
            return causal_conv(u, self.filter(u.shape[1])) + self.conv_bias
        return self.conv(u)

    def forward(self, u: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # u: (B, L, D); the convolution is all that mixes along the sequence
        return self.conv_output(self._conv(zero_padding(u, mask))) * self.projection(u) + u

    def step(self, u_t: torch.Tensor, state, mask: torch.Tensor | None = None):
        """state: short conv -> its input window; long conv -> all inputs so far (B, t, D)."""
        conv_in = zero_padding(u_t, mask)
        if self.long:
            history = conv_in[:, None] if state is None else torch.cat([state, conv_in[:, None]], dim=1)
            kernel = self.filter(history.shape[1]).flip(-1)                # (D, t): tap for each past step
            c = (history * kernel.T).sum(1) + self.conv_bias
            state = history
        else:
            c, state = self.conv.step(conv_in, state)
        return c * self.projection(u_t) + u_t, state


register_architecture(ArchitectureSpec(
    name="baseconv", config_class=BaseConvConfig, mixers={"base_conv": BaseConv}, class_stem="BaseConv",
    tiny_config={"kernel_schedule": [3, "long"], "long_filter_order": 8, "max_filter_length": 16}))
