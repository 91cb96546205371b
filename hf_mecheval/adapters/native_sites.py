"""Residual-stream sites on a transformers causal LM, for the intervention engine.

A transformers model has no named identity modules like ours (``models/sites.py``), so a site
here is a ``HookPoint``: an object with ``register_forward_hook(fn)`` like a module's, which
hooks the decoder layer (or its mixer) itself and hands ``fn`` the residual-stream tensor
(batch, length, hidden) whatever the layer's calling convention (hidden states as the first
positional argument or as ``hidden_states=``; a tensor or a tuple as output):

    layers.L.input         the residual stream entering decoder layer L (forward pre-hook)
    layers.L.mixer_output  what the layer's token mixer adds to it (``attn``, ``self_attn``,
                           ``mixer``, ...: first element of its output), where the layer has one
    layers.L.output        the residual stream leaving layer L (forward hook)

The decoder layers are the first ``nn.ModuleList`` whose length is ``config.num_hidden_layers``
(``transformer.h`` in GPT-2, ``model.layers`` in Llama / Mistral / Qwen, ``backbone.layers`` in
Mamba / Mamba-2).
"""
from __future__ import annotations

import torch

from ..errors import MechEvalError
from ..models.modeling_mecheval import at_least_float32

# names of a decoder layer's token mixer across transformers families, most common first
MIXER_NAMES = ("self_attn", "attn", "mixer", "attention", "self_attention", "linear_attn", "token_mixer")


class HookPoint:
    """One site: ``register_forward_hook(fn)`` calls ``fn(hook_point, inputs, hidden)`` with the
    site's tensor (batch, length, hidden); a tensor ``fn`` returns replaces it. Returns the
    torch hook handle (``.remove()``)."""

    def __init__(self, name: str, module: torch.nn.Module, entering: bool):
        self.name, self.module, self.entering = name, module, entering

    def register_forward_hook(self, fn):
        if self.entering:
            def before(module, args, kwargs):
                # the residual stream is the first positional argument, or hidden_states=
                if args:
                    replaced = fn(self, args, args[0])
                    return None if replaced is None else ((replaced, *args[1:]), kwargs)
                replaced = fn(self, (), kwargs["hidden_states"])
                return None if replaced is None else (args, {**kwargs, "hidden_states": replaced})

            return self.module.register_forward_pre_hook(before, with_kwargs=True)

        def after(module, args, output):
            # decoder layers and attention modules return a tensor or a tuple led by it
            hidden = output[0] if isinstance(output, tuple) else output
            replaced = fn(self, args, hidden)
            if replaced is None:
                return None
            return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

        return self.module.register_forward_hook(after)

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r} on {type(self.module).__name__})"


def find_decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """(path, layers): the first ModuleList of the model as long as its config's num_hidden_layers."""
    count = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and count and len(module) == count:
            return path, module
    raise MechEvalError(f"cannot find the decoder layers of {type(model).__name__}: no nn.ModuleList of "
                        f"num_hidden_layers={count} modules; interventions need one")


def find_mixer(layer: torch.nn.Module) -> torch.nn.Module | None:
    for name in MIXER_NAMES:
        mixer = getattr(layer, name, None)
        if isinstance(mixer, torch.nn.Module):
            return mixer
    return None


class NativeSites:
    """A transformers causal LM seen through its sites (see the module's docstring)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.layers_path, self.layers = find_decoder_layers(model)
        self.lm_head = model.get_output_embeddings()
        if self.lm_head is None:
            raise MechEvalError(f"{type(model).__name__} has no output embeddings (LM head): not a causal LM")
        self._sites: dict[str, HookPoint] = {}
        for index, layer in enumerate(self.layers):
            self._sites[f"layers.{index}.input"] = HookPoint(f"layers.{index}.input", layer, entering=True)
            mixer = find_mixer(layer)
            if mixer is not None:
                name = f"layers.{index}.mixer_output"
                self._sites[name] = HookPoint(name, mixer, entering=False)
            self._sites[f"layers.{index}.output"] = HookPoint(f"layers.{index}.output", layer, entering=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def site_names(self) -> list[str]:
        return list(self._sites)

    def get_site(self, name: str) -> HookPoint:
        if name not in self._sites:
            raise MechEvalError(f"unknown site {name!r}; valid sites: {', '.join(self._sites)}")
        return self._sites[name]

    def final_hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L) -> (B, L, D): the last hidden states, after the model's final norm (what the
        LM head reads)."""
        return self.model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state

    def answer_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(R, D) final hidden states -> (R, V) logits in float32 or wider (as the engine's), with the
        family's final scaling if any."""
        logits = at_least_float32(self.lm_head(hidden))
        config = self.model.config
        cap = getattr(config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        scale = getattr(config, "logit_scale", None)
        if isinstance(scale, (int, float)) and not isinstance(scale, bool):
            logits = logits * scale
        return logits


def native_sites(model: torch.nn.Module) -> NativeSites:
    return model if isinstance(model, NativeSites) else NativeSites(model)
