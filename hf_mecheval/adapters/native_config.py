"""A transformers family's config from the run's flags: ``hf:gpt2`` with --hidden_size 64
--num_hidden_layers 2 is ``AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=4, ...)``.

The flags' names are transformers' common ones (``hidden_size``, ``num_hidden_layers``,
``max_position_embeddings``); each config's ``attribute_map`` sends them to the family's own
fields (GPT-2's ``n_embd``, ``n_layer``, ``n_positions``). Sizes the flags do not give are
derived from the width so that a tiny model stays tiny: attention heads of 16 dimensions (one
head below 32), an MLP of 4 × the width, Mamba-2 heads of 16 dimensions with a state of 64 and
chunks of 64 steps (as our Mamba-2). ``--model_config`` sets any further field of the family's
config; for Mamba-2 the sizes it does not set are chosen to fit the ones it does (``mamba2_sizes``).
"""
from __future__ import annotations

from typing import Any

from huggingface_hub.errors import StrictDataclassError

from ..errors import ConfigError, MechEvalError

NATIVE_PREFIX = "hf:"
HEAD_DIM = 16
MAMBA2_STATE = 64
# transformers' Mamba2 pads the sequence to a multiple of chunk_size before its chunked scan; its
# default 256 makes a 37-token AR document cost a 256-step chunk (~6x the time of 64 on a CPU).
# The chunking changes the blocking of the scan, not its result (our Mamba-2 uses 64 too).
MAMBA2_CHUNK = 64
MAMBA2_FIELDS = ("expand", "head_dim", "num_heads", "n_groups", "state_size", "chunk_size")


def is_native(architecture: str) -> bool:
    return architecture.startswith(NATIVE_PREFIX)


