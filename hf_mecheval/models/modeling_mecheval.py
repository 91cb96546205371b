"""The shared backbone and the Hugging Face model classes of every registered architecture.

    token embedding (+ learned positions when max_position_embeddings > 0)
      -> num_hidden_layers x Block -> final LayerNorm -> LM head tied to the embedding (no bias)

    Block (pre-norm, residual stream in and out):
      r = r + mixer(norm(r));   r = r + mlp(norm(r))   (where the architecture has an MLP)

The backbone never branches on the architecture: the config names each layer's mixer, the
block norm and whether there is an MLP. Every activation an intervention may touch flows
through a named :class:`~.sites.Site` (see ``sites.py`` for the vocabulary).

``attention_mask`` (1 = token, 0 = padding) is honoured: a left-padded row gives the logits of
the same row unpadded (each mixer keeps padding out of what it mixes along the sequence, and
learned positions count real tokens only); right padding cannot change a causal model's real
positions. Padding between tokens (holes) is honoured where every mixer can hide a key wherever
it stands (softmax attention: the Transformer): a row with holes gives the logits of the row
without them. Elsewhere it is refused (``padding_mask``): a recurrent mixer cannot skip a token
in the middle of a sequence.

Generation: with ``use_cache=True`` (as ``generate()`` passes it) the forward runs every token
through the mixers' recurrent ``step`` forms, keeping their states in a ``RecurrentCache`` (one
transformers cache layer per block), so a new token costs one step, not a forward over the whole
sequence.

This file and the files it imports (all relative imports, all in this folder) are the model's
whole code: ``save_pretrained`` writes them beside the weights with an ``auto_map`` in
config.json, so a checkpoint loads with ``trust_remote_code=True`` where hf-mecheval is not
installed (``save_remote_code``).
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import slice_logits_to_keep
from transformers.utils.generic import can_return_tuple

from .builtin_architectures import (MechEvalBaseConvConfig, MechEvalBasedConfig, MechEvalDeltaNetConfig,
                                    MechEvalGatedDeltaNetConfig, MechEvalH3Config, MechEvalHyenaConfig,
                                    MechEvalMamba2Config, MechEvalMambaConfig, MechEvalTransformerConfig)
from .configuration_mecheval import MechEvalConfig
from .errors import MechEvalError
from .mixers import at_positions
from .recurrent_cache import RecurrentCache
from .registry import ArchitectureSpec, mixer_class, on_register, spec_for_config
from .sites import Site

IGNORE_INDEX = -100


def at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """Logits as the loss and the probabilities read them: in float32 or wider (a half-precision
    model's are widened, a float64 model's stay float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def scored_positions(targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """targets (..., T): what each position is scored on (IGNORE_INDEX: not scored) ->
    (positions (..., k), their targets (..., k)): each row's scored positions in increasing order,
    k the most any row has; a row with fewer is filled up with position 0 and IGNORE_INDEX."""
    scored = targets != IGNORE_INDEX
    k = max(int(scored.sum(-1).max()) if scored.numel() else 0, 1)
    # scored positions first, each group in increasing order (a stable sort of 0 = scored, 1 = not)
    order = torch.sort((~scored).to(torch.uint8), dim=-1, stable=True).indices[..., :k]
    kept = scored.gather(-1, order)
    positions = torch.where(kept, order, torch.zeros_like(order))
    return positions, torch.where(kept, targets.gather(-1, positions), torch.full_like(positions, IGNORE_INDEX))


def logits_and_loss_at_answers(lm_head: nn.Module, h: torch.Tensor, targets: torch.Tensor, with_logits: bool = True
                               ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """h (B, k, D) at each row's scored positions, targets (B, k) as ``scored_positions`` gives them
    -> (logits (B, k, V), or None without ``with_logits``; the mean cross entropy over the scored
    slots). A row with fewer answers than k is padded with position 0, so its padding slots share
    one hidden state: the LM head runs once per scored slot and once per padded row, and a padding
    slot's logits are its row's. (In MQAR's mixed batches 44 % of the slots are padding, and the
    head and the loss over every slot were about a third of Mamba's training step at width 64.
    The (B, k, V) copy of the logits, which a training step skips, is 1-2 % of its step.)"""
    B, k, _ = h.shape
    scored = targets != IGNORE_INDEX                                           # (B, k): scored slots first
    first_pad = scored.sum(1, keepdim=True).clamp(max=k - 1).expand(B, k)       # (B, k)
    slots = torch.arange(k, device=h.device).expand(B, k)
    source = torch.where(scored, slots, first_pad) + k * torch.arange(B, device=h.device)[:, None]
    rows, inverse = torch.unique(source.flatten(), return_inverse=True)        # (R,), (B * k,)
    logits = lm_head(h.flatten(0, 1)[rows])                                    # (R, V)
    loss = F.cross_entropy(at_least_float32(logits), targets.flatten()[rows], ignore_index=IGNORE_INDEX)
    return (logits[inverse].unflatten(0, (B, k)) if with_logits else None), loss


# Rows grouped by the tokens they need ------------------------------------------------------
# A training batch is padded to its longest document, but with the answer-only loss a row needs
# its tokens only up to its last scored position: a causal model computes each position from the
# positions before it, so the rest of the row changes nothing the loss reads. Where rows need very
# different lengths (ATR's grammars: documents of a median 30 tokens in batches padded to 258 on
# average; MQAR's mixture: 64 and 128 tokens) the backbone runs once per group of rows of similar
# length, each group cut to its longest need. The values are the batch's own to float rounding
# (the same arithmetic per row, in smaller matrices); a batch whose rows all need the same length
# (AR) runs exactly as before, in one call.

# what one more backbone call costs, in token-rows of arithmetic (calls' fixed costs: each
# operator's dispatch and allocations, forward and backward); chosen by
# benchmarks/bench_length_groups.py
GROUP_CALL_TOKENS = 256


def length_groups(needed: torch.Tensor, call_tokens: int = GROUP_CALL_TOKENS) -> list[tuple[torch.Tensor, int]]:
    """needed (B,): the tokens each row needs -> [(rows (b,), length)], groups of rows, longest first,
    each to be cut to ``length`` (its longest need), that minimise sum(b x length) + call_tokens x
    groups; one group of every row in order where no split saves more than its calls cost.

    Groups are runs of the rows sorted by need (an optimal grouping never interleaves them), found
    by dynamic programming over the distinct needs: best[j] = min over i < j of best[i] + (rows
    needing the i-th to the j-th largest) x (the i-th largest need) + call_tokens."""
    lengths, counts = torch.unique(needed, sorted=True, return_counts=True)
    if len(lengths) == 1:
        return [(torch.arange(len(needed), device=needed.device), int(lengths[0]))]
    lengths, counts = lengths.flip(0).tolist(), counts.flip(0).tolist()          # longest first
    rows_through = [0]
    for c in counts:
        rows_through.append(rows_through[-1] + c)                                # rows needing >= lengths[j]
    best, cut = [0.0] + [math.inf] * len(lengths), [0] * (len(lengths) + 1)
    for j in range(1, len(lengths) + 1):
        for i in range(j):                 # one group: the needs lengths[i] .. lengths[j-1], cut to lengths[i]
            cost = best[i] + (rows_through[j] - rows_through[i]) * lengths[i] + call_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], len(lengths)
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    if len(bounds) == 1:
        return [(torch.arange(len(needed), device=needed.device), lengths[0])]
    groups = []
    for i, j in reversed(bounds):
        rows = torch.nonzero((needed <= lengths[i]) & (needed >= lengths[j - 1])).flatten()
        groups.append((rows, lengths[i]))
    return groups


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

    reference_init = {"fc_out": "residual"}      # the reference's fc2 (``reference_linear_init``)

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


def has_holes(mask: torch.Tensor) -> bool:
    """Whether a row of ``mask`` (B, T) bool, True = token, has padding between two of its tokens
    (more than one run of tokens)."""
    runs = mask[:, 0].long() + (mask[:, 1:] & ~mask[:, :-1]).sum(1)              # runs of tokens per row
    return bool((runs > 1).any())


def padding_mask(attention_mask: torch.Tensor | None, length: int, holes_allowed: bool = False) -> torch.Tensor | None:
    """attention_mask (B, T) of 1 = token, 0 = padding, T >= length (with a cache it covers the
    past too) -> its last ``length`` columns as a bool mask, or None where none of them is padding.
    Unless ``holes_allowed`` (every mixer hides a padded key wherever it stands), each row must be
    one run of tokens, padded before and/or after it; anything else is refused."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape[1] < length:
        raise MechEvalError(f"attention_mask must be (batch, length >= {length}), got shape "
                            f"{tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    if not holes_allowed and has_holes(mask):
        raise MechEvalError("attention_mask has padding between the tokens of a row: only left and right "
                            "padding can be honoured (a recurrent mixer cannot skip a token inside a sequence)")
    mask = mask[:, -length:]
    return None if bool(mask.all()) else mask


class Block(GradientCheckpointingLayer):
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

    def forward(self, r: torch.Tensor, keep: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                output_attentions: bool = False):
        # r: (B, L, D) residual stream. keep: (B, k) positions; when given (last block, training),
        # the MLP runs at those positions only and the block returns (B, k, D): the mixer mixes
        # along the sequence, but the MLP is per position and nothing later reads other positions.
        # A mixer with ``accepts_keep`` (attention, H3, Mamba, Mamba-2) also computes its output there only.
        # mask: (B, L) padding mask (see padding_mask) or None. With ``output_attentions``:
        # (output, the mixer's attention probabilities (B, H, L, L), or None where it has none).
        r = self.input(r)
        x = self.mixer_input(self.mixer_norm(r))
        weights = None
        wants_weights = output_attentions and getattr(self.mixer, "returns_attentions", False)
        if keep is not None and getattr(self.mixer, "accepts_keep", False) and not wants_weights:
            r = at_positions(r, keep) + self.mixer_output(self.mixer(x, keep=keep, mask=mask))
        else:
            if wants_weights:
                y, weights = self.mixer(x, mask=mask, output_attentions=True)  # the probabilities y is made of
            else:
                y = self.mixer(x, mask=mask)
            r = r + self.mixer_output(y)
            if keep is not None:
                r = at_positions(r, keep)
        if self.mlp is not None:
            r = r + self.mlp_output(self.mlp(self.mlp_input(self.mlp_norm(r))))
        r = self.output(r)
        return (r, weights) if output_attentions else r

    def forward_cached(self, r: torch.Tensor, layer, mask: torch.Tensor | None = None,
                       output_attentions: bool = False):
        """The block continuing from its mixer's recurrent state, held in ``layer``, its layer of the
        generation cache (``recurrent_cache.py``; empty at the start), which it updates: r (B, L, D)
        -> (r out (B, L, D), attention probabilities or None). A fresh state comes from the
        mixer's parallel ``forward_with_state`` where it has one (a prompt in one pass), else
        from its ``step``, token by token. Sites are not visited."""
        state = layer.step_state(self.mixer)
        x = self.mixer_norm(r)
        weights = None
        if output_attentions and getattr(self.mixer, "returns_attentions", False):
            weights = self.mixer.attention_weights(x, mask, state)           # (no gradients in generation)
        if state is None and hasattr(self.mixer, "forward_with_state"):
            y, state = self.mixer.forward_with_state(x, mask)
        else:
            steps = []
            for t in range(x.shape[1]):
                y_t, state = self.mixer.step(x[:, t], state, None if mask is None else mask[:, t])
                steps.append(y_t)
            y = torch.stack(steps, dim=1)                                       # (B, L, D)
        layer.hold(self.mixer, state)
        r = r + y
        if self.mlp is not None:
            r = r + self.mlp(self.mlp_norm(r))
        return r, weights


REFERENCE_INIT_RULE = "_mecheval_reference_init"     # attribute the rule is kept under on each Linear


def mark_reference_init(root: nn.Module) -> None:
    """Tag every Linear that a module under ``root`` names in its ``reference_init`` ({child Linear:
    rule}) with that rule, for ``_init_weights``: transformers initialises module by module, and
    only modules that own parameters, so the rule has to live on the Linear itself."""
    for module in root.modules():
        for name, rule in getattr(module, "reference_init", {}).items():
            setattr(getattr(module, name), REFERENCE_INIT_RULE, rule)


def reference_linear_init(linear: nn.Linear, rule: str, config) -> None:
    """Draw a Linear's weight as the reference's code does, by its rule (n = num_hidden_layers):

      "residual":               N(0, initializer_range / sqrt(2n))   (its out_proj / fc2 rule)
      "torch_default":          U(+-1/sqrt(fan_in))                  (nn.Linear's own init, kept by
                                                                      mamba-ssm's Mamba)
      "torch_default_residual": U(+-1/sqrt(fan_in)) / sqrt(n)        (Mamba's out_proj)

    Biases are 0, as everywhere. Loaded weights are left alone (transformers' ``init`` skips them)."""
    n = config.num_hidden_layers
    weight = linear.weight                                                     # (out, in)
    if rule == "residual":
        init.normal_(weight, mean=0.0, std=config.initializer_range / math.sqrt(2 * n))
    elif rule in ("torch_default", "torch_default_residual"):
        bound = 1 / math.sqrt(weight.shape[1])
        if rule == "torch_default_residual":
            bound /= math.sqrt(n)
        init.uniform_(weight, -bound, bound)
    else:
        raise ValueError(f"reference_init: unknown rule {rule!r} (residual, torch_default, torch_default_residual)")
    if linear.bias is not None:
        init.zeros_(linear.bias)


class MechEvalPreTrainedModel(PreTrainedModel):
    config_class = MechEvalConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = True      # every Block is a GradientCheckpointingLayer

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        rule = getattr(module, REFERENCE_INIT_RULE, None) if self.config.init_scheme == "reference" else None
        if isinstance(module, nn.Linear) and rule is not None:      # a projection the reference draws its own way
            reference_linear_init(module, rule, self.config)
        elif isinstance(module, nn.Linear):
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

    def save_pretrained(self, save_directory, *args, is_main_process: bool = True, **kwargs):
        """transformers' save_pretrained, plus this model's code and ``auto_map`` (``save_remote_code``)."""
        spec = spec_for_config(type(self.config))
        if spec.builtin:
            self.config.auto_map = auto_map(type(self.config))
        else:
            # the remote code (this folder) does not hold a plug-in's mixers: the checkpoint reloads
            # where hf-mecheval and the plug-in are installed, and says which plug-in that is
            self.config.__dict__.pop("auto_map", None)
            self.config.mecheval_plugin = spec.package
        super().save_pretrained(save_directory, *args, is_main_process=is_main_process, **kwargs)
        if is_main_process and spec.builtin:
            save_remote_code(save_directory)


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
        self.gradient_checkpointing = False
        mark_reference_init(self)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def add_positions(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, L, D) or (B, D) + the learned embedding of ``positions`` ((B, L) or (B,); default
        0 .. L-1) where the model has position embeddings."""
        if self.embed_positions is None:
            return x
        if positions is None:
            longest, positions = x.shape[1], torch.arange(x.shape[1], device=x.device)
        else:
            longest = int(positions.max()) + 1 if positions.numel() else 0
        if longest > self.config.max_position_embeddings:
            raise MechEvalError(f"sequence length {longest} exceeds max_position_embeddings "
                                f"{self.config.max_position_embeddings}")
        return x + self.embed_positions(positions)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: (B, L) -> (B, L, D), the residual stream entering layer 0
        return self.add_positions(self.embed_tokens(input_ids))

    @can_return_tuple
    def forward(self, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cache: RecurrentCache | None = None,
                use_cache: bool | None = None, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, keep_positions: torch.Tensor | None = None,
                **kwargs) -> BaseModelOutputWithPast:
        """keep_positions: optional (B, k) positions; the last block's per-position work and the
        output are then restricted to them (last_hidden_state is (B, k, D)). inputs_embeds: token
        embeddings (positions are added). With ``use_cache`` or a ``cache``: continued from the
        cache's state (``forward_cached``); the cache comes back updated. ``use_cache``,
        ``output_hidden_states``, ``output_attentions`` and ``return_dict`` default to the config's.
        hidden_states: the embeddings and each block's output, (B, L, D) each; attentions: each
        layer's attention probabilities (B, H, L, keys), None for a layer without softmax
        attention, or None altogether where the model has none."""
        if (input_ids is None) == (inputs_embeds is None):
            raise MechEvalError("pass exactly one of input_ids and inputs_embeds")
        output_hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_attentions = output_attentions and any(getattr(b.mixer, "returns_attentions", False) for b in self.layers)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds      # (B, L, D)
        holes_allowed = all(getattr(block.mixer, "masks_any_position", False) for block in self.layers)
        mask = padding_mask(attention_mask, x.shape[1], holes_allowed)
        if use_cache and cache is None:
            cache = RecurrentCache(len(self.layers))
        if cache is not None and keep_positions is not None:
            raise MechEvalError("keep_positions cannot be combined with a cache: the cache needs every position")
        if cache is None and mask is not None and not holes_allowed and bool(mask[:, 0].all()):
            # right padding only: it cannot reach earlier positions, which count from 0 anyway. Softmax
            # attention keeps the mask, as transformers' attention models do: a generation continued
            # after right padding reads a padded position's output, which must be the cached forward's
            mask = None
        # a real token's position counts the real tokens before it (left padding shifts nothing),
        # after those the cache has seen
        positions = None if mask is None else (mask.long().cumsum(1) - 1).clamp(min=0)
        if cache is not None:
            offsets = torch.arange(x.shape[1], device=x.device) if positions is None else positions
            positions = cache.positions(x.shape[0], x.device)[:, None] + offsets                  # (B, L)
        r = self.add_positions(x, positions)
        hidden = [r] if output_hidden_states else None
        attentions = [] if output_attentions else None
        last = len(self.layers) - 1
        for i, block in enumerate(self.layers):
            if cache is not None:
                r, weights = block.forward_cached(r, cache.layer_for(i, block.mixer), mask, output_attentions)
            elif output_attentions:
                r, weights = block(r, keep_positions if i == last else None, mask, output_attentions=True)
            else:
                r = block(r, keep_positions if i == last else None, mask)
            if output_hidden_states:
                hidden.append(r)
            if output_attentions:
                attentions.append(weights)
        if cache is not None:
            cache.advance(x.shape[1], mask)
        return BaseModelOutputWithPast(last_hidden_state=self.norm_f(r), cache=cache,
                                       hidden_states=tuple(hidden) if hidden else None,
                                       attentions=tuple(attentions) if attentions else None)

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
        """Make mixers avoid what ``torch.func`` transforms such as ``vmap`` cannot batch (SDPA:
        attention runs eager whatever ``attn_implementation`` says), so the model runs stacked.
        (The custom autograd functions — Mamba's fused scan, H3's kernel taps, the direct causal
        convolution — have vmap rules of their own.)"""
        for m in self.modules():
            if hasattr(m, "functional_path"):
                m.functional_path = flag


def answer_one_token(generation_config) -> None:
    """Make ``generate()`` (and ``pipeline``) answer as the tasks' documents do, by default: one
    token, greedily."""
    generation_config.do_sample = False
    generation_config.max_new_tokens = 1


class MechEvalForCausalLM(MechEvalPreTrainedModel, GenerationMixin):
    """Backbone + LM head tied to the embedding.

    Loss on the answers only: with ``labels`` (-100 except the answers, as the task datasets
    give them), only the positions that predict a label go through the LM head; when every
    row has exactly one label, ``logits`` is (batch, 1, vocab) at that position; when rows have
    several (MQAR: one per query), (batch, k, vocab) at each row's scored positions in order
    (``scored_positions``: k the most of any row, the rest of a shorter row at position 0, not
    scored), and the loss is the mean over every label of the batch. Without labels,
    ``logits_to_keep`` selects positions as in transformers (int = last k; 1D tensor = these
    positions; 2D (batch, k) integer tensor = per-row positions); default all.

    ``generate()`` works as for any transformers causal LM, greedy or sampling, with the
    recurrent cache; by default (``generation_config``) it answers one token greedily, as the
    tasks' documents end with one answer.
    """

    # the loss is a mean over the batch's answers: the Trainer must divide it by the gradient
    # accumulation steps itself (it skips that for models that take num_items_in_batch)
    accepts_loss_kwargs = False
    # its cache is a recurrent state that cannot be rolled back: generate() refuses assisted and
    # prompt-lookup decoding for it with its own message
    _is_stateful = True

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config):
        super().__init__(config)
        # the architecture's own backbone class: it says what the architecture supports (such as
        # attn_implementation "sdpa"), which transformers checks again when the backbone is built
        self.model = MODEL_CLASSES[spec_for_config(type(config)).name][1](config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
        answer_one_token(self.generation_config)
        self.generation_config.use_cache = True       # generate() with the recurrent cache, whatever config.use_cache

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False     # not transformers' key/value cache: the forward makes a RecurrentCache

    def _get_stopping_criteria(self, *args, **kwargs):
        # generate() reads max_position_embeddings as the longest sequence; here 0 means "no
        # position embeddings" (any length), so it must not warn that 0 tokens were exceeded
        criteria = super()._get_stopping_criteria(*args, **kwargs)
        for criterion in criteria:
            if getattr(criterion, "max_position_embeddings", None) == 0:
                criterion.max_position_embeddings = None
        return criteria

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

    @can_return_tuple
    def forward(self, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                logits_to_keep: int | torch.Tensor = 0, inputs_embeds: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cache: RecurrentCache | None = None,
                use_cache: bool | None = None, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, skip_logits: bool = False, **kwargs) -> CausalLMOutputWithPast:
        """labels (B, L): position t is scored on labels[t + 1] (-100 = not scored); or keyword
        ``shift_labels`` (B, L), already shifted: position t on shift_labels[t] (as transformers'
        loss takes them; they win over labels). Not a named parameter: the Trainer would take it
        for a label column it must gather. ``skip_logits``: the loss alone, ``logits`` None (a
        training step reads nothing else; with several answers a row the (B, k, V) logits are a
        copy the loss never needed)."""
        loss, keep = None, None
        shift_labels = kwargs.pop("shift_labels", None)
        output_hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        use_cache = self.config.use_cache if use_cache is None else use_cache
        # targets[:, t]: what position t is scored on
        targets = shift_labels if shift_labels is not None else None if labels is None else labels[:, 1:]
        if skip_logits and targets is None:
            raise MechEvalError("skip_logits=True returns the loss alone, so it needs labels (or shift_labels)")
        kept_targets = None
        if targets is not None and not output_hidden_states and not use_cache and cache is None:
            # with one scored position per row (the tasks' answer-only loss) only that position
            # needs the last block's MLP and the LM head; with several (one per query), only those
            scored = targets != IGNORE_INDEX                                   # (B, L or L-1)
            observed = any(m.wanted() for m in self.model.layers[-1].modules() if isinstance(m, Site))
            if not observed and bool((scored.sum(1) == 1).all()):
                keep = scored.float().argmax(1)[:, None]                       # (B, 1)
            elif not observed and bool(scored.any()):
                keep, kept_targets = scored_positions(targets)                 # (B, k) each
        out = self._backbone(input_ids, inputs_embeds, attention_mask, keep, cache=cache, use_cache=use_cache,
                             output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        h = out.last_hidden_state                                              # (B, L or k, D)
        if kept_targets is not None:
            logits, loss = logits_and_loss_at_answers(self.lm_head, h, kept_targets,   # logits (B, k, V)
                                                      with_logits=not skip_logits)
        elif keep is not None:
            logits = self.lm_head(h)                                           # (B, 1, V)
            loss = F.cross_entropy(at_least_float32(logits[:, 0]), targets.gather(1, keep)[:, 0])
        elif targets is not None:
            logits = self.lm_head(h)
            scored = logits[:, :targets.shape[1]]
            loss = F.cross_entropy(at_least_float32(scored.flatten(0, 1)), targets.flatten(), ignore_index=IGNORE_INDEX)
        else:
            logits = self.lm_head(slice_logits_to_keep(h, logits_to_keep))
        if skip_logits:
            logits = None
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=out.cache, hidden_states=out.hidden_states,
                                      attentions=out.attentions)

    def answer_states(self, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                      attention_mask: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The last hidden state at the answer-predicting positions alone, for evaluation: the LM
        head turns each into its answer's logits (``logits = lm_head(h)``) in as many pieces as
        suit the caller, where ``forward`` returns every row's k slots of logits at once (with 256
        MQAR documents of up to 64 queries a batch, that copy and a softmax over it took most of an
        evaluation). labels (B, L) as ``forward`` takes them -> (h (n, D) of the batch's n answers
        in row-major order, slots (B, k) bool: which of each row's k slots hold an answer, answers
        (B, k): the labels in those slots, IGNORE_INDEX elsewhere; as ``scored_positions`` gives
        them)."""
        positions, answers = scored_positions(labels[:, 1:])                   # (B, k) each
        slots = answers != IGNORE_INDEX                                        # (B, k)
        # a site observed in the last block needs every position (as in forward)
        observed = any(m.wanted() for m in self.model.layers[-1].modules() if isinstance(m, Site))
        keep = None if observed else positions
        h = self._backbone(input_ids, inputs_embeds, attention_mask, keep, use_cache=False).last_hidden_state
        if keep is None:                                                       # (B, L, D) -> (B, k, D)
            h = h.gather(1, positions[..., None].expand(-1, -1, h.shape[-1]))
        return h[slots], slots, answers

    def _backbone(self, input_ids, inputs_embeds, attention_mask, keep, **model_kwargs) -> BaseModelOutputWithPast:
        """The backbone's output; with ``keep`` (B, k) only at those positions (B, k, D), the rows
        run in ``length_groups``'s groups where that saves time (right padding only: every row
        starts at position 0)."""
        if keep is not None and attention_mask is None:
            groups = length_groups(keep.max(1).values + 1, GROUP_CALL_TOKENS)
            if len(groups) > 1:
                return BaseModelOutputWithPast(last_hidden_state=self._backbone_by_groups(input_ids, inputs_embeds,
                                                                                          keep, groups))
        return self.model(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                          keep_positions=keep, return_dict=True, **model_kwargs)

    def _backbone_by_groups(self, input_ids, inputs_embeds, keep, groups) -> torch.Tensor:
        """The backbone's output at ``keep`` (B, k) with the rows run in ``length_groups``'s groups,
        each cut to its length: (B, k, D), rows in the batch's order."""
        outputs = []
        for rows, length in groups:
            ids = None if input_ids is None else input_ids[rows, :length]
            embeds = None if inputs_embeds is None else inputs_embeds[rows, :length]
            outputs.append(self.model(input_ids=ids, inputs_embeds=embeds, keep_positions=keep[rows],
                                      return_dict=True).last_hidden_state)                 # (b, k, D)
        order = torch.cat([rows for rows, _ in groups])                                     # batch row of each
        return torch.cat(outputs)[torch.argsort(order)]


# ------------------------------------------------------------- one class pair per architecture
# config.json's "architectures" and "auto_map" name these classes, and transformers' Auto classes
# map each config class to them (``models/__init__.py``). A built-in architecture's pair is written
# out here; a plug-in's is made when it registers (``_add_model_classes``): its checkpoints carry
# no remote code, so its classes need no name in this module.

class MechEvalTransformerModel(MechEvalModel):
    """The transformer backbone."""
    config_class = MechEvalTransformerConfig
    _supports_sdpa = True       # attn_implementation "sdpa" (the default) or "eager" (mixer_transformer.py)


class MechEvalTransformerForCausalLM(MechEvalForCausalLM):
    """The transformer causal LM."""
    config_class = MechEvalTransformerConfig
    _supports_sdpa = True


class MechEvalBasedModel(MechEvalModel):
    """The based backbone."""
    config_class = MechEvalBasedConfig


class MechEvalBasedForCausalLM(MechEvalForCausalLM):
    """The based causal LM."""
    config_class = MechEvalBasedConfig


class MechEvalBaseConvModel(MechEvalModel):
    """The baseconv backbone."""
    config_class = MechEvalBaseConvConfig


class MechEvalBaseConvForCausalLM(MechEvalForCausalLM):
    """The baseconv causal LM."""
    config_class = MechEvalBaseConvConfig


class MechEvalH3Model(MechEvalModel):
    """The h3 backbone."""
    config_class = MechEvalH3Config


class MechEvalH3ForCausalLM(MechEvalForCausalLM):
    """The h3 causal LM."""
    config_class = MechEvalH3Config


class MechEvalHyenaModel(MechEvalModel):
    """The hyena backbone."""
    config_class = MechEvalHyenaConfig


class MechEvalHyenaForCausalLM(MechEvalForCausalLM):
    """The hyena causal LM."""
    config_class = MechEvalHyenaConfig


class MechEvalMambaModel(MechEvalModel):
    """The mamba backbone."""
    config_class = MechEvalMambaConfig


class MechEvalMambaForCausalLM(MechEvalForCausalLM):
    """The mamba causal LM."""
    config_class = MechEvalMambaConfig


class MechEvalDeltaNetModel(MechEvalModel):
    """The deltanet backbone."""
    config_class = MechEvalDeltaNetConfig


class MechEvalDeltaNetForCausalLM(MechEvalForCausalLM):
    """The deltanet causal LM."""
    config_class = MechEvalDeltaNetConfig


class MechEvalMamba2Model(MechEvalModel):
    """The mamba2 backbone."""
    config_class = MechEvalMamba2Config


class MechEvalMamba2ForCausalLM(MechEvalForCausalLM):
    """The mamba2 causal LM."""
    config_class = MechEvalMamba2Config


class MechEvalGatedDeltaNetModel(MechEvalModel):
    """The gated_deltanet backbone."""
    config_class = MechEvalGatedDeltaNetConfig


class MechEvalGatedDeltaNetForCausalLM(MechEvalForCausalLM):
    """The gated_deltanet causal LM."""
    config_class = MechEvalGatedDeltaNetConfig


MODEL_CLASSES: dict[str, tuple[type, type, type]] = {}
"""Architecture name -> (config, base model, causal LM), for every registered architecture."""


def _add_model_classes(spec: ArchitectureSpec) -> None:
    """Record the architecture's class pair: the one written out above for a built-in (checked
    against its spec's names and config), a pair made now for a plug-in."""
    classes = []
    for name, base in ((spec.model_class_name, MechEvalModel), (spec.causal_lm_class_name, MechEvalForCausalLM)):
        written = globals().get(name)
        if spec.builtin:
            if written is None or written.config_class is not spec.config_class:
                raise MechEvalError(f"built-in architecture {spec.name!r}: modeling_mecheval.py has no class {name} "
                                    f"of {spec.config_class.__name__}; write its class pair there")
            classes.append(written)
            continue
        if written is not None:
            raise MechEvalError(f"architecture {spec.name!r}: the class name {name} is a built-in one's")
        made = type(name, (base,), {"config_class": spec.config_class, "__module__": spec.config_class.__module__,
                                    "__doc__": f"{base.__name__} of the {spec.name} architecture."})
        made.__qualname__ = name
        classes.append(made)
    MODEL_CLASSES[spec.name] = (spec.config_class, *classes)


on_register(_add_model_classes)


def auto_map(config_class: type) -> dict[str, str]:
    """config.json's ``auto_map`` for an architecture's config class: where transformers finds the
    classes in the code files beside the weights (with ``trust_remote_code=True``)."""
    _, model_class, lm_class = MODEL_CLASSES[spec_for_config(config_class).name]
    config_module = config_class.__module__.rpartition(".")[2]          # its mixer file, e.g. mixer_mamba
    return {"AutoConfig": f"{config_module}.{config_class.__name__}",
            "AutoModel": f"modeling_mecheval.{model_class.__name__}",
            "AutoModelForCausalLM": f"modeling_mecheval.{lm_class.__name__}"}


def remote_code_files() -> list[Path]:
    """The model's whole code: this file and every file it imports relatively, recursively (all in
    this folder; transformers' own rule for which files a remote-code model needs)."""
    from transformers.dynamic_module_utils import get_relative_import_files

    here = Path(__file__).resolve()
    return [here, *sorted({Path(f) for f in get_relative_import_files(str(here))})]


def save_remote_code(folder) -> list[Path]:
    """Copy ``remote_code_files()`` into ``folder`` (a saved model, whose config.json names them in
    its ``auto_map``). Works from the installed package and from a checkpoint's own copy alike."""
    written = []
    for source in remote_code_files():
        target = Path(folder) / source.name
        if source != target.resolve():
            shutil.copyfile(source, target)
        written.append(target)
    return written

