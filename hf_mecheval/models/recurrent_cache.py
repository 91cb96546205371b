"""The generation cache: every block's recurrent state, so that ``generate()`` runs each new token
through the mixers' ``step`` forms (``mixers.py``) instead of re-reading the whole sequence. The
prompt itself is read in one parallel pass by the mixers that can also return their final state
(``forward_with_state``), token by token by the others.

What a block keeps is its mixer's own ``step`` state: a fixed-size state for the recurrent mixers
(Mamba's conv window and h, DeltaNet's S, Based's [S | z], H3's shift register and SSM state,
BaseConv's short window), so each generated token costs the same; the growing KV cache for
attention, and the growing input history for the mixers whose filter is as long as the sequence
(Hyena, BaseConv's "long" layers). To transformers it is a ``Cache``: ``generate()`` keeps it
between forwards, reorders it for beam search and returns it with ``return_dict_in_generate``.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache


def map_tensors(fn, state):
    """``fn`` applied to every tensor of a (nested tuple / list / dict) state; None stays None."""
    if torch.is_tensor(state):
        return fn(state)
    if isinstance(state, (tuple, list)):
        return type(state)(map_tensors(fn, s) for s in state)
    if isinstance(state, dict):
        return {k: map_tensors(fn, v) for k, v in state.items()}
    return state


class RecurrentCache(Cache):
    """``layers[i]``: block i's mixer state (None before the first token). ``seen``: positions
    processed so far, padding included (what ``generate()`` compares with the attention mask);
    ``next_position`` (B,): each row's number of real tokens so far, the position of its next
    token for learned position embeddings."""

    def __init__(self, num_layers: int):
        # not Cache.__init__: its per-layer key/value objects do not fit states of this kind
        self.layers = [None] * num_layers
        self.layer_class_to_replicate = None
        self.offloading = False
        self.seen = 0
        self.next_position: torch.Tensor | None = None

    def positions(self, batch: int, device) -> torch.Tensor:
        """(B,) the position of each row's next token."""
        if self.next_position is None:
            self.next_position = torch.zeros(batch, dtype=torch.long, device=device)
        return self.next_position

    def advance(self, length: int, mask: torch.Tensor | None) -> None:
        """``length`` positions processed; ``mask`` (B, length) False where they were padding (a
        row counts its real tokens only), None = no padding."""
        self.seen += length
        self.next_position = self.next_position + (length if mask is None else mask.long().sum(1))

    # --- what generate() and transformers' Cache API use --------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False          # a recurrent state cannot be rolled back to an earlier token

    @property
    def is_linear(self) -> list[bool]:
        # False: this cache counts positions (get_seq_length), so generate() may slice the input
        # ids of a continued generation by it
        return [False] * len(self.layers)

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self.layers)

    @property
    def batch_size(self) -> int:
        return -1 if self.next_position is None else len(self.next_position)

    def _map_rows(self, fn) -> None:
        self.layers = [map_tensors(fn, s) for s in self.layers]
        if self.next_position is not None:
            self.next_position = fn(self.next_position)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_rows(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_rows(lambda t: t[indices])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_rows(lambda t: t.repeat_interleave(repeats, dim=0))

    def reset(self) -> None:
        self.layers = [None] * len(self.layers)
        self.seen, self.next_position = 0, None

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise NotImplementedError("a recurrent state cannot be rolled back (assisted decoding needs that)")

    def activate_past_recording(self) -> None:
        raise NotImplementedError("a recurrent state cannot record its past (assisted decoding needs that)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layers={len(self.layers)}, seen={self.seen})"
