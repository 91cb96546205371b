"""Based linear attention (Arora et al. 2024): causal linear attention with the 2nd-order
Taylor feature map of exp(q·k/sqrt(F)).

    phi(x) = [1, x / F^(1/4), vec(x x^T) / (sqrt(2) sqrt(F))]         (1 + F + F^2 features)
    phi(q)·phi(k) = 1 + q·k/sqrt(F) + (q·k)^2 / (2F)                   (> 0 always)
    y_t = sum_{s<=t} phi(q_t)·phi(k_s) v_s / (sum_{s<=t} phi(q_t)·phi(k_s) + eps)

Training uses the exact quadratic view (the kernel matrix is L x L; L is small here). The
recurrent view keeps the running state S_t = sum_{s<=t} phi(k_s) v_s^T (features x head_dim)
and the normaliser z_t = sum_{s<=t} phi(k_s); both views are tested equal. The ``state`` site
shows the two together, [S_t | z_t] = sum_{s<=t} phi(k_s) [v_s, 1]^T, so a patch of the state
replaces the normaliser too (else the output would mix a clean numerator with a corrupted
denominator). q/k/v/out projections have no bias (as in the reference). A padded key contributes
nothing, to the normaliser neither: phi(k) has a constant feature, so zeroing the layer's input is
not enough and the keys' features are masked."""
from __future__ import annotations

import math

import torch
from torch import nn

