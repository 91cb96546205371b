"""A patched state of a time-invariant linear SSM, without its state trajectory.

The intervention grid replaces a mixer's whole state at one position of a row by the clean run's
(``Site.patching_entries``), which it read there (``Site.reading_entries``). Through the site, that means building the trajectory (B, L, C, M)
and running the recurrence again from the patch (``sites.rerun_from_patched_states``): for H3 at
width 256 (C = 512 outer-product channels, M = 1 024 real state coordinates, 37 tokens) 74 MiB
per patched row, and over 95 % of H3's grid time. For a system whose transition and readout do not depend on
the input (H3's diagonal SSMs), the patch's effect on the output has a closed form:

    x_t = T x_{t-1} + b u_t (per channel c, x (C, M) in real coordinates),  y_t = r . x_t (+ skip)

    state at p before the patch:  x_p = sum_{j <= p} T^j b u_{p-j}            ("response", T^j b)
    patch e = x'_p - x_p:         y_{p+j} += r T^j e       for j = 0 .. L-1-p  ("readout",  r T^j)

so each (row, position) costs two small contractions over lags and state coordinates:
``lti_states_at`` computes x_p (what the grid reads from the clean run, without its trajectory
either), ``lti_state_patch_effect`` Δy. The readable reference it is tested against is the
trajectory through the site, hooked (``tests/models/test_h3_reference.py``, and the engine's
grid both ways in ``tests/interventions/test_engine.py``).
"""
from __future__ import annotations

import torch


def lti_states_at(u: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                  response: torch.Tensor) -> torch.Tensor:
    """The state of row ``rows[i]`` at ``positions[i]``: x_p = sum_j T^j b u_{p-j}.

    u:         (B, L, C) the SSM's input
    rows, positions: (K,) (a row may appear more than once)
    response:  (L, C, *state) T^j b, the state j steps after a unit input
    Returns (K, C, *state) in response's dtype.
    """
    L = u.shape[1]
    lags = torch.arange(L, device=u.device)                                    # (L,)
    back = positions[:, None] - lags                                           # (K, L): p - j
    # the input j steps before each position, (K, L, C); zero before the row starts
    window = u[rows[:, None], back.clamp(min=0)] * (back >= 0)[..., None].to(u.dtype)
    states = torch.einsum("jcm,kjc->kcm", response.flatten(2), window.to(response.dtype))   # (K, C, M)
    return states.unflatten(2, response.shape[2:])


def lti_state_patch_effect(u: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, values: torch.Tensor,
                           response: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
    """What replacing the state of row ``rows[i]`` at ``positions[i]`` by ``values[i]`` adds to the
    SSM's output, each row patched at most once (a second patch of a row would replace a state the
    first already changed: not a sum of their effects).

    u:         (B, L, C) the SSM's input
    rows:      (K,) distinct rows;  positions: (K,) one position in each
    values:    (K, C, *state) the whole state there, in real coordinates
    response:  (L, C, *state) T^j b, the state j steps after a unit input
    readout:   (L, C, *state) r T^j, the output j steps after a unit state coordinate
    Returns Δy (B, L, C) in u's dtype: zero before each patch and in rows not patched.
    """
    B, L, C = u.shape
    change = values.to(response.dtype) - lti_states_at(u, rows, positions, response)   # (K, C, *state): e
    effect = torch.einsum("jcm,kcm->kjc", readout.flatten(2), change.flatten(2))      # (K, L, C): r T^j e
    # lag j lands at p + j, where it is still inside the row
    at = positions[:, None] + torch.arange(L, device=u.device)                # (K, L)
    inside = at < L
    delta = u.new_zeros(B, L, C)
    delta[rows[:, None].expand_as(at)[inside], at[inside]] = effect[inside].to(u.dtype)
    return delta
