"""Causal softmax self-attention (the Transformer's mixer): fused QKV without bias, output
projection with bias."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .mixers import at_positions
from .configuration_mecheval import MechEvalConfig, check_divides_hidden
from .recurrent_cache import KeyValueLayer
from .registry import ArchitectureSpec, register_architecture


class MechEvalTransformerConfig(MechEvalConfig):
    """Causal softmax attention; fused QKV without bias, output projection with bias."""

    model_type = "mecheval-transformer"
    max_position_embeddings: int = 1024
    num_attention_heads: int = 1

    def validate_fields(self) -> None:
        super().validate_fields()
        check_divides_hidden(self, "num_attention_heads")

    def layer_mixers(self) -> list[str]:
        return ["attention"] * self.num_hidden_layers


def visible_keys(L: int, positions: torch.Tensor | None, mask: torch.Tensor | None, device) -> torch.Tensor:
    """Which keys each query sees: (Lq, L), or (B, 1, Lq, L) with per-row ``positions`` (B, Lq)
    (default 0 .. L-1) or a padding ``mask`` (B, L). Causal; padded keys are hidden, except from
    the padded query itself, so that every row of the softmax has a visible key (a padded
    query's output is never read, but a NaN there would reach later layers)."""
    key_pos = torch.arange(L, device=device)
    query_pos = (key_pos if positions is None else positions[:, None, :])[..., None]
    visible = key_pos <= query_pos
    if mask is not None:
        visible = visible & (mask[:, None, None, :] | (key_pos == query_pos))
    return visible


def causal_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + causal mask) v, written out. k, v (B, H, L, hd); q (B, H, Lq, hd)
    for the queries at ``positions`` (B, Lq), default 0 .. L-1; ``mask`` (B, L) hides padded keys
    -> (B, H, Lq, hd). What ``scaled_dot_product_attention(is_causal=True)`` computes (tested
    equal); used under ``torch.func.vmap``, where SDPA would fall back to a loop over the vmapped
    dimension, and for queries at chosen positions."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])                  # (B, H, Lq, L)
    visible = visible_keys(k.shape[-2], positions, mask, q.device)
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v


class CausalSelfAttention(nn.Module):
    reference_init = {"out_proj": "residual"}      # the reference's MHA.out_proj (modeling_mecheval.reference_linear_init)

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=True)
        self.functional_path = False   # under vmap: explicit softmax attention (SDPA has no batching rule)

    def _heads(self, x: torch.Tensor):
        # x: (B, L, D) -> q, k, v each (B, H, L, hd)
        B, L, _ = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    accepts_keep = True
    returns_attentions = True       # forward(..., output_attentions=True) -> (output, probabilities)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                output_attentions: bool = False):
        """x (B, L, D) -> (B, L, D); with keep (B, k) positions, the output at those positions only
        (B, k, D): queries (and the output projection) there, keys and values everywhere. ``mask``
        (B, L): padded keys are hidden. With ``output_attentions``: (output, the attention
        probabilities (B, H, L, L) the output is computed from)."""
        if keep is not None:
            return self._forward_at(x, keep, mask)
        out, _, probabilities = self._attend(x, mask, output_attentions)
        return (out, probabilities) if output_attentions else out

    def forward_with_state(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """forward(x, mask) and the state ``step`` continues from: the keys and values (B, H, L, hd)
        and which positions are real (B, L)."""
        out, state, _ = self._attend(x, mask, False)
        return out, state

    def _attend(self, x: torch.Tensor, mask: torch.Tensor | None, explicit: bool):
        """(output (B, L, D), (k, v, real), the probabilities (B, H, L, L) where ``explicit``, else
        None: written out then, by SDPA otherwise)."""
        B, L, D = x.shape
        q, k, v = self._heads(x)
        real = torch.ones(B, L, dtype=torch.bool, device=x.device) if mask is None else mask
        probabilities = None
        if explicit:
            probabilities = self._probabilities(q, k, real, past=0)
            y = probabilities @ v
        elif self.functional_path:
            y = causal_softmax_attention(q, k, v, mask=mask)
        elif mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, H, L, hd)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible_keys(L, None, mask, x.device))
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D)), (k, v, real), probabilities

    def _probabilities(self, q: torch.Tensor, k: torch.Tensor, real: torch.Tensor, past: int) -> torch.Tensor:
        """softmax(q k^T / sqrt(hd)) over the visible keys: q (B, H, Lq, hd) for the positions after
        ``past`` earlier keys, k (B, H, past + Lq, hd), real (B, past + Lq) -> (B, H, Lq, past + Lq)."""
        B, Lq = q.shape[0], q.shape[2]
        positions = torch.arange(past, past + Lq, device=q.device).expand(B, Lq)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        visible = visible_keys(k.shape[2], positions, real, q.device)
        return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)

    def attention_weights(self, x: torch.Tensor, mask: torch.Tensor | None = None, past=None) -> torch.Tensor:
        """The attention probabilities of the queries of x (B, L, D) continuing from ``past``, the
        ``step`` state before x (t cached keys; None = none): (B, H, L, t + L), for
        ``output_attentions`` in the cached (generation) forward. ``mask`` (B, L): False at padding."""
        q, k, _ = self._heads(x)                                               # (B, H, L, hd)
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        t = 0
        if past is not None:
            t = past[0].shape[2]
            k, real = torch.cat([past[0], k], dim=2), torch.cat([past[2], real], dim=1)
        return self._probabilities(q, k, real, past=t)

    def _forward_at(self, x: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, L, D = x.shape
        n, H, hd = keep.shape[1], self.num_heads, self.head_dim
        w_q, w_kv = self.qkv.weight.split([D, 2 * D])
        q = F.linear(at_positions(x, keep), w_q).view(B, n, H, hd).transpose(1, 2)   # (B, H, k, hd)
        k, v = F.linear(x, w_kv).view(B, L, 2, H, hd).permute(2, 0, 3, 1, 4)     # (B, H, L, hd) each
        y = causal_softmax_attention(q, k, v, keep, mask)                         # (B, H, k, hd)
        return self.out_proj(y.transpose(1, 2).reshape(B, n, D))

    def step(self, x_t: torch.Tensor, state, mask: torch.Tensor | None = None):
        """state: (keys, values, real) so far: the KV cache, each (B, H, t, hd), and which of those
        t tokens are not padding, (B, t) bool. mask (B,): whether x_t is a real token."""
        q, k, v = self._heads(x_t[:, None])                              # (B, H, 1, hd) each
        real = torch.ones_like(x_t[:, 0], dtype=torch.bool) if mask is None else mask   # (B,)
        if state is not None:
            k, v = torch.cat([state[0], k], dim=2), torch.cat([state[1], v], dim=2)
            real = torch.cat([state[2], real[:, None]], dim=1)          # (B, t+1)
        else:
            real = real[:, None]
        # every cached real token, and the token itself (see visible_keys)
        visible = real.clone()
        visible[:, -1] = True
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None, None, :])
        return self.out_proj(y.reshape(x_t.shape)), (k, v, real)

    # the step state in the generation cache (recurrent_cache.py): transformers' key/value layer
    cache_layer_class = KeyValueLayer

    def state_to_cache(self, state, layer: KeyValueLayer) -> None:
        layer.store(*state)

    def state_from_cache(self, layer: KeyValueLayer):
        return layer.keys, layer.values, layer.real


register_architecture(ArchitectureSpec(
    name="transformer", config_class=MechEvalTransformerConfig, mixers={"attention": CausalSelfAttention},
    class_stem="Transformer", tiny_config={"max_position_embeddings": 16}))
