"""The intervention engine: plain forward hooks on named sites, batched, resuming the forward at
the patched layer.

For a batch of (clean, corrupted) document pairs it runs

1. the clean documents once, caching every requested site at the positions to patch only
   (one row per (position name, document): (P*B, ...) instead of (B, L, ...) per site);
2. the corrupted documents once, caching the residual stream entering every layer;
3. for each site in layer L: the corrupted residual at ``layers.L.input`` is repeated once per
   position to patch (all positions in one batch) and only blocks L.. run, with a hook that
   replaces the site's activation at that row's position by the clean one.

Memory per batch is proportional to the batch: the cached activations, and the patched runs of
one site (P*B rows). ``grid.run_grid`` measures it on one document and picks a batch that fits.

So the grid costs one forward of the late layers per (site, position set) instead of one full
forward per cell. Exact shortcuts: a patch after the query (or nowhere) leaves the corrupted
prediction (computed anyway at ``layers.L.input``, L >= 1, as the causality check);
``layers.L.output`` is patched as ``layers.{L+1}.input`` (the same tensor), and the last layer's
output needs no layer at all. Models expose the backbone protocol of ``MechEvalForCausalLM``:
``model.model.embed``, ``model.model.layers`` (blocks taking and returning the residual stream),
``model.model.norm_f``, ``model.lm_head``, and ``get_site(name)``.

transformers' own causal LMs (``--architecture hf:...``) go through ``FullForwardEngine`` with the
sites of ``adapters.native_sites``: the same cells, each patched run a whole forward
(``engine_for`` picks the engine).
"""
from __future__ import annotations

import contextlib
import re

import torch

from ..errors import MechEvalError
from ..models.modeling_mecheval import at_least_float32

_LAYER = re.compile(r"^layers\.(\d+)\.")


def site_layer(name: str) -> int:
    match = _LAYER.match(name)
    if not match:
        raise MechEvalError(f"site {name!r} is not inside a layer (expected layers.L....)")
    return int(match.group(1))


@contextlib.contextmanager
def hooked(module: torch.nn.Module, fn):
    handle = module.register_forward_hook(fn)
    try:
        yield
    finally:
        handle.remove()


