"""The generation cache: every block's recurrent state, so that ``generate()`` runs each new token
through the mixers' ``step`` forms (``mixers.py``) instead of re-reading the whole sequence. The
prompt itself is read in one parallel pass by the mixers that can also return their final state
(``forward_with_state``), token by token by the others.

To transformers it is a ``Cache`` whose layers are transformers' own cache layers, one per block,
each holding its mixer's ``step`` state in the terms transformers reads a state in:

* softmax attention (the Transformer): a key/value layer, :class:`KeyValueLayer` (transformers'
  ``DynamicLayer``): ``keys`` and ``values`` (batch, heads, t, head_dim), the growing KV cache,
  and ``real`` (batch, t), which of the t cached positions are tokens (the part of the attention
  mask the keys carry with them; padding anywhere, holes included, is False);
* the recurrent mixers: a linear-attention layer, :class:`RecurrentStateLayer` (transformers'
  ``LinearAttentionLayer``), a fixed-size state, so each generated token costs the same:
  ``conv_states[0]`` (batch, channels, K-1), the short convolution's last K-1 inputs with time on
  the last axis as transformers keeps a convolution's inputs (transformers' Mamba keeps K, the
  newest included, which the next token does not read), and ``recurrent_states[0]``:

  ==================  ===========================================  ===============================
  mixer               conv_states[0]                               recurrent_states[0]
  ==================  ===========================================  ===============================
  Mamba               (B, expand*hidden, K-1); none at width 0     h (B, expand*hidden, d_state)
  Mamba-2             (B, E + 2*groups*d_state, K-1)                h (B, heads, head_dim, d_state)
  DeltaNet            q, k, v windows side by side (B, 3*hidden,    S (B, heads, dk, dv)
                      K-1); none without short convolutions
  Gated DeltaNet      q, k, v windows (B, 2*key_dim + value_dim,    S (B, heads, dk, dv)
                      K-1)
  Based (attention)   none                                         [S | z] (B, heads, 1+F+F^2,
                                                                   head_dim+1): the state site's
  H3 (reference)      the shift SSM's register (B, hidden,         the diagonal SSM's state as a
                      d_state), oldest first                       real system (B, C, N/2, 2)
  H3 (mecheval-v1)    the shift register's window (B, hidden, N-1)  h (B, C, d_state)
  BaseConv (short)    (B, hidden, K-1)                             none
  Hyena               the short conv's window (B, 3*hidden, K-1)    none (see below)
  ==================  ===========================================  ===============================

* no transformers counterpart: a convolution whose filter is as long as the sequence (Hyena's long
  convolution, BaseConv's "long" layers, Based's when its convolutions are long) reads every input
  so far, so its state is the growing input history, ``input_history`` (batch, t, channels) of
  the same :class:`RecurrentStateLayer`. No transformers model has such a filter, and its cache
  layers have no place for it: ``conv_states`` are fixed-size windows and ``recurrent_states``
  fixed-size states;
* a plug-in's mixer that does not say how its state maps (``mixers.py``): :class:`MixerStateLayer`,
  the state as the mixer keeps it.

A mixer maps its ``step`` state onto its layer itself (``state_to_cache`` / ``state_from_cache``,
with the layer class as ``cache_layer_class``): the layers know transformers' layout, the mixers
their own. ``generate()`` keeps the cache between forwards, reorders it for beam search and
returns it with ``return_dict_in_generate``; ``get_seq_length``, ``is_initialized``,
``get_conv_state`` / ``get_recurrent_state``, ``has_previous_state``, ``reset`` and the batch
operations work as on transformers' caches. It cannot be cropped: a recurrent state cannot be
rolled back to an earlier token (assisted and prompt-lookup decoding need that).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer, LinearAttentionLayer


def map_tensors(fn, state):
    """``fn`` applied to every tensor of a (nested tuple / list / dict) state; None stays None."""
    if torch.is_tensor(state):
        return fn(state)
    if isinstance(state, (tuple, list)):
        return type(state)(map_tensors(fn, s) for s in state)
    if isinstance(state, dict):
        return {k: map_tensors(fn, v) for k, v in state.items()}
    return state


class StepStateLayer:
    """What the backbone asks of every layer of this cache: its mixer's ``step`` state out
    (``step_state``: None before the first token) and in (``hold``), through the mixer's own
    ``state_from_cache`` / ``state_to_cache``; and ``map_rows``, a function applied to every
    tensor along the batch (beam search's reordering and its kin)."""

    @property
    def holds_state(self) -> bool:
        raise NotImplementedError

    @property
    def is_initialized(self) -> bool:
        return self.holds_state

    @is_initialized.setter
    def is_initialized(self, value: bool) -> None:
        pass      # transformers' layers set it; here it follows what the layer holds

    def step_state(self, mixer):
        return mixer.state_from_cache(self) if self.holds_state else None

    def hold(self, mixer, state) -> None:
        mixer.state_to_cache(state, self)

    def map_rows(self, fn) -> None:
        raise NotImplementedError

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.map_rows(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.map_rows(lambda t: t[indices])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.map_rows(lambda t: t.repeat_interleave(repeats, dim=0))

    def reset(self) -> None:
        # the state is dropped, not zeroed in place as transformers' layers do: its tensors may be
        # views of tensors a caller still holds
        self.__init__()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise NotImplementedError("a recurrent state cannot be rolled back (assisted decoding needs that)")


class KeyValueLayer(StepStateLayer, DynamicLayer):
    """Softmax attention's ``step`` state: ``keys``, ``values`` (batch, heads, t, head_dim) and
    ``real`` (batch, t), False where a cached position is padding."""

    is_croppable = False      # the cache as a whole is not (see ``RecurrentCache``)

    def __init__(self):
        DynamicLayer.__init__(self)
        self.real: torch.Tensor | None = None

    @property
    def holds_state(self) -> bool:
        return self.keys is not None

    def store(self, keys: torch.Tensor, values: torch.Tensor, real: torch.Tensor) -> None:
        self.keys, self.values, self.real = keys, values, real
        self.device = keys.device

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """transformers' update (keys and values appended), the new positions counted as tokens."""
        real = key_states.new_ones(key_states.shape[0], key_states.shape[2], dtype=torch.bool)
        if self.holds_state:
            self.store(torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2),
                       torch.cat([self.real, real], dim=1))
        else:
            self.store(key_states, value_states, real)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def map_rows(self, fn) -> None:
        if self.holds_state:
            self.store(fn(self.keys), fn(self.values), fn(self.real))


class RecurrentStateLayer(StepStateLayer, LinearAttentionLayer):
    """A recurrent mixer's ``step`` state (module docstring's table): ``conv_states[0]`` (batch,
    channels, K-1), ``recurrent_states[0]``, and ``input_history`` (batch, t, channels) where the
    mixer convolves with a filter as long as the sequence (no transformers counterpart); each None
    where the mixer has no such part. Mixers read and write them through ``window`` (batch, K-1,
    channels: the layout of their ``ShortConv`` windows), ``recurrent`` and ``input_history``."""

    is_croppable = False
    is_compileable = False    # its states are replaced at each step, not copied in place

    def __init__(self):
        LinearAttentionLayer.__init__(self, number_of_states=1)
        self.input_history: torch.Tensor | None = None

    @property
    def holds_state(self) -> bool:
        return self.has_previous_state[0] or self.input_history is not None

    def store(self, window: torch.Tensor | None = None, recurrent: torch.Tensor | None = None,
              history: torch.Tensor | None = None) -> None:
        """The mixer's state after a token: its convolution's window (batch, K-1, channels), its
        recurrent state, its input history (batch, t, channels); None where it has none."""
        held = [t for t in (window, recurrent, history) if t is not None]
        self.device, self.dtype = held[0].device, held[0].dtype
        if window is not None:
            self.conv_states[0] = window.transpose(1, 2)                       # (B, C, K-1): time last
            self.conv_kernel_size[0] = window.shape[1]
            self.is_conv_states_initialized[0] = True
        if recurrent is not None:
            self.recurrent_states[0] = recurrent
            self.is_recurrent_states_initialized[0] = True
        self.has_previous_state[0] = window is not None or recurrent is not None
        self.input_history = history

    @property
    def window(self) -> torch.Tensor | None:
        """The convolution's last inputs as the mixers keep them, (batch, K-1, channels)."""
        return self.conv_states[0].transpose(1, 2) if self.is_conv_states_initialized[0] else None

    @property
    def recurrent(self) -> torch.Tensor | None:
        return self.recurrent_states[0] if self.is_recurrent_states_initialized[0] else None

    def map_rows(self, fn) -> None:
        if self.holds_state:
            self.store(None if self.window is None else fn(self.window),
                       None if self.recurrent is None else fn(self.recurrent),
                       None if self.input_history is None else fn(self.input_history))


class MixerStateLayer(StepStateLayer):
    """A mixer's ``step`` state as the mixer keeps it, for a mixer (a plug-in's) that does not map
    it onto transformers' layers: ``state``."""

    is_croppable = False
    is_compileable = False
    supports_early_init = False

    def __init__(self):
        self.state = None

    @property
    def holds_state(self) -> bool:
        return self.state is not None

    def step_state(self, mixer):
        return self.state

    def hold(self, mixer, state) -> None:
        self.state = state

    def map_rows(self, fn) -> None:
        self.state = map_tensors(fn, self.state)

    def get_max_length(self) -> int:
        return -1


class WindowAndRecurrentState:
    """The cache mapping of a mixer (Mamba, Mamba-2, H3's mecheval-v1 form) whose ``step`` state
    is (its short convolution's window (batch, K-1, channels) or None, its recurrent state): a
    base class before ``nn.Module``."""

    cache_layer_class = RecurrentStateLayer

    def state_to_cache(self, state, layer: RecurrentStateLayer) -> None:
        layer.store(window=state[0], recurrent=state[1])

    def state_from_cache(self, layer: RecurrentStateLayer):
        return layer.window, layer.recurrent


class QKVWindowsAndRecurrentState:
    """The cache mapping of a mixer (DeltaNet, Gated DeltaNet) whose ``step`` state is {"conv":
    its q, k and v convolutions' windows (batch, K-1, channels each) or None, "S": its recurrent
    state}: the windows side by side on the channels, as one convolution over the concatenated
    q, k, v would keep them (transformers' Gated DeltaNet has that one convolution)."""

    cache_layer_class = RecurrentStateLayer

    def state_to_cache(self, state: dict, layer: RecurrentStateLayer) -> None:
        windows = state["conv"]
        layer.store(window=None if windows is None else torch.cat(windows, dim=-1), recurrent=state["S"])

    def state_from_cache(self, layer: RecurrentStateLayer) -> dict:
        windows = layer.window
        if windows is not None:
            sizes = [conv.channels for conv in (self.q_conv1d, self.k_conv1d, self.v_conv1d)]
            windows = tuple(windows.split(sizes, dim=-1))
        return {"conv": windows, "S": layer.recurrent}


class RecurrentCache(Cache):
    """``layers[i]``: block i's layer (above), made by the block at its first token (None until
    then: its class depends on the mixer). ``seen``: positions processed so far, padding
    included (what ``generate()`` compares with the attention mask); ``next_position`` (B,): each
    row's number of real tokens so far, the position of its next token for learned position
    embeddings."""

    def __init__(self, num_layers: int):
        super().__init__(layers=[None] * num_layers)
        self.seen = 0
        self.next_position: torch.Tensor | None = None

    def layer_for(self, index: int, mixer) -> StepStateLayer:
        """Block ``index``'s layer, made for its ``mixer`` on first use."""
        if self.layers[index] is None:
            self.layers[index] = getattr(mixer, "cache_layer_class", MixerStateLayer)()
        return self.layers[index]

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
        # every layer has seen the same positions; transformers' linear-attention layers keep no
        # count of their own, so the cache keeps it for all
        return self.seen

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.seen + query_length, 0

    @property
    def is_initialized(self) -> bool:
        return all(layer is not None and layer.holds_state for layer in self.layers)

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False          # a recurrent state cannot be rolled back to an earlier token

    @property
    def is_linear(self) -> list[bool]:
        # False: this cache counts positions (get_seq_length), so generate() may slice the input
        # ids of a continued generation by it (it does not for a cache of linear layers only)
        return [False] * len(self.layers)

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self.layers)

    @property
    def batch_size(self) -> int:
        return -1 if self.next_position is None else len(self.next_position)

    def _each_row_operation(self, operation: str, argument) -> None:
        """One of transformers' batch operations (``reorder_cache``, ``batch_select_indices``,
        ``batch_repeat_interleave``) on every layer and on ``next_position``, held meanwhile in a
        layer of its own."""
        positions = MixerStateLayer()
        positions.state = self.next_position
        for layer in [*self.layers, positions]:
            if layer is not None:
                getattr(layer, operation)(argument)
        self.next_position = positions.state

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._each_row_operation("reorder_cache", beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._each_row_operation("batch_select_indices", indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._each_row_operation("batch_repeat_interleave", repeats)

    def reset(self) -> None:
        for layer in self.layers:
            if layer is not None:
                layer.reset()
        self.seen, self.next_position = 0, None

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise NotImplementedError("a recurrent state cannot be rolled back (assisted decoding needs that)")

    def activate_past_recording(self) -> None:
        raise NotImplementedError("a recurrent state cannot record its past (assisted decoding needs that)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layers={self.layers}, seen={self.seen})"
