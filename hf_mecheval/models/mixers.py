"""Sequence mixers: one file each (``mixer_*.py``), one contract (zoology's).

A mixer is an ``nn.Module`` built as ``Mixer(config, layer_idx)`` with

* ``forward(x, mask=None)``: (batch, length, hidden) -> (batch, length, hidden), causal; a mixer
  whose class sets ``accepts_keep = True`` also takes ``forward(x, keep=positions, mask=None)``
  ((batch, k) positions) and returns its output at those positions only, (batch, k, hidden) —
  the last block uses it on the answer-only training path;
* ``step(x_t, state, mask=None)``: the recurrent form for one token, (batch, hidden) -> (batch,
  hidden), with ``state=None`` at the start of a sequence; it returns ``(y_t, new_state)``.
  Running it over a sequence gives ``forward``'s outputs (tested for every mixer). It is what
  the generation cache holds (``recurrent_cache.py``): every tensor of a state has the batch
  first;
* optionally, how the generation cache holds that state in transformers' terms: the class
  ``cache_layer_class`` (a layer of ``recurrent_cache.py``: key/value, or conv and recurrent
  states), ``state_to_cache(state, layer)`` and ``state_from_cache(layer) -> state``. A mixer
  without them has its state kept as it is (``MixerStateLayer``);
* a mixer whose class sets ``returns_attentions = True`` (softmax attention) also takes
  ``forward(x, mask=None, output_attentions=True)`` and returns ``(y, probabilities)``, the
  (batch, heads, length, length) attention probabilities y is computed from, and
  ``attention_weights(x, mask, past_state)`` for the cached forward (``output_attentions``);
* optionally ``forward_with_state(x, mask=None)``: ``forward``'s output and the state ``step``
  would hold after the whole sequence (from ``state=None``), in one parallel pass. The backbone
  reads a prompt with it into a generation cache (prefill); a mixer without it is stepped
  through the prompt token by token. Tested equal to stepping for every mixer that has it;
* ``mask``: (batch, length) bool, or (batch,) for ``step``, False at padding; None = no padding.
  A padded position must contribute nothing to any later position when it comes before every
  real token of its row (left padding: the row is then computed as if it were not padded); its
  own output does not matter. That is all the backbone asks: it refuses masks with holes, and
  right padding needs nothing in a causal model. Each mixer zeroes what it mixes along the
  sequence at padded positions (``zero_padding``), before any bias could make it non-zero. A
  mixer whose class sets ``masks_any_position = True`` (softmax attention) hides a padded
  position from every later one wherever it stands: where every mixer of a model does, the
  backbone accepts masks with holes too;
* internal intervention sites as :class:`~.sites.Site` attributes (``conv_output``, ``state``),
  which the site vocabulary picks up by itself.

The backbone maps the names used by ``config.layer_mixers()`` to classes (``MIXERS`` in
``registry.py``).
"""
from __future__ import annotations

import torch


def at_positions(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x (B, L, C), positions (B, k) -> x at those positions, (B, k, C)."""
    return x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1]))


def zero_padding(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """x (B, L, C) or (B, C) with the padded positions of ``mask`` ((B, L) or (B,), False = padding)
    set to zero; x itself when nothing is padded."""
    return x if mask is None else x * mask[..., None].to(x.dtype)


def fold_copies(K: int, tensors, dims) -> list[torch.Tensor]:
    """For ``vmap`` rules of custom autograd functions over K stacked copies: fold the copies into
    the leading dimension, (K, b, ...) -> (K*b, ...); a tensor without a vmapped dimension (dim
    None) is shared by every copy."""
    def rows(t, dim):
        t = t.movedim(dim, 0) if dim is not None else t.expand(K, *t.shape)
        return t.reshape(-1, *t.shape[2:])
    return [rows(t, d) for t, d in zip(tensors, dims)]