class InterventionEngine:
    """``entry_access``: where a site's mixer reads and patches entries itself
    (``Site.reading_entries`` / ``patching_entries``: H3's state, whose trajectory (R, L, C, N)
    it then never builds), hand it the positions instead of hooking the site; False hooks every
    site (the same cells to float rounding)."""

    def __init__(self, model: torch.nn.Module, entry_access: bool = True):
        for attr in ("model", "lm_head", "get_site", "site_names"):
            if not hasattr(model, attr):
                raise MechEvalError(f"{type(model).__name__} is not an hf-mecheval model (it lacks `{attr}`)")
        self.model = model.eval()
        self.backbone = model.model
        self.entry_access = entry_access

    # ------------------------------------------------------------------ pieces
    def answer_probs(self, final: torch.Tensor, query_pos: torch.Tensor, answer: torch.Tensor):
        """final: (R, L, D) residual after the last block -> (p(answer), answer logit, argmax) at query_pos."""
        rows = torch.arange(final.shape[0], device=final.device)
        logits = self.answer_logits(final[rows, query_pos])                                 # (R, V)
        probs = torch.softmax(logits, dim=-1)
        return probs[rows, answer], logits[rows, answer], logits.argmax(-1)

    def answer_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(R, D) residual after the last block -> (R, V) logits in float32 or wider (a half-precision
        model's are widened; a float64 model's stay float64)."""
        return at_least_float32(self.model.lm_head(self.backbone.norm_f(h)))

    @property
    def num_layers(self) -> int:
        return len(self.backbone.layers)

    def site_names(self) -> list[str]:
        return list(self.model.site_names())

    def check_sites(self, sites: list[str]) -> None:
        """Refuse a site the model does not have, naming the valid ones."""
        valid = self.site_names()
        unknown = [s for s in sites if s not in valid]
        if unknown:
            raise MechEvalError(f"unknown site {unknown[0]!r}; valid sites: {', '.join(valid)}")

    def resume_sites(self) -> list[str]:
        """What the corrupted run caches so that patched runs can start at the patched layer."""
        return [f"layers.{i}.input" for i in range(self.num_layers)]

    def patched_rows(self, site: str, src: torch.Tensor, pos: torch.Tensor, values: torch.Tensor,
                     corrupt: dict[str, torch.Tensor], final_corrupt: torch.Tensor,
                     corrupt_ids: torch.Tensor) -> torch.Tensor:
        """Final residual (R, L, D) of corrupted example ``src[r]`` (R,) with ``site`` patched at
        ``pos[r]`` (R,) by ``values[r]`` (R, ...), the clean run's activation there."""
        layer = site_layer(site)
        rows = torch.arange(len(src), device=src.device)
        if site == f"layers.{self.num_layers - 1}.output":
            # the last block's output is the final residual: patch it, no layer to run
            final = final_corrupt[src].clone()
            final[rows, pos] = values
            return final
        # layers.L.output is exactly what block L+1 receives: patching it means patching
        # layers.{L+1}.input, which runs one block fewer
        start, target = ((layer + 1, f"layers.{layer + 1}.input") if site == f"layers.{layer}.output"
                         else (layer, site))
        # one row per live (position name, example): all positions of this site in one batch
        base = corrupt[f"layers.{start}.input"][src]                            # (R, L, D)
        return self.run_patched(target, base, rows, pos, values)

    def run_layers(self, r: torch.Tensor, start: int) -> torch.Tensor:
        for block in self.backbone.layers[start:]:
            r = block(r)
        return r

    @torch.no_grad()
    def cache(self, input_ids: torch.Tensor, sites: list[str],
              at: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Full forward caching the outputs of ``sites``; returns (final residual, cache).

        Each site's whole activation (B, L, ...), or with ``at`` = (rows (R,), positions (R,)) only
        the activation of row ``rows[r]`` at ``positions[r]``, (R, ...): what patching reads, kept
        without the rest (a state trajectory (B, L, C, N) of which a handful of positions are
        patched would otherwise stay in memory whole, for every site at once)."""
        store: dict[str, torch.Tensor] = {}

        def keep(module, inputs, output, name):
            # indexing copies the rows out, so the whole activation is freed once the model drops it
            store[name] = output.detach() if at is None else output.detach()[at[0], at[1]]

        modules = {name: self.model.get_site(name) for name in sites}
        by_entries = [n for n in sites if at is not None and self._by_entries(modules[n])]
        handles = [modules[name].register_forward_hook(
            lambda m, i, o, name=name: keep(m, i, o, name)) for name in sites if name not in by_entries]
        try:
            with contextlib.ExitStack() as stack:
                found = {n: stack.enter_context(modules[n].reading_entries(*at)) for n in by_entries}
                final = self.full_forward(input_ids)
        finally:
            for h in handles:
                h.remove()
        store.update({n: entries[0] for n, entries in found.items()})
        return final, store

    def _by_entries(self, site: torch.nn.Module) -> bool:
        """Whether ``site`` is read and patched by handing its mixer the positions
        (``Site.entry_access``) rather than by hooks."""
        return self.entry_access and getattr(site, "entry_access", False)

    def full_forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(R, L) tokens -> (R, L, D) residual after the last block."""
        return self.run_layers(self.backbone.embed(input_ids), 0)

    def run_from(self, site: str, base: torch.Tensor) -> torch.Tensor:
        """The final residual of a run from ``site``'s layer: ``base`` is the residual entering
        that layer in the base run, (R, L, D)."""
        return self.run_layers(base, site_layer(site))

    # ------------------------------------------------------------------ patching
    @torch.no_grad()
    def patched_final(self, site: str, base_input: torch.Tensor, positions: torch.Tensor,
                      source: torch.Tensor, source_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Run from the layer of ``site`` with the site's activation replaced at given positions.

        base_input: (R, L, D) residual entering layer(site) in the base (corrupted) run (for
                    ``FullForwardEngine``: the base run's tokens, (R, L); see ``run_from``).
        positions:  (R, k) positions to patch in each row (k >= 1; -1 = none).
        source:     (S, L, ...) the site's activation in the source (clean) run; row r takes its
                    values from source row ``source_rows[r]`` (R,), default r % S (so rows can
                    share one source batch without copying it per row).
        Returns the final residual (R, L, D).
        """
        rows = torch.arange(base_input.shape[0], device=base_input.device)[:, None].expand_as(positions)
        valid = positions >= 0
        r_idx, p_idx = rows[valid], positions[valid]
        s_idx = source_rows[r_idx] if source_rows is not None else r_idx % source.shape[0]
        return self.run_patched(site, base_input, r_idx, p_idx, source[s_idx, p_idx])

    @torch.no_grad()
    def run_patched(self, site: str, base_input: torch.Tensor, r_idx: torch.Tensor, p_idx: torch.Tensor,
                    values: torch.Tensor) -> torch.Tensor:
        """Run from the layer of ``site`` (``base_input`` as in ``patched_final``) with the site's
        activation at row ``r_idx[i]``, position ``p_idx[i]`` replaced by ``values[i]``
        (r_idx, p_idx (K,); values (K, ...)). Returns the final residual (R, L, D)."""
        module = self.model.get_site(site)
        if self._by_entries(module) and len(r_idx.unique()) == len(r_idx):
            with module.patching_entries(r_idx, p_idx, values):
                return self.run_from(site, base_input)

        def patch(module, inputs, output):
            # a state site shows a copy made for it (``Site.shows_copy``): patched in place, which
            # spares a copy of the largest activation there is ((R, L, C, N) for H3); any other
            # site's output may be a tensor that the model also uses unpatched, so it is copied
            if not getattr(module, "shows_copy", False):
                output = output.clone()
            output[r_idx, p_idx] = values.to(output.dtype)
            return output

        with hooked(module, patch):
            return self.run_from(site, base_input)

    @torch.no_grad()
    def run(self, clean_ids: torch.Tensor, corrupt_ids: torch.Tensor, positions: dict[str, torch.Tensor],
            query_pos: torch.Tensor, answer: torch.Tensor, sites: list[str]) -> dict:
        """All cells for one batch.

        positions: name -> (B,) position per example. Returns per-example tensors:
        ``p_clean``, ``p_corrupt``, ``logit_clean``, ``logit_corrupt``, ``pred_clean``,
        ``pred_corrupt`` (B,) and ``p_patched[site][position name]`` (B,).
        """
        self.check_sites(sites)
        names = list(positions)
        B = clean_ids.shape[0]
        stacked = torch.stack([positions[n] for n in names]).reshape(-1)        # (P*B,) name-major
        example = torch.arange(B, device=stacked.device).repeat(len(names))     # (P*B,)
        # the clean activations only where they are patched in: row i of clean[site] (P*B, ...)
        # is example[i]'s activation at stacked[i] (-1, no patch, reads position 0, never used)
        final_clean, clean = self.cache(clean_ids, sites, at=(example, stacked.clamp(min=0)))
        final_corrupt, corrupt = self.cache(corrupt_ids, self.resume_sites())
        p_clean, logit_clean, pred_clean = self.answer_probs(final_clean, query_pos, answer)
        del final_clean                                                         # (B, L, D), read once
        p_corrupt, logit_corrupt, pred_corrupt = self.answer_probs(final_corrupt, query_pos, answer)
        out = {"p_clean": p_clean, "p_corrupt": p_corrupt, "logit_clean": logit_clean,
               "logit_corrupt": logit_corrupt, "pred_clean": pred_clean, "pred_corrupt": pred_corrupt,
               "p_patched": {}}
        # Every mixer is causal: a patch after the query (the answer position) or nowhere (-1)
        # cannot change the prediction at the query, which stays the corrupted run's, so those
        # rows are not run — except at the residual stream entering layers 1.. (layers.L.input),
        # where they are: the answer position's no-effect check (a patch after the query must
        # leave the prediction at the query unchanged) stays a real measurement there, and a
        # later mixer that leaked the future would show in it. (Entering layer 0 the
        # answer position holds the same token in both documents: a patch there changes nothing.)
        patched = stacked >= 0
        live = patched & (stacked <= query_pos[example])
        for site in sites:
            layer = site_layer(site)
            measured = layer > 0 and site == f"layers.{layer}.input"
            rows = (patched if measured else live).nonzero()[:, 0]
            p = p_corrupt[example].clone()                                      # (P*B,)
            if len(rows):
                src = example[rows]
                final = self.patched_rows(site, src, stacked[rows], clean[site][rows], corrupt, final_corrupt,
                                          corrupt_ids)
                p[rows] = self.answer_probs(final, query_pos[src], answer[src])[0]
            out["p_patched"][site] = {n: p[i * B:(i + 1) * B] for i, n in enumerate(names)}
        return out


class FullForwardEngine(InterventionEngine):
    """The same grid on a transformers causal LM (``adapters.NativeSites``): its decoder layers
    take arguments of the family's own (attention masks, rotary embeddings, caches), so patched
    runs are whole forwards from the corrupted tokens instead of resuming at the patched layer,
    and the final residual is the last hidden state after the model's final norm."""

    entry_access = False               # transformers' modules are read and patched through hooks only

    def __init__(self, sites):
        self.model = sites
        sites.model.eval()

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    def resume_sites(self) -> list[str]:
        return []

    def answer_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(R, D) last hidden states (after the model's final norm) -> (R, V) logits."""
        return self.model.answer_logits(h)

    def full_forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.final_hidden(input_ids)

    def run_from(self, site: str, base_ids: torch.Tensor) -> torch.Tensor:
        """A whole forward of the base run's tokens ``base_ids`` (R, L), the site patched on the way."""
        return self.model.final_hidden(base_ids)

    def patched_rows(self, site, src, pos, values, corrupt, final_corrupt, corrupt_ids):
        return self.run_patched(site, corrupt_ids[src], torch.arange(len(src), device=src.device), pos, values)


def engine_for(model) -> InterventionEngine:
    """The engine for one of our models (resuming at the patched layer) or for a transformers
    causal LM (``FullForwardEngine`` over its ``NativeSites``)."""
    from ..adapters.native_sites import NativeSites, native_sites

    if isinstance(model, NativeSites):
        return FullForwardEngine(model)
    if all(hasattr(model, attr) for attr in ("model", "lm_head", "get_site", "site_names")):
        return InterventionEngine(model)
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return FullForwardEngine(native_sites(model))
    return InterventionEngine(model)      # refuses it, naming what it lacks
