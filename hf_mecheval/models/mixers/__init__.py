"""Sequence mixers: one file each, one contract (zoology's).

A mixer is an ``nn.Module`` built as ``Mixer(config, layer_idx)`` with

* ``forward(x)``: (batch, length, hidden) -> (batch, length, hidden), causal; a mixer whose
  class sets ``accepts_keep = True`` also takes ``forward(x, keep=positions)`` ((batch, k)
  positions) and returns its output at those positions only, (batch, k, hidden) — the last
  block uses it on the answer-only training path;
* ``step(x_t, state)``: the recurrent form for one token, (batch, hidden) -> (batch, hidden),
  with ``state=None`` at the start of a sequence; it returns ``(y_t, new_state)``. Running it
  over a sequence gives ``forward``'s outputs (tested for every mixer);
* internal intervention sites as :class:`~hf_mecheval.models.sites.Site` attributes
  (``conv_output``, ``state``), which the site vocabulary picks up by itself.

``mixer_class(name)`` maps the names used by ``config.layer_mixers()`` to classes
(``_MIXER_PATHS``), imported on first use. The newer mixers (``mamba2``, ``gated_delta_net``)
keep their math in ``models/ops/`` and only build parameters and dispatch.
"""
from __future__ import annotations

import importlib

import torch

_MIXER_PATHS = {
    "attention": "attention:CausalSelfAttention",
    "based": "based:BasedLinearAttention",
    "base_conv": "base_conv:BaseConv",
    "h3": "h3:H3",
    "hyena": "hyena:HyenaOperator",
    "mamba": "mamba:MambaMixer",
    "delta_net": "delta_net:DeltaNetMixer",
    "mamba2": "mamba2:Mamba2Mixer",
    "gated_delta_net": "gated_delta_net:GatedDeltaNetMixer",
}


def at_positions(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x (B, L, C), positions (B, k) -> x at those positions, (B, k, C)."""
    return x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1]))


def fold_copies(K: int, tensors, dims) -> list[torch.Tensor]:
    """For ``vmap`` rules of custom autograd functions over K stacked copies: fold the copies into
    the leading dimension, (K, b, ...) -> (K*b, ...); a tensor without a vmapped dimension (dim
    None) is shared by every copy."""
    def rows(t, dim):
        t = t.movedim(dim, 0) if dim is not None else t.expand(K, *t.shape)
        return t.reshape(-1, *t.shape[2:])
    return [rows(t, d) for t, d in zip(tensors, dims)]


def mixer_class(name: str):
    if name not in _MIXER_PATHS:
        raise KeyError(f"unknown mixer {name!r}; known: {', '.join(_MIXER_PATHS)}")
    module, cls = _MIXER_PATHS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
