"""Mamba (selective SSM) mixer, Gu & Dao 2023, in PyTorch.

    x, z   = in_proj(u)                                  (B, L, E) each, E = expand * D
    x      = silu(conv(x))   (conv_kernel > 0)   or  silu(x)   (conv_kernel = 0: no convolution)
    dt, B, C = x_proj(x) split (R, N, N);  dt = softplus(dt_proj(dt) + dt_bias)   (B, L, E)
    h_t    = exp(dt_t A) * h_{t-1} + dt_t B_t x_t        h: (B, E, N), A = -exp(A_log) (E, N)
    y_t    = C_t · h_t + D * x_t;   y = y * silu(z);   out = out_proj(y)

The scan (``ops_selective_scan.py``) runs on a CPU as a compiled C++ loop over time per row
(``selective_scan_cpu.cpp``, ~4-6x faster than the PyTorch form) where a C++ compiler is present
and ``kernels`` is not ``"torch"``; that kernel also takes in the elementwise steps around the
scan, as mamba-ssm's ``selective_scan_fn`` does on a GPU: the step size's bias and softplus
(it is given dt_proj's output, (B, L, E)), ``+ D * x`` and, on the full path, the gate
``* silu(z)`` (z: (B, L, E)), forward and backward, each a whole-tensor pass fewer. Otherwise the
scan runs as a custom autograd function with hand-written forward and backward loops over time,
in place on reused buffers (no per-step autograd graph), the fastest PyTorch form on a CPU at
these lengths, with those steps written out in PyTorch (the readable form the kernel is tested
against). The ``state`` site is computed only when someone listens (a hook,
or ``materialize_sites(True)``): then the state trajectory goes through the Site, where a patch
is carried to later positions (``LinearScan`` and ``through_state_site``). On the
answer-only training path the last layer needs y at the answer only, which in PyTorch has a
closed form (``SelectiveScanAt``); the C++ scan computes every position (with softplus and D;
the gate and out_proj at the answer only) and is still faster.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .kernels import cpu_scan, mamba_kernels, use_kernels
from .convolutions import ShortConv
from .sites import Site, through_state_site
from .mixers import at_positions, zero_padding
from .ops_selective_scan import ScanWorkspace, linear_scan, selective_scan, selective_scan_at
from .recurrent_cache import WindowAndRecurrentState
from .errors import ConfigError
from .configuration_mecheval import MechEvalConfig, check_float, check_int
from .registry import ArchitectureSpec, register_architecture


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
        check_int(self, "d_state", minimum=1)
        check_int(self, "expand", minimum=1)
        check_int(self, "conv_kernel", minimum=0, maximum=16)
        if self.dt_rank != "auto":
            check_int(self, "dt_rank", minimum=1)
        check_float(self, "dt_min", minimum=0, exclusive=True)
        check_float(self, "dt_max", minimum=self.dt_min)
        check_float(self, "dt_init_floor", minimum=0)
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


class MambaMixer(WindowAndRecurrentState, nn.Module):
    # mamba-ssm keeps nn.Linear's own init for its projections; the reference then redraws out_proj
    # and divides it by sqrt(num_hidden_layers) (modeling_mecheval.reference_linear_init)
    reference_init = {"in_proj": "torch_default", "x_proj": "torch_default", "out_proj": "torch_default_residual"}

    def __init__(self, config, layer_idx: int):
        super().__init__()
        D, E, N, R = config.hidden_size, config.intermediate_ssm_size, config.d_state, config.time_step_rank
        self.E, self.N, self.R = E, N, R
        self.config = config
        self.in_proj = nn.Linear(D, 2 * E, bias=False)
        self.conv = ShortConv(E, config.conv_kernel, bias=True, kernels=config.kernels) if config.conv_kernel > 0 else None
        self.x_proj = nn.Linear(E, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, E, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(E))
        self.A_log = nn.Parameter(torch.empty(E, N))
        self.D = nn.Parameter(torch.empty(E))
        self.out_proj = nn.Linear(E, D, bias=False)
        if self.conv is not None:
            self.conv_output = Site("short-conv output after SiLU, (batch, length, expand*hidden)")
        self.state = Site("SSM state trajectory h_t, (batch, length, expand*hidden, d_state)", propagates_in_layer=True)
        self._workspace = ScanWorkspace()
        self.init_mecheval_parameters()

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        """S4D-real A, D = 1, dt in [dt_min, dt_max] log-uniformly (through an inverse-softplus
        bias), dt_proj uniform in +-R^-1/2."""
        c = self.config
        self.A_log.copy_(torch.log(torch.arange(1, self.N + 1, dtype=torch.float32)).repeat(self.E, 1))
        self.D.fill_(1.0)
        bound = self.R ** -0.5
        self.dt_proj.weight.uniform_(-bound, bound)
        dt = torch.exp(torch.rand(self.E) * (math.log(c.dt_max) - math.log(c.dt_min)) + math.log(c.dt_min))
        dt = dt.clamp(min=c.dt_init_floor)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def _activated_x(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # padding is zeroed before the convolution (its window) and after it (the SSM's input, which
        # the convolution's bias makes non-zero): a zero input leaves the state untouched
        x = zero_padding(x, mask)
        if self.conv is None:
            return F.silu(x)
        return zero_padding(self.conv_output(self.conv(x, activation="silu")), mask)

    def _ssm_inputs(self, x: torch.Tensor):
        # x: (..., E) -> dt (..., E), B (..., N), C (..., N)
        dt_raw, B, C = self._ssm_raw_inputs(x)
        return F.softplus(dt_raw + self.dt_bias), B, C

    def _ssm_raw_inputs(self, x: torch.Tensor):
        # x: (..., E) -> dt_raw (..., E) (before the bias and softplus), B (..., N), C (..., N)
        dt, B, C = self.x_proj(x).split([self.R, self.N, self.N], dim=-1)
        return self.dt_proj(dt), B, C

    accepts_keep = True

    def forward(self, u: torch.Tensor, keep: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """u (B, L, D) -> (B, L, D); with keep (B, k) positions (the answer-only training path),
        the output at those positions only, (B, k, D)."""
        fast = not self.state.wanted()
        if fast and use_kernels("mamba", self.config.kernels, u.device):
            y = self._forward_cuda(u, mask)
            return y if keep is None else at_positions(y, keep)
        if keep is not None and fast:
            return self._forward_at(u, keep, mask)
        compiled = cpu_scan("mamba", self.config.kernels, u.device) if fast else None
        if compiled is not None:    # softplus, D and the gate inside the kernel
            # x and z by a product each: contiguous, which the kernels read without a copy
            w_x, w_z = self.in_proj.weight.chunk(2, dim=0)                     # (E, D) each
            x = self._activated_x(F.linear(u, w_x), mask)                      # (B, L, E)
            dt_raw, B, C = self._ssm_raw_inputs(x)
            y = compiled(x, dt_raw, -torch.exp(self.A_log), B, C, self.D, F.linear(u, w_z), self.dt_bias, True)
            out = self.out_proj(y)
            return out if keep is None else at_positions(out, keep)
        x, z = self.in_proj(u).chunk(2, dim=-1)                               # (B, L, E) each
        x = self._activated_x(x, mask)
        dt, B, C = self._ssm_inputs(x)
        A = -torch.exp(self.A_log)                                             # (E, N)
        if fast:
            y = selective_scan(x, dt, A, B, C, self._workspace)                # (B, L, E)
        else:  # the state trajectory goes through its Site, where it may be read or patched
            dA = torch.exp(dt[..., None] * A)                                  # (B, L, E, N)
            H = linear_scan(dA, (dt * x)[..., None] * B[:, :, None, :])
            H = through_state_site(self.state, H, lambda t, e: dA[:, t] * e)
            y = (H @ C[..., None])[..., 0]                                     # C_t · h_t, (B, L, E)
        out = self.out_proj((y + self.D * x) * F.silu(z))
        return out if keep is None else at_positions(out, keep)

    def forward_with_state(self, u: torch.Tensor, mask: torch.Tensor | None = None):
        """forward(u, mask) and the state ``step`` continues from: (conv window (B, K-1, E) or None,
        h (B, E, N)), through the explicit state trajectory."""
        x, z = self.in_proj(u).chunk(2, dim=-1)                               # (B, L, E) each
        window = None if self.conv is None else self.conv.state_after(zero_padding(x, mask))
        x = self._activated_x(x, mask)
        dt, B, C = self._ssm_inputs(x)
        dA = torch.exp(dt[..., None] * -torch.exp(self.A_log))                 # (B, L, E, N)
        H = linear_scan(dA, (dt * x)[..., None] * B[:, :, None, :])            # (B, L, E, N)
        y = (H @ C[..., None])[..., 0]
        return self.out_proj((y + self.D * x) * F.silu(z)), (window, H[:, -1])

    def _forward_at(self, u: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # the convolution and the SSM inputs are needed everywhere, the gate and output at keep only
        w_x, w_z = self.in_proj.weight.chunk(2, dim=0)                         # (E, D) each
        x = self._activated_x(F.linear(u, w_x), mask)                          # (B, L, E)
        z = F.linear(at_positions(u, keep), w_z)                               # (B, k, E)
        A = -torch.exp(self.A_log)                                             # (E, N)
        compiled = cpu_scan("mamba", self.config.kernels, u.device)
        if compiled is not None:    # softplus and D inside the kernel, which computes every position
            dt_raw, B, C = self._ssm_raw_inputs(x)
            y = at_positions(compiled(x, dt_raw, A, B, C, self.D, None, self.dt_bias, True), keep)   # (B, k, E)
            return self.out_proj(y * F.silu(z))
        dt, B, C = self._ssm_inputs(x)
        y = selective_scan_at(x, dt, A, B, C, keep, self._workspace)          # (B, k, E)
        return self.out_proj((y + self.D * at_positions(x, keep)) * F.silu(z))

    def _forward_cuda(self, u: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        selective_scan_fn, causal_conv1d_fn = mamba_kernels()
        x, z = self.in_proj(u).transpose(1, 2).chunk(2, dim=1)                 # (B, E, L)
        channels_mask = None if mask is None else mask[:, None, :].to(x.dtype)  # as in _activated_x
        if channels_mask is not None:
            x = x * channels_mask
        if self.conv is None:
            x = F.silu(x)
        else:
            x = causal_conv1d_fn(x, self.conv.weight[:, 0], self.conv.bias, activation="silu")
            x = self.conv_output(x.transpose(1, 2)).transpose(1, 2)
            if channels_mask is not None:
                x = x * channels_mask
        dt, B, C = self.x_proj(x.transpose(1, 2)).split([self.R, self.N, self.N], dim=-1)
        dt = self.dt_proj(dt).transpose(1, 2)                                  # (B, E, L), softplus in kernel
        y = selective_scan_fn(x, dt, -torch.exp(self.A_log.float()), B.transpose(1, 2), C.transpose(1, 2),
                              self.D.float(), z=z, delta_bias=self.dt_bias.float(), delta_softplus=True)
        return self.out_proj(y.transpose(1, 2))

    def step(self, u_t: torch.Tensor, state, mask: torch.Tensor | None = None):
        """state: (conv window (B, K-1, E) or None, h (B, E, N))."""
        window, h = (None, None) if state is None else state
        x, z = self.in_proj(u_t).chunk(2, dim=-1)                              # (B, E)
        x = zero_padding(x, mask)                                              # as in _activated_x
        if self.conv is None:
            x = F.silu(x)
        else:
            x, window = self.conv.step(x, window)
            x = zero_padding(F.silu(x), mask)
        dt, B, C = self._ssm_inputs(x)
        A = -torch.exp(self.A_log)
        dBx = (dt * x)[..., None] * B[:, None, :]
        h = dBx if h is None else torch.exp(dt[..., None] * A) * h + dBx
        y = (h @ C[..., None]).squeeze(-1) + self.D * x
        return self.out_proj(y * F.silu(z)), (window, h)


register_architecture(ArchitectureSpec(
    name="mamba", config_class=MechEvalMambaConfig, mixers={"mamba": MambaMixer}, class_stem="Mamba",
    kernel_packages={"mamba": ("mamba_ssm", "causal_conv1d")}, tiny_config={"d_state": 4},
    test_variants=({"conv_kernel": 0},)))
