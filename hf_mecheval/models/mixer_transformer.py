"""Causal softmax self-attention (the Transformer's mixer): fused QKV without bias, output
projection with bias.

The attention itself is one of transformers' attention functions, chosen as transformers chooses
(``config._attn_implementation``, which ``from_pretrained(..., attn_implementation=...)``,
``model.set_attn_implementation(...)`` and the default, "sdpa", set):

* "sdpa": transformers' ``sdpa_attention_forward`` (from ``ALL_ATTENTION_FUNCTIONS``), PyTorch's
  fused ``scaled_dot_product_attention``;
* "eager": :func:`eager_attention_forward` below, softmax(q k^T / sqrt(hd)) v written out, which
  also returns the probabilities.

Both read the same boolean mask of the keys each query sees (:func:`visible_keys`) and give the
same outputs to float32 rounding (tested). Eager runs whatever the setting where it must: when the
probabilities are asked for (``output_attentions``: "sdpa" falls back to it for that call, saying
so once, where transformers' SDPA function would warn and return none; a config that asks for
them under "sdpa" is refused by transformers itself), and under ``torch.func.vmap`` (a stacked
run's ``functional_path``), where SDPA would fall back to a loop over the vmapped dimension. The block's
sites (``mixer_input``, ``mixer_output``) are outside the attention function: every
implementation passes the same tensors through them.

Any attention mask is honoured (``masks_any_position``): a padded key, wherever it stands (before,
after or between the tokens of its row), is hidden from every query, as in transformers'
attention models.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging

from .mixers import at_positions
from .configuration_mecheval import MechEvalConfig, check_divides_hidden
from .recurrent_cache import KeyValueLayer
from .registry import ArchitectureSpec, register_architecture

logger = logging.get_logger(__name__)


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
    """Which of L keys each query sees, (1 or B, 1, Lq, L) bool, for the queries at ``positions``
    (B, Lq) (default 0 .. L-1) under the padding ``mask`` (B, L) (None = no padding). Causal;
    padded keys are hidden, except from the padded query itself, so that every row of the softmax
    has a visible key (a padded query's output is never read, but a NaN there would reach later
    layers)."""
    key_pos = torch.arange(L, device=device)
    query_pos = (key_pos if positions is None else positions[:, None, :])[..., None]    # (Lq, 1) or (B, 1, Lq, 1)
    visible = key_pos <= query_pos
    if mask is not None:
        visible = visible & (mask[:, None, None, :] | (key_pos == query_pos))
    return visible.expand(*[1] * (4 - visible.dim()), *visible.shape)


def eager_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """softmax(q k^T * scaling over the visible keys) v, written out, with the signature of
    transformers' attention functions: query (B, H, Lq, hd), key and value (B, H, L, hd),
    attention_mask (1 or B, 1, Lq, L) bool, True = visible (None = causal: query i sees keys
    0 .. i, as SDPA's ``is_causal``) -> (output (B, Lq, H, hd), probabilities (B, H, Lq, L))."""
    scores = query @ key.transpose(-1, -2) * scaling                           # (B, H, Lq, L)
    if attention_mask is None:
        attention_mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    probabilities = torch.softmax(scores.masked_fill(~attention_mask, float("-inf")), dim=-1)
    probabilities = F.dropout(probabilities, p=dropout, training=module.training)
    return (probabilities @ value).transpose(1, 2), probabilities


class CausalSelfAttention(nn.Module):
    reference_init = {"out_proj": "residual"}      # the reference's MHA.out_proj (modeling_mecheval.reference_linear_init)

    accepts_keep = True
    returns_attentions = True       # forward(..., output_attentions=True) -> (output, probabilities)
    masks_any_position = True       # a padded key is hidden wherever it stands: masks may have holes
    is_causal = True                # read by transformers' sdpa_attention_forward

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.config = config        # its _attn_implementation (the model's own config object) chooses
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.scaling = self.head_dim ** -0.5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=True)
        self.functional_path = False   # under vmap: eager attention (SDPA has no batching rule)

    def _heads(self, x: torch.Tensor):
        # x: (B, L, D) -> q, k, v each (B, H, L, hd)
        B, L, _ = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None,
                   output_attentions: bool = False):
        """The configured attention function: q (B, H, Lq, hd), k and v (B, H, L, hd), ``visible``
        (see :func:`eager_attention_forward`) -> (y (B, Lq, D) before the output projection, the
        probabilities (B, H, Lq, L) where ``output_attentions``, else None)."""
        # a mixer built outside a model has no implementation dispatched yet: it attends eagerly
        implementation = self.config._attn_implementation or "eager"
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        if attention is not eager_attention_forward and (output_attentions or self.functional_path):
            if output_attentions:
                logger.warning_once(f"`{implementation}` attention does not return attention probabilities: "
                                    "`output_attentions=True` falls back to `eager` attention for that call (load "
                                    "the model with attn_implementation=\"eager\" to use it throughout)")
            attention = eager_attention_forward
        y, probabilities = attention(self, q, k, v, visible, scaling=self.scaling, dropout=0.0)
        return y.reshape(*y.shape[:2], -1), (probabilities if output_attentions else None)

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

    def _attend(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool):
        """(output (B, L, D), (k, v, real), the probabilities (B, H, L, L) or None)."""
        B, L, D = x.shape
        q, k, v = self._heads(x)
        real = torch.ones(B, L, dtype=torch.bool, device=x.device) if mask is None else mask
        # no padding: no mask, so that SDPA runs as causal (its fastest kernels)
        visible = None if mask is None else visible_keys(L, None, mask, x.device)
        y, probabilities = self._attention(q, k, v, visible, output_attentions)
        return self.out_proj(y), (k, v, real), probabilities

    def attention_weights(self, x: torch.Tensor, mask: torch.Tensor | None = None, past=None) -> torch.Tensor:
        """The attention probabilities of the queries of x (B, L, D) continuing from ``past``, the
        ``step`` state before x (t cached keys; None = none): (B, H, L, t + L), for
        ``output_attentions`` in the cached (generation) forward. ``mask`` (B, L): False at padding."""
        q, k, v = self._heads(x)                                               # (B, H, L, hd)
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        t = 0
        if past is not None:
            t = past[0].shape[2]
            k, v, real = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2), torch.cat([past[2], real], 1)
        B, L = x.shape[:2]
        positions = torch.arange(t, t + L, device=x.device).expand(B, L)
        return self._attention(q, k, v, visible_keys(t + L, positions, real, x.device), output_attentions=True)[1]

    def _forward_at(self, x: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, L, D = x.shape
        n, H, hd = keep.shape[1], self.num_heads, self.head_dim
        w_q, w_kv = self.qkv.weight.split([D, 2 * D])
        q = F.linear(at_positions(x, keep), w_q).view(B, n, H, hd).transpose(1, 2)   # (B, H, k, hd)
        k, v = F.linear(x, w_kv).view(B, L, 2, H, hd).permute(2, 0, 3, 1, 4)     # (B, H, L, hd) each
        y, _ = self._attention(q, k, v, visible_keys(L, keep, mask, x.device))   # (B, k, D)
        return self.out_proj(y)

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
        y, _ = self._attention(q, k, v, visible[:, None, None, :])        # (B, 1, D)
        return self.out_proj(y[:, 0]), (k, v, real)

    # the step state in the generation cache (recurrent_cache.py): transformers' key/value layer
    cache_layer_class = KeyValueLayer

    def state_to_cache(self, state, layer: KeyValueLayer) -> None:
        layer.store(*state)

    def state_from_cache(self, layer: KeyValueLayer):
        return layer.keys, layer.values, layer.real


register_architecture(ArchitectureSpec(
    name="transformer", config_class=MechEvalTransformerConfig, mixers={"attention": CausalSelfAttention},
    class_stem="Transformer", tiny_config={"max_position_embeddings": 16}))
