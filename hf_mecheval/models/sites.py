"""Intervention sites: named identity modules that activations flow through.

Every activation an intervention may read or replace passes through a :class:`Site` module,
so it is reachable by name (``model.get_site("layers.1.input")``) and by plain torch forward
hooks, nnsight and pyvene alike: a forward hook that returns a tensor replaces the activation.

Standard sites, identical for every architecture (``L`` = layer index), all (batch, length, hidden):

=========================  ==========================================================
``layers.L.input``         residual stream entering block L
``layers.L.mixer_input``   normalised residual stream, the sequence mixer's input
``layers.L.mixer_output``  the mixer's output, before it is added to the residual stream
``layers.L.mlp_input``     normalised residual stream entering the MLP (where there is one)
``layers.L.mlp_output``    the MLP's output (where there is one)
``layers.L.output``        residual stream leaving block L
=========================  ==========================================================

Mixers declare their internal sites as Site attributes: ``layers.L.mixer.conv_output`` (the
short-convolution output, (batch, length, channels)) and ``layers.L.mixer.state`` (the
recurrent state trajectory).

What a patch at position p reaches. Only a state site *carries* the patch along its own
sequence: the recurrence is re-run from the patched state, so the state itself changes at every
later position of the layer (``Site.propagates`` is True). At every other site the activation
changes at p only; whatever reads it afterwards sees the change, and a component that mixes
along the sequence spreads it to later positions — the rest of the same mixer included: a patch
of Mamba's, Mamba-2's, H3's, Hyena's, DeltaNet's or Gated DeltaNet's ``conv_output`` at p reaches
later positions of that layer's output through its SSM, long convolution or delta rule
(BaseConv's gating does not mix, so there it stays at p until the next layer). ``propagates`` is
descriptive; nothing reads it.

Mixers skip materialising expensive internal sites (state trajectories) unless a torch hook is
registered on them (plain hooks, pyvene), a tool wrapped their ``forward`` (nnsight), or
``model.materialize_sites(True)`` was called — call it before using a tool that does neither.

Under nnsight, every module has ``.input`` and ``.output`` of its own, so a block's sites named
``input`` and ``output`` appear there as ``.E_input`` and ``.E_output`` (nnsight says so in a
warning when it wraps the model): ``layers[L].input`` is the block's input and
``layers[L].output`` its output, the same tensors as the sites ``layers.L.input`` and
``layers.L.output``; ``layers[L].E_input.output`` is the site itself.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn


class Site(nn.Module):
    """Identity; exists so that the activation has a name and a hook point."""

    # True once the site has shown a copy made for it alone (a state trajectory through
    # ``through_state_site``): a hook may then change the activation in place rather than clone
    # it first. Elsewhere the activation is the model's own tensor, which it may use unpatched.
    shows_copy = False

    def __init__(self, description: str, propagates_in_layer: bool = False, entry_access: bool = False):
        super().__init__()
        self.description = description
        self.propagates = propagates_in_layer
        # True where the mixer reads and patches whole entries itself (``reading_entries``,
        # ``patching_entries``) without building the activation: a time-invariant linear state
        # (H3's, ops_state_patch)
        self.entry_access = entry_access
        self.entry_read = None
        self.entry_patch = None

        self.materialize = False

    @contextlib.contextmanager
    def reading_entries(self, rows: torch.Tensor, positions: torch.Tensor):
        """While inside, every forward through the mixer appends to the list yielded the site's
        entries at row ``rows[i]``, position ``positions[i]`` ((K,) each): (K, ...), what a hook
        would read as ``output[rows, positions]``, without materialising the rest. Only for a
        site made with ``entry_access``; the intervention engine uses it."""
        self._check_entry_access()
        found: list[torch.Tensor] = []
        self.entry_read = (rows, positions, found)
        try:
            yield found
        finally:
            self.entry_read = None

    @contextlib.contextmanager
    def patching_entries(self, rows: torch.Tensor, positions: torch.Tensor, values: torch.Tensor):
        """While inside, the mixer replaces this site's whole entry at row ``rows[i]``, position
        ``positions[i]`` by ``values[i]`` ((K,), (K,), (K, ...); each row at most once), as a
        forward hook writing them would, without materialising the activation. Only for a site
        made with ``entry_access``; the intervention engine uses it."""
        self._check_entry_access()
        if len(rows.unique()) != len(rows):
            raise ValueError("patching_entries takes each row at most once")
        self.entry_patch = (rows, positions, values)
        try:
            yield
        finally:
            self.entry_patch = None

    def _check_entry_access(self) -> None:
        if not self.entry_access:
            raise TypeError(f"this site ({self.description}) is read and patched through hooks only")

    def wanted(self) -> bool:
        """Whether anyone may read or patch this site now: a hook is registered on it, its
        ``forward`` was replaced on the instance (nnsight does that to every module it wraps;
        so do accelerate's dispatch hooks), or ``materialize`` was set
        (``model.materialize_sites(True)``). Mixers use it to skip materialising expensive
        activations (recurrent state trajectories) nobody asked for."""
        return (self.materialize or bool(self._forward_hooks or self._forward_pre_hooks)
                or "forward" in self.__dict__)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return self.description


def rerun_from_patched_states(original: torch.Tensor, patched: torch.Tensor, transition,
                              in_place: bool = False) -> torch.Tensor:
    """State trajectory after patching, for a recurrence that is linear in its state.

    original, patched: (B, L, ...) state trajectories (``patched`` came back from a state Site).
    transition(t, e): the recurrence's homogeneous part applied to a state difference e at step
    t (e.g. ``a_t * e`` for a diagonal SSM), shape (B, ...) -> (B, ...).
    in_place: write the result into ``original`` (which the caller then no longer needs)
    instead of a copy of it: one (B, L, ...) trajectory fewer in memory. Not under autograd.

    Semantics: every state entry where ``patched`` differs from ``original`` is *replaced*;
    every other entry is recomputed by the recurrence from the resulting previous state, so a
    patch at position p reaches all later positions of the layer. Because the recurrence is
    linear in the state, the result is ``original + e`` with ``e_t = patched_t - original_t``
    at patched entries and ``e_t = transition(t, e_{t-1})`` elsewhere (``e_{-1} = 0``).
    (A patch that sets an entry to exactly its original value is indistinguishable from no
    patch there, and the entry is recomputed.)
    """
    result, e = None, None
    for t in range(original.shape[1]):
        # compared one step at a time, before step t of the result is written (with in_place,
        # original[:, t] is overwritten below): no (B, L, ...) mask beside the trajectories
        changed = patched[:, t] != original[:, t]                                  # (B, ...)
        if e is None:
            if not bool(changed.any()):
                continue                                   # nothing changes before the first patch
            result = original if in_place else original.clone()
        delta_t = patched[:, t] - original[:, t]
        e = delta_t if e is None else torch.where(changed, delta_t, transition(t, e))
        result[:, t] += e
    return original if result is None else result


def _own_places(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` has a place in memory of its own (a contiguous tensor or a
    permutation of one, not an expanded view), so that it can be written in place."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def through_state_site(site: Site, states: torch.Tensor, transition) -> torch.Tensor:
    """A state trajectory (B, L, ...) through its ``site``; returns the trajectory the layer goes on
    with: ``states`` where nobody patched, else ``rerun_from_patched_states``. The site shows a
    copy, so that a patch made in place (nnsight's assignments, the intervention engine's hook)
    is seen as well as a tensor that a hook returns, and compared with the states as computed.

    ``states`` is the mixer's own, used afterwards only through the returned trajectory: without
    autograd a patch is re-run into it in place (the copy it would otherwise take is the size of
    the largest activation of the layer: H3's (B, L, C, N))."""
    site.shows_copy = True
    shown = states.clone()
    version = shown._version
    # entries read or patched through the site's contexts while a hook observes it too: the patch
    # applied first, so that the hook, the read and the rest of the layer all see it
    if site.entry_patch is not None:
        rows, positions, values = site.entry_patch
        shown[rows, positions] = values.to(shown.dtype)
    if site.entry_read is not None:
        rows, positions, found = site.entry_read
        found.append(shown[rows, positions].detach())
    patched = site(shown)
    untouched = patched is shown and shown._version == version
    # where a hook returned another tensor, the copy is dropped here rather than kept alive
    # through the re-run beside states, patched and the result
    del shown
    if untouched:
        return states                                     # read, or not observed at all
    in_place = not states.requires_grad and _own_places(states)
    return rerun_from_patched_states(states, patched, transition, in_place=in_place)
