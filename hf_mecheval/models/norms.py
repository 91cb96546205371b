"""Norms used inside mixers (the block norms live with the backbone in ``modeling_mecheval``)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class GatedRMSNorm(nn.Module):
    """RMSNorm with a SiLU output gate, over groups of ``group_size`` features of the last dim.

    ``norm_before_gate=False`` (Mamba-2):  norm(x * silu(gate)) * weight
    ``norm_before_gate=True``  (Gated DeltaNet, flash-linear-attention's ``o_norm``):
                                           norm(x) * weight * silu(gate)

    x, gate: (..., dim); weight: (dim,). A group is normalised by its own root mean square
    (Mamba-2 with n_groups > 1 normalises each group of heads separately).
    """

    def __init__(self, dim: int, eps: float, group_size: int | None = None, norm_before_gate: bool = False):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.group_size = group_size or dim
        self.norm_before_gate = norm_before_gate
        self.weight = nn.Parameter(torch.ones(dim))

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if not self.norm_before_gate:
            x = x * F.silu(gate)
        if self.group_size == self.dim:
            x = F.rms_norm(x, (self.dim,), self.weight, self.eps)
        else:                                                          # each group by its own rms
            groups = F.rms_norm(x.unflatten(-1, (-1, self.group_size)), (self.group_size,), eps=self.eps)
            x = groups.flatten(-2) * self.weight
        return x * F.silu(gate) if self.norm_before_gate else x

    def extra_repr(self) -> str:
        return (f"{self.dim}, group_size={self.group_size}, eps={self.eps}, "
                f"norm_before_gate={self.norm_before_gate}")