def native_model_type(architecture: str) -> str:
    """``hf:gpt2`` -> ``gpt2``, refused unless transformers knows it as a causal LM."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = architecture[len(NATIVE_PREFIX):]
    if model_type not in CONFIG_MAPPING:
        raise ConfigError("architecture", f"{architecture!r}: transformers has no model type {model_type!r}; give "
                                          "hf:<model_type> of a causal LM, e.g. hf:gpt2, hf:llama, hf:mamba, hf:mamba2")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError("architecture", f"{architecture!r} is not a causal language model in transformers "
                                          "(AutoModelForCausalLM has no class for it); e.g. hf:gpt2, hf:llama, "
                                          "hf:mamba, hf:mamba2")
    return model_type


def _attention_heads(hidden_size: int) -> int:
    return hidden_size // HEAD_DIM if hidden_size % HEAD_DIM == 0 and hidden_size >= 2 * HEAD_DIM else 1


def _is_mamba2(defaults) -> bool:
    return hasattr(defaults, "expand") and hasattr(defaults, "num_heads") and hasattr(defaults, "n_groups")


def _positive_int(architecture: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("model_config", f"{name} must be a positive integer for {architecture}, got {value!r}")
    return value


def mamba2_sizes(architecture: str, hidden_size: int, extra: dict[str, Any], defaults) -> dict[str, Any]:
    """Mamba-2's sizes from --hidden_size and whatever --model_config sets of them.

    transformers' Mamba2 splits the inner width ``expand * hidden_size`` into ``num_heads`` heads
    of ``head_dim`` channels (its config refuses a product that differs), and ``n_groups`` groups
    of heads share B and C (its scan repeats each group ``num_heads / n_groups`` times, so that must
    be a whole number, or the forward fails deep inside). The sizes not given are chosen to fit:
    heads of 16 channels where 16 divides the inner width, else one head of all of it; one group; a
    state of 64; chunks of 64 steps. Given sizes that cannot fit are one error naming them."""
    given = {name: _positive_int(architecture, name, extra[name]) for name in MAMBA2_FIELDS if name in extra}
    expand = given.get("expand", defaults.expand)
    inner = expand * hidden_size                        # the width x, z and the heads live in
    if "head_dim" in given and "num_heads" in given:
        head_dim, heads = given["head_dim"], given["num_heads"]
        if head_dim * heads != inner:
            raise ConfigError("model_config", f"num_heads × head_dim ({heads} × {head_dim}) must equal expand × "
                                              f"--hidden_size ({expand} × {hidden_size} = {inner}) for {architecture}; "
                                              "give one of the two and the other is chosen")
    elif "head_dim" in given or "num_heads" in given:
        name = "head_dim" if "head_dim" in given else "num_heads"
        if inner % given[name]:
            choices = ", ".join(str(d) for d in range(1, inner + 1) if inner % d == 0)
            raise ConfigError("model_config", f"{name} must divide expand × --hidden_size ({expand} × {hidden_size} "
                                              f"= {inner}) for {architecture}, got {given[name]}; one of {choices}")
        head_dim = given["head_dim"] if name == "head_dim" else inner // given[name]
        heads = inner // head_dim
    else:
        head_dim = HEAD_DIM if inner % HEAD_DIM == 0 else inner
        heads = inner // head_dim
    groups = given.get("n_groups", 1)
    if heads % groups:
        choices = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        raise ConfigError("model_config", f"n_groups must divide the number of heads ({heads} = expand × "
                                          f"--hidden_size / head_dim = {inner} / {head_dim}) for {architecture}, "
                                          f"got {groups}; one of {choices}")
    return {"expand": expand, "num_heads": heads, "head_dim": head_dim, "n_groups": groups,
            "state_size": given.get("state_size", MAMBA2_STATE), "chunk_size": given.get("chunk_size", MAMBA2_CHUNK)}


def derived_sizes(defaults, hidden_size: int) -> dict[str, Any]:
    """The sizes a family needs besides the width, for the fields its config has (Mamba-2's:
    ``mamba2_sizes``)."""
    fields: dict[str, Any] = {}
    if hasattr(defaults, "num_attention_heads"):
        heads = _attention_heads(hidden_size)
        fields["num_attention_heads"] = heads
        if hasattr(defaults, "num_key_value_heads"):
            fields["num_key_value_heads"] = heads
        if hasattr(defaults, "head_dim"):
            fields["head_dim"] = hidden_size // heads
    if hasattr(defaults, "intermediate_size") and not hasattr(defaults, "expand"):
        fields["intermediate_size"] = 4 * hidden_size     # Mamba derives its own from expand
    return fields


def native_config(architecture: str, *, vocab_size: int, hidden_size: int, num_hidden_layers: int,
                  max_position_embeddings: int | None = None, extra: dict[str, Any] | None = None):
    """The config of ``hf:<model_type>`` at these sizes, special tokens those of the tasks'
    tokenizer (pad 0, bos 1, eos 2). Unknown fields in ``extra`` are refused by name."""
    from transformers import AutoConfig, CONFIG_MAPPING

    from ..tasks.data import BOS, EOS, PAD

    model_type = native_model_type(architecture)
    defaults = CONFIG_MAPPING[model_type]()
    extra = dict(extra or {})
    unknown = sorted(k for k in extra if not hasattr(defaults, k))
    if unknown:   # a typo would otherwise be kept as an inert attribute of the config
        known = ", ".join(sorted(k for k in defaults.to_dict() if not k.startswith("_")))
        raise ConfigError("model_config", f"unknown field {unknown[0]!r} for {architecture}; its fields: {known}")
    for name, value in (("hidden_size", hidden_size), ("num_hidden_layers", num_hidden_layers)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(name, f"must be a positive integer, got {value!r}")
    sizes = (mamba2_sizes(architecture, hidden_size, extra, defaults) if _is_mamba2(defaults)
             else derived_sizes(defaults, hidden_size))
    fields: dict[str, Any] = {"vocab_size": vocab_size, "hidden_size": hidden_size,
                              "num_hidden_layers": num_hidden_layers, **sizes,
                              "pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS}
    if max_position_embeddings is not None:
        if not hasattr(defaults, "max_position_embeddings"):
            raise ConfigError("max_position_embeddings", f"{architecture} has no position embeddings; leave it unset")
        if max_position_embeddings < 1:
            raise ConfigError("max_position_embeddings", f"must be >= 1 for {architecture}, got "
                                                         f"{max_position_embeddings}")
        fields["max_position_embeddings"] = max_position_embeddings
    fields.update(extra)      # (Mamba-2's sizes already hold the ones given)
    try:
        return AutoConfig.for_model(model_type, **fields)
    except (ValueError, TypeError, AttributeError, StrictDataclassError) as exc:
        # transformers' strict configs wrap the reason ("Class validation error for validator
        # ...:" on the first line); the reason itself is the exception's cause
        reason = exc.__cause__ if isinstance(exc, StrictDataclassError) and exc.__cause__ else exc
        raise ConfigError("model_config", f"{architecture} refuses these fields: "
                                          f"{(str(reason).splitlines() or [''])[0]}") from None


def build_native_model(config):
    """A freshly initialised ``AutoModelForCausalLM`` of ``config`` (the caller seeds torch), whose
    ``generate()`` answers one token greedily by default, as hf-mecheval's own models."""
    from transformers import AutoModelForCausalLM

    from ..models.modeling_mecheval import answer_one_token

    try:
        model = AutoModelForCausalLM.from_config(config)
    except (ValueError, TypeError, RuntimeError, AttributeError) as exc:
        raise MechEvalError(f"hf:{config.model_type} cannot be built with this config: "
                            f"{(str(exc).splitlines() or [''])[0]}") from None
    answer_one_token(model.generation_config)
    if not any(p.is_meta for p in model.parameters()):
        require_causal(model)
    return model


def require_causal(model) -> None:
    """Refuse a model whose prediction at a position depends on later tokens (BERT's
    ``BertLMHeadModel`` without ``is_decoder``): on these tasks it would see the answer it is
    asked for. Checked on the built model: change the last token of a short sequence and compare
    the logits before it."""
    import torch

    config = model.config
    length = min(8, getattr(config, "max_position_embeddings", 8) or 8)
    if length < 2:
        return
    tokens = torch.randint(3, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[0, -1] = 3 if int(tokens[0, -1]) != 3 else 4
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            before = model(input_ids=tokens).logits[0, :-1].float()
            after = model(input_ids=changed).logits[0, :-1].float()
    finally:
        model.train(was_training)
    if not torch.allclose(before, after, rtol=1e-4, atol=1e-5):
        hint = " (for BERT-like models: --model_config '{\"is_decoder\": true})'" if hasattr(config, "is_decoder") \
            else ""
        raise ConfigError("architecture", f"hf:{config.model_type} as configured attends to later tokens "
                                          f"(bidirectional): at the query it would see the answer; the tasks need "
                                          f"a causal language model{hint}")


def count_native_parameters(config) -> int:
    """Parameters of the model ``config`` describes, built on the meta device (no memory); the
    built model's decoder layers must be found, so a family the interventions cannot reach is
    refused before training."""
    import torch

    from .native_sites import native_sites

    try:
        with torch.device("meta"):
            model = build_native_model(config)
    except RuntimeError as exc:       # a weight of more than 2^63 bytes
        raise MechEvalError(f"the model cannot be built: {exc}") from None
    native_sites(model)
    return sum(p.numel() for p in model.parameters())