from .sites import Site, through_state_site
from .configuration_mecheval import MechEvalConfig, FILTER_FORMS, check_choice, check_divides_hidden, check_int
from .mixer_baseconv import BaseConv, default_long_filter_order
from .recurrent_cache import RecurrentStateLayer
from .registry import ArchitectureSpec, register_architecture


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
    made before this field existed). See ``mixer_baseconv.py``."""
    long_filter_order: int | None = None
    """Width of the MLP that parameterises implicit long filters; default: the form's
    (``LONG_FILTER_ORDER``: 16 for "reference", as the reference; 64 for "mecheval-v1")."""
    max_filter_length: int = 1024
    """Longest sequence an implicit long filter is defined for."""

    LEGACY_FIELDS = {**MechEvalConfig.LEGACY_FIELDS, "long_conv_form": "mecheval-v1"}

    def __post_init__(self, **kwargs):
        default_long_filter_order(self)
        super().__post_init__(**kwargs)

    def validate_fields(self) -> None:
        super().validate_fields()
        if self.short_conv_kernel != "long":
            check_int(self, "short_conv_kernel", allowed=(1, 2, 3, 4, 5, 6, 7, 8))
        check_int(self, "feature_dim", minimum=1)
        check_choice(self, "long_conv_form", FILTER_FORMS)
        check_int(self, "long_filter_order", minimum=1)
        check_int(self, "max_filter_length", minimum=2)
        check_divides_hidden(self, "num_attention_heads")

    def layer_mixers(self) -> list[str]:
        return ["baseconv" if i % 2 == 0 else "based" for i in range(self.num_hidden_layers)]

    def conv_kernel_for_layer(self, layer: int) -> int | str:
        return self.short_conv_kernel


EPS = 1e-12


class BasedLinearAttention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        D, self.F, self.H = config.hidden_size, config.feature_dim, config.num_attention_heads
        self.head_dim = D // self.H
        self.q_proj = nn.Linear(D, self.F * self.H, bias=False)
        self.k_proj = nn.Linear(D, self.F * self.H, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.out_proj = nn.Linear(D, D, bias=False)
        self.state = Site("running state [S_t | z_t] = sum phi(k_s) [v_s, 1]^T: the KV state and, in the last "
                          "column, the normaliser, (batch, length, heads, 1+F+F^2, head_dim+1)", propagates_in_layer=True)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., F) -> (..., 1 + F + F^2)
        F_ = self.F
        second = (x[..., :, None] * x[..., None, :]).flatten(-2) / (math.sqrt(2) * math.sqrt(F_))
        return torch.cat([torch.ones_like(x[..., :1]), x / F_ ** 0.25, second], dim=-1)

    def _qkv(self, x: torch.Tensor):
        # x: (B, L, D) -> q, k (B, H, L, F); v (B, H, L, hd)
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.H, self.F).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.H, self.F).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.H, self.head_dim).transpose(1, 2)
        return q, k, v

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self._qkv(x)
        if self.state.wanted():
            y = self._recurrent_view(q, k, v, mask)
        else:
            s = q @ k.transpose(-1, -2) / math.sqrt(self.F)                # (B, H, L, L): q·k / sqrt(F)
            a = (1 + s + 0.5 * s * s).tril()                                # phi(q)·phi(k), causal
            if mask is not None:
                a = a * mask[:, None, None, :].to(a.dtype)                  # padded keys: no weight
            y = (a @ v) / (a.sum(-1, keepdim=True) + EPS)                   # (B, H, L, hd)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D))

    def forward_with_state(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """forward(x, mask) and the state ``step`` continues from: (S (B, H, f, hd), z (B, H, f)),
        the sums over the sequence of phi(k) v^T and phi(k)."""
        _, k, v = self._qkv(x)
        fk = self.feature_map(k)                                            # (B, H, L, f)
        if mask is not None:
            fk = fk * mask[:, None, :, None].to(fk.dtype)
        return self.forward(x, mask), (fk.transpose(-1, -2) @ v, fk.sum(2))

    def _recurrent_view(self, q, k, v, mask=None) -> torch.Tensor:
        """Outputs through the explicit state trajectory (what the ``state`` site shows)."""
        fq, fk = self.feature_map(q), self.feature_map(k)                  # (B, H, L, f)
        if mask is not None:
            fk = fk * mask[:, None, :, None].to(fk.dtype)                   # a padded key adds nothing
        v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)            # [v, 1]: (B, H, L, hd+1)
        states = (fk[..., :, None] * v1[..., None, :]).cumsum(2).transpose(1, 2)   # [S | z]: (B, L, H, f, hd+1)
        states = through_state_site(self.state, states, lambda t, e: e)     # S_t = S_{t-1} + ...: carry a patch
        out = (fq[..., None, :] @ states.transpose(1, 2)).squeeze(-2)      # (B, H, L, hd+1)
        return out[..., :-1] / (out[..., -1:] + EPS)                        # numerator / normaliser

    def step(self, x_t: torch.Tensor, state, mask: torch.Tensor | None = None):
        """state: (S (B, H, f, hd), z (B, H, f))."""
        B, D = x_t.shape
        q, k, v = (t[:, :, 0] for t in self._qkv(x_t[:, None]))              # (B, H, F|hd)
        fq, fk = self.feature_map(q), self.feature_map(k)
        if mask is not None:
            fk = fk * mask[:, None, None].to(fk.dtype)                         # a padded key adds nothing
        if state is None:
            S = fk[..., :, None] * v[..., None, :]
            z = fk
        else:
            S = state[0] + fk[..., :, None] * v[..., None, :]
            z = state[1] + fk
        y = (fq[..., None, :] @ S).squeeze(-2) / ((fq * z).sum(-1, keepdim=True) + EPS)
        return self.out_proj(y.reshape(B, D)), (S, z)

    # the step state in the generation cache (recurrent_cache.py): [S | z] (B, H, f, hd + 1) as
    # transformers' recurrent state, as the state site shows it; no convolution
    cache_layer_class = RecurrentStateLayer

    def state_to_cache(self, state, layer: RecurrentStateLayer) -> None:
        S, z = state
        layer.store(recurrent=torch.cat([S, z[..., None]], dim=-1))

    def state_from_cache(self, layer: RecurrentStateLayer):
        S_z = layer.recurrent
        return S_z[..., :-1], S_z[..., -1]


# Based alternates BaseConv (even layers) with this linear attention (odd layers)
register_architecture(ArchitectureSpec(
    name="based", config_class=MechEvalBasedConfig, mixers={"baseconv": BaseConv, "based": BasedLinearAttention},
    class_stem="Based", tiny_config={"feature_dim": 4, "max_filter_length": 16},
    test_variants=({"short_conv_kernel": "long", "long_filter_order": 8},
                   {"short_conv_kernel": "long", "long_filter_order": 8, "long_conv_form": "mecheval-v1"})))
