"""The shared backbone and the Hugging Face model classes of all nine architectures.

    token embedding (+ learned positions when max_position_embeddings > 0)
      -> num_hidden_layers x Block -> final LayerNorm -> LM head tied to the embedding (no bias)

    Block (pre-norm, residual stream in and out):
      r = r + mixer(norm(r));   r = r + mlp(norm(r))   (where the architecture has an MLP)

The backbone never branches on the architecture: the config names each layer's mixer, the
block norm and whether there is an MLP. Every activation an intervention may touch flows
through a named :class:`~.sites.Site` (see ``sites.py`` for the vocabulary).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput
from transformers.modeling_utils import slice_logits_to_keep

from ..errors import MechEvalError
from . import configuration_mecheval as cfg
from .mixers import at_positions, mixer_class
from .sites import Site

IGNORE_INDEX = -100


class RMSNorm(nn.Module):
    """x / rms(x) * weight (weight only): Mamba's block norm."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MLP(nn.Module):
    """d -> intermediate -> d with GELU."""

    def __init__(self, config):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


def _norm(config) -> nn.Module:
    if config.block_norm == "rmsnorm":
        return RMSNorm(config.hidden_size, config.layer_norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class Block(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.input = Site("residual stream entering the block, (batch, length, hidden)")
        self.mixer_norm = _norm(config)
        self.mixer_input = Site("normalised residual stream entering the mixer")
        self.mixer = mixer_class(config.layer_mixers()[layer_idx])(config, layer_idx)
        self.mixer_output = Site("mixer output, before the residual addition")
        if config.use_mlp:
            self.mlp_norm = _norm(config)
            self.mlp_input = Site("normalised residual stream entering the MLP")
            self.mlp = MLP(config)
            self.mlp_output = Site("MLP output, before the residual addition")
        else:
            self.mlp = None
        self.output = Site("residual stream leaving the block")

    def forward(self, r: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        # r: (B, L, D) residual stream. keep: (B, k) positions; when given (last block, training),
        # the MLP runs at those positions only and the block returns (B, k, D): the mixer mixes
        # along the sequence, but the MLP is per position and nothing later reads other positions.
        # A mixer with ``accepts_keep`` (attention, H3, Mamba, Mamba-2) also computes its output there only.
        r = self.input(r)
        x = self.mixer_input(self.mixer_norm(r))
        if keep is not None and getattr(self.mixer, "accepts_keep", False):
            r = at_positions(r, keep) + self.mixer_output(self.mixer(x, keep=keep))
        else:
            r = r + self.mixer_output(self.mixer(x))
            if keep is not None:
                r = at_positions(r, keep)
        if self.mlp is not None:
            r = r + self.mlp_output(self.mlp(self.mlp_input(self.mlp_norm(r))))
        return self.output(r)

    def step(self, r_t: torch.Tensor, state):
        """Recurrent form for one token: r_t (B, D)."""
        y, state = self.mixer.step(self.mixer_norm(r_t), state)
        r_t = r_t + y
        if self.mlp is not None:
            r_t = r_t + self.mlp(self.mlp_norm(r_t))
        return r_t, state


class MechEvalPreTrainedModel(PreTrainedModel):
    config_class = cfg.MechEvalConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm, RMSNorm)):
            init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        # Mixers with parameters that need their own scheme (SSM A, dt, D, ...). Children are
        # initialised before their parent, so this runs after the generic Linear rule above.
        if hasattr(module, "init_mecheval_parameters") and not all(
            getattr(p, "_is_hf_initialized", False) for p in module.parameters(recurse=False)
        ):
            module.init_mecheval_parameters()


class MechEvalModel(MechEvalPreTrainedModel):
    """The backbone: returns the final (normed) residual stream."""

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size)
            if config.max_position_embeddings > 0 else None
        )
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: (B, L) -> (B, L, D)
        x = self.embed_tokens(input_ids)
        if self.embed_positions is not None:
            L = input_ids.shape[1]
            if L > self.config.max_position_embeddings:
                raise MechEvalError(f"sequence length {L} exceeds max_position_embeddings "
                                    f"{self.config.max_position_embeddings}")
            x = x + self.embed_positions(torch.arange(L, device=input_ids.device))
        return x

    def forward(self, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, keep_positions: torch.Tensor | None = None,
                **kwargs) -> BaseModelOutput:
        """keep_positions: optional (B, k) positions; the last block's per-position work and the
        output are then restricted to them (last_hidden_state is (B, k, D))."""
        # attention_mask is accepted for API compatibility only: documents are right-padded and
        # every mixer is causal, so padding never influences a real position.
        if (input_ids is None) == (inputs_embeds is None):
            raise MechEvalError("pass exactly one of input_ids and inputs_embeds")
        r = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        hidden = [r] if output_hidden_states else None
        last = len(self.layers) - 1
        for i, block in enumerate(self.layers):
            r = block(r, keep_positions if i == last else None)
            if output_hidden_states:
                hidden.append(r)
        r = self.norm_f(r)
        return BaseModelOutput(last_hidden_state=r, hidden_states=tuple(hidden) if hidden else None)

    # ------------------------------------------------------------------ intervention sites
    def site_names(self) -> list[str]:
        """All intervention sites, e.g. ``layers.0.input`` … ``layers.1.mixer.state``."""
        return [name for name, m in self.named_modules() if isinstance(m, Site)]

    def get_site(self, name: str) -> Site:
        module = dict(self.named_modules()).get(name)
        if not isinstance(module, Site):
            raise MechEvalError(f"unknown site {name!r}; valid sites: {', '.join(self.site_names())}")
        return module

    def materialize_sites(self, flag: bool = True) -> None:
        """Make mixers materialise every internal site (e.g. state trajectories) even without hooks."""
        for m in self.modules():
            if isinstance(m, Site):
                m.materialize = flag

    def use_functional_path(self, flag: bool = True) -> None:
        """Make mixers avoid what ``torch.func`` transforms such as ``vmap`` cannot batch (SDPA in
        attention), so the model runs stacked. (The custom autograd functions — Mamba's fused
        scan, H3's kernel taps, the direct causal convolution — have vmap rules of their own.)"""
        for m in self.modules():
            if hasattr(m, "functional_path"):
                m.functional_path = flag

    def step(self, token: torch.Tensor, position: int, state: list | None):
        """Recurrent form: one token (B,) at ``position``; returns (final hidden (B, D), state)."""
        x = self.embed_tokens(token)
        if self.embed_positions is not None:
            x = x + self.embed_positions.weight[position]
        state = state or [None] * len(self.layers)
        new_state = []
        for block, s in zip(self.layers, state):
            x, s = block.step(x, s)
            new_state.append(s)
        return self.norm_f(x), new_state


