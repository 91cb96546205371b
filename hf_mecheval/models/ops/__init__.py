"""The math of the sequence mixers, kept apart from the modules (as flash-linear-attention does).

Each op module holds a readable reference (a plain loop over time, which can also return the
state trajectory an intervention reads or patches) next to the fast form used for training,
tested against each other in values and gradients, plus the homogeneous transition of its
recurrence, which carries a state patch to later positions (``sites.rerun_from_patched_states``).
Everything is plain torch (the one custom autograd function, the short convolution's, has a
generated vmap rule), so it runs under ``torch.func.vmap`` (stacked copies). Mixer files only
build parameters and dispatch.

* :mod:`.ssd` — Mamba-2's scalar-decay selective SSM (state-space duality, chunked form);
* :mod:`.gated_delta_rule` — the gated delta rule of Gated DeltaNet (chunked WY/UT form);
* :mod:`.short_conv` — the depthwise causal short convolution with a hand-written backward
  (``ShortConv``'s computation; the modules keep ``ShortConv`` for their parameters and ``step``).

Layout: sequences are (batch, length, heads, features), as the fused kernels of mamba-ssm and
flash-linear-attention take them, and so are state trajectories, (batch, length, heads, ...):
exactly the shape of a ``state`` site.

(Mamba-1's scans and DeltaNet's delta rule still live in their mixer files.)
"""
