"""Causal softmax self-attention (the Transformer's mixer): fused QKV without bias, output
projection with bias."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=True)

    def _heads(self, x: torch.Tensor):
        # x: (B, L, D) -> q, k, v each (B, H, L, hd)
        B, L, _ = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self._heads(x)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, H, L, hd)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D))

    def step(self, x_t: torch.Tensor, state):
        """state: (keys, values) so far, each (B, H, t, hd)."""
        q, k, v = self._heads(x_t[:, None])
        if state is not None:
            k, v = torch.cat([state[0], k], dim=2), torch.cat([state[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v)                     # attends to all cached
        return self.out_proj(y.reshape(x_t.shape)), (k, v)
