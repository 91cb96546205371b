"""K independent copies of one model, computed together: the stacked form used by stacked sweeps.

Every parameter of the K copies is stacked on a new leading dimension (``stacked[name]`` is
(K, *shape)) and the ordinary model's forward runs once under ``torch.func.vmap`` over that
dimension, with the stacked tensors swapped in by ``torch.func.functional_call``. vmap keeps the
copies mathematically independent (no operation mixes them), so copy k computes exactly what the
k-th model alone would, and the gradient of the summed loss with respect to copy k's parameters is
copy k's own gradient.

    stacked = StackedCausalLM([model_a, model_b, model_c])      # same config, any weights
    out = stacked(input_ids, labels)   # input_ids/labels (B, L) shared, or (K, B, L) per copy
    out.losses                         # (K,) answer-only cross-entropy of each copy
    out.loss                           # their sum: what the optimizer differentiates
    models = stacked.unstack()         # K ordinary models again

Only the tasks' answer-only loss is supported (labels at the answers only: one per row, or several
for MQAR, one per query): it is what training uses, and it lets every copy evaluate the LM head at
the answer positions only.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .errors import MechEvalError
from .modeling_mecheval import IGNORE_INDEX, MechEvalForCausalLM, at_least_float32, scored_positions


@dataclasses.dataclass
class StackedOutput:
    loss: torch.Tensor        # () sum over copies
    losses: torch.Tensor      # (K,)
    logits: torch.Tensor      # (K, B, V) at the answer-predicting position, or (K, B, k, V) with several
    targets: torch.Tensor     # (B,) or (K, B) the answers, or (B, k) / (K, B, k) with IGNORE_INDEX padding


def answer_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """labels (..., L) with one label per row -> positions predicting it (..., 1) and answers (...);
    with several labels in a row (one per query) -> positions (..., k) and answers (..., k), as
    ``scored_positions`` orders and pads them."""
    mask = labels[..., 1:] != IGNORE_INDEX
    if not bool(mask.any(-1).all()):
        raise MechEvalError("stacked models support the answer-only loss only: every row of labels needs "
                            "an answer's label (the tasks' datasets give them so)")
    if bool((mask.sum(-1) > 1).any()):
        return scored_positions(labels[..., 1:])
    keep = mask.float().argmax(-1)[..., None]                         # (..., 1)
    return keep, labels[..., 1:].gather(-1, keep)[..., 0]


class StackedCausalLM(nn.Module):
    def __init__(self, copies: Sequence[MechEvalForCausalLM]):
        super().__init__()
        if not copies:
            raise MechEvalError("a stack needs at least one model")
        first = copies[0]
        for other in copies[1:]:
            if type(other) is not type(first) or other.config.to_diff_dict() != first.config.to_diff_dict():
                raise MechEvalError("every copy in a stack must have the same architecture and configuration")
        self.num_copies = len(copies)
        self.config = first.config
        # The template supplies the code, never the weights: functional_call swaps copy k's tensors
        # in. It is kept out of the module tree so that it is neither trained nor saved.
        template = copy.deepcopy(first).requires_grad_(False)
        template.model.use_functional_path(True)
        self.__dict__["_template"] = template
        self.names = [name for name, _ in first.named_parameters()]     # tied weights appear once
        if not all(n.startswith("model.") for n in self.names if n != "lm_head.weight"):
            raise MechEvalError("unexpected parameter layout for a stacked model")
        self.stacked = nn.ParameterDict({
            _key(name): nn.Parameter(torch.stack([dict(c.named_parameters())[name].detach() for c in copies]))
            for name in self.names})

    @property
    def template(self) -> MechEvalForCausalLM:
        """The ordinary model whose code every copy runs (its own weights are never used)."""
        return self._template

    def named_stacked_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(the ordinary model's parameter name, the stacked (K, ...) parameter)."""
        return [(name, self.stacked[_key(name)]) for name in self.names]

    # ------------------------------------------------------------------ one copy
    def _copy_forward(self, params: dict, input_ids: torch.Tensor, keep: torch.Tensor,
                      targets: torch.Tensor):
        # params: copy k's tensors (no leading K); input_ids (B, L); keep (B, 1) and targets (B,),
        # or keep and targets (B, k) with several answers per row
        backbone = {name[len("model."):]: p for name, p in params.items() if name.startswith("model.")}
        h = torch.func.functional_call(self._template.model, backbone, (input_ids,),
                                       {"keep_positions": keep}).last_hidden_state      # (B, 1 or k, D)
        head = params.get("lm_head.weight", params["model.embed_tokens.weight"])         # tied: (V, D)
        if targets.dim() == 2:                                                           # several answers
            logits = h @ head.T                                                          # (B, k, V)
            return F.cross_entropy(at_least_float32(logits.flatten(0, 1)), targets.flatten(), ignore_index=IGNORE_INDEX), logits
        logits = h[:, 0] @ head.T                                                        # (B, V)
        return F.cross_entropy(at_least_float32(logits), targets), logits

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> StackedOutput:
        """input_ids, labels: (B, L) given to every copy, or (K, B, L) one batch per copy."""
        per_copy = input_ids.dim() == 3
        if per_copy and input_ids.shape[0] != self.num_copies:
            raise MechEvalError(f"per-copy batches need a leading dimension of {self.num_copies}, "
                                f"got input_ids of shape {tuple(input_ids.shape)}")
        keep, targets = answer_positions(labels)
        params = {name: self.stacked[_key(name)] for name in self.names}
        data_dim = 0 if per_copy else None
        losses, logits = torch.func.vmap(self._copy_forward, in_dims=(0, data_dim, data_dim, data_dim),
                                         randomness="error")(params, input_ids, keep, targets)
        return StackedOutput(loss=losses.sum(), losses=losses, logits=logits, targets=targets)

    # ------------------------------------------------------------------ copies in and out
    def copy_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Copy k's parameters under the ordinary model's names (tied weights included)."""
        state = {name: self.stacked[_key(name)][k].detach().clone() for name in self.names}
        if "lm_head.weight" not in state:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        return state

    def unstack(self) -> list[MechEvalForCausalLM]:
        models = []
        for k in range(self.num_copies):
            model = copy.deepcopy(self._template)
            model.model.use_functional_path(False)
            model.load_state_dict(self.copy_state_dict(k))
            models.append(model.requires_grad_(True))
        return models

    def finite_copies(self) -> torch.Tensor:
        """(K,) bool: copies whose parameters are all finite (a diverged copy has NaN or inf)."""
        ok = torch.ones(self.num_copies, dtype=torch.bool, device=next(self.parameters()).device)
        for p in self.stacked.values():
            ok &= torch.isfinite(p.detach()).flatten(1).all(1)
        return ok


def _key(name: str) -> str:
    # ParameterDict keys cannot contain dots
    return name.replace(".", "__")