class MechEvalForCausalLM(MechEvalPreTrainedModel):
    """Backbone + LM head tied to the embedding.

    Loss on the answer only: with ``labels`` (-100 except the answer, as the task datasets
    give them), only the positions that predict a label go through the LM head; when every
    row has exactly one label, ``logits`` is (batch, 1, vocab) at that position. Without labels,
    ``logits_to_keep`` selects positions as in transformers (int = last k; 1D tensor = these
    positions; 2D (batch, k) integer tensor = per-row positions); default all.
    """

    # the loss is a mean over the batch's answers: the Trainer must divide it by the gradient
    # accumulation steps itself (it skips that for models that take num_items_in_batch)
    accepts_loss_kwargs = False

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.model = MechEvalModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def site_names(self) -> list[str]:
        return self.model.site_names()

    def get_site(self, name: str) -> Site:
        return self.model.get_site(name)

    def materialize_sites(self, flag: bool = True) -> None:
        self.model.materialize_sites(flag)

    def forward(self, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                logits_to_keep: int | torch.Tensor = 0, inputs_embeds: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs) -> CausalLMOutput:
        loss, keep = None, None
        if labels is not None and not output_hidden_states:
            # position t predicts labels[t + 1]; with one label per row (the tasks' answer-only
            # loss) only the predicting position needs the last block's MLP and the LM head
            mask = labels[:, 1:] != IGNORE_INDEX                               # (B, L-1)
            observed = any(m.wanted() for m in self.model.layers[-1].modules() if isinstance(m, Site))
            if not observed and bool((mask.sum(1) == 1).all()):
                keep = mask.float().argmax(1)[:, None]                         # (B, 1)
        out = self.model(input_ids=input_ids, inputs_embeds=inputs_embeds,
                         output_hidden_states=output_hidden_states, keep_positions=keep)
        h = out.last_hidden_state                                              # (B, L or 1, D)
        if keep is not None:
            logits = self.lm_head(h)                                           # (B, 1, V)
            loss = F.cross_entropy(logits[:, 0].float(), labels.gather(1, keep + 1)[:, 0])
        elif labels is not None:
            targets = labels[:, 1:]
            logits = self.lm_head(h)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(),
                                   ignore_index=IGNORE_INDEX)
        else:
            logits = self.lm_head(slice_logits_to_keep(h, logits_to_keep))
        return CausalLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)

    @torch.no_grad()
    def step_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, L, V) computed token by token through every mixer's recurrent form."""
        state, outs = None, []
        for t in range(input_ids.shape[1]):
            h, state = self.model.step(input_ids[:, t], t, state)
            outs.append(self.lm_head(h))
        return torch.stack(outs, dim=1)


# ------------------------------------------------------------- one class pair per architecture
class MechEvalTransformerModel(MechEvalModel):
    config_class = cfg.TransformerConfig


class MechEvalTransformerForCausalLM(MechEvalForCausalLM):
    config_class = cfg.TransformerConfig


class MechEvalBasedModel(MechEvalModel):
    config_class = cfg.BasedConfig


class MechEvalBasedForCausalLM(MechEvalForCausalLM):
    config_class = cfg.BasedConfig


class MechEvalBaseConvModel(MechEvalModel):
    config_class = cfg.BaseConvConfig


class MechEvalBaseConvForCausalLM(MechEvalForCausalLM):
    config_class = cfg.BaseConvConfig


class MechEvalH3Model(MechEvalModel):
    config_class = cfg.H3Config


class MechEvalH3ForCausalLM(MechEvalForCausalLM):
    config_class = cfg.H3Config


class MechEvalHyenaModel(MechEvalModel):
    config_class = cfg.HyenaConfig


class MechEvalHyenaForCausalLM(MechEvalForCausalLM):
    config_class = cfg.HyenaConfig


class MechEvalMambaModel(MechEvalModel):
    config_class = cfg.MambaConfig


class MechEvalMambaForCausalLM(MechEvalForCausalLM):
    config_class = cfg.MambaConfig


class MechEvalDeltaNetModel(MechEvalModel):
    config_class = cfg.DeltaNetConfig


class MechEvalDeltaNetForCausalLM(MechEvalForCausalLM):
    config_class = cfg.DeltaNetConfig


class MechEvalMamba2Model(MechEvalModel):
    config_class = cfg.Mamba2Config


class MechEvalMamba2ForCausalLM(MechEvalForCausalLM):
    config_class = cfg.Mamba2Config


class MechEvalGatedDeltaNetModel(MechEvalModel):
    config_class = cfg.GatedDeltaNetConfig


class MechEvalGatedDeltaNetForCausalLM(MechEvalForCausalLM):
    config_class = cfg.GatedDeltaNetConfig


# architecture -> (config, base model, causal LM)
MODEL_CLASSES = {
    "transformer": (cfg.TransformerConfig, MechEvalTransformerModel, MechEvalTransformerForCausalLM),
    "based": (cfg.BasedConfig, MechEvalBasedModel, MechEvalBasedForCausalLM),
    "baseconv": (cfg.BaseConvConfig, MechEvalBaseConvModel, MechEvalBaseConvForCausalLM),
    "h3": (cfg.H3Config, MechEvalH3Model, MechEvalH3ForCausalLM),
    "hyena": (cfg.HyenaConfig, MechEvalHyenaModel, MechEvalHyenaForCausalLM),
    "mamba": (cfg.MambaConfig, MechEvalMambaModel, MechEvalMambaForCausalLM),
    "deltanet": (cfg.DeltaNetConfig, MechEvalDeltaNetModel, MechEvalDeltaNetForCausalLM),
    "mamba2": (cfg.Mamba2Config, MechEvalMamba2Model, MechEvalMamba2ForCausalLM),
    "gated_deltanet": (cfg.GatedDeltaNetConfig, MechEvalGatedDeltaNetModel, MechEvalGatedDeltaNetForCausalLM),
}
