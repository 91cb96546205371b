"""The architectures as Hugging Face models (``ARCHITECTURES``).

``import hf_mecheval`` registers every config and model with ``AutoConfig``, ``AutoModel`` and
``AutoModelForCausalLM``::

    config = AutoConfig.for_model("mecheval-mamba", hidden_size=128, conv_kernel=4, vocab_size=8196)
    model = AutoModelForCausalLM.from_config(config)

Every module here but this one and ``stacked.py`` is the models' self-contained code (relative
imports only, within this folder), which a saved model carries as its remote code.
"""
from .configuration_mecheval import (ARCHITECTURES, BasedConfig, BaseConvConfig, DeltaNetConfig,
                                     GatedDeltaNetConfig, H3Config, HyenaConfig, Mamba2Config, MambaConfig,
                                     MechEvalConfig, TransformerConfig)
from .modeling_mecheval import MODEL_CLASSES, MechEvalForCausalLM, MechEvalModel, auto_map, save_remote_code

_registered = False


def register_auto_classes() -> None:
    """Register every model type with the transformers Auto classes (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    for config_cls, model_cls, lm_cls in MODEL_CLASSES.values():
        AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
        AutoModel.register(config_cls, model_cls, exist_ok=True)
        AutoModelForCausalLM.register(config_cls, lm_cls, exist_ok=True)
    _registered = True


def build_model(architecture: str, **config_fields) -> MechEvalForCausalLM:
    """A freshly initialised causal LM, e.g. ``build_model("mamba", hidden_size=64, conv_kernel=0)``."""
    from .errors import ConfigError

    if architecture not in MODEL_CLASSES:
        raise ConfigError("architecture", f"unknown architecture {architecture!r}; choose one of "
                                          f"{', '.join(MODEL_CLASSES)}")
    config_cls, _, lm_cls = MODEL_CLASSES[architecture]
    return lm_cls(config_cls(**config_fields))


def count_parameters(config) -> int:
    """Parameters of the model ``config`` describes, counted without allocating any: built on
    the meta device with at most 8 of its layers; further layers count as the mean of those (the
    layer patterns repeat with period 1 or 2), so a config with 10^6 layers is counted at once."""
    import copy

    import torch

    lm_cls = next(lm for cfg, _, lm in MODEL_CLASSES.values() if type(config) is cfg)
    built = copy.deepcopy(config)
    built.num_hidden_layers = min(config.num_hidden_layers, 8)
    try:
        with torch.device("meta"):
            model = lm_cls(built)
    except RuntimeError as exc:       # a weight of more than 2^63 bytes: torch cannot even describe it
        if "overflow" in str(exc):
            raise OverflowError(f"a weight of this model would hold more than 2^63 bytes ({exc})") from None
        raise
    total = sum(p.numel() for p in model.parameters())
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in model.model.layers]
    return total + (config.num_hidden_layers - built.num_hidden_layers) * sum(per_layer) // len(per_layer)


__all__ = ["ARCHITECTURES", "BasedConfig", "BaseConvConfig", "DeltaNetConfig", "GatedDeltaNetConfig", "H3Config",
           "HyenaConfig", "Mamba2Config", "MambaConfig", "MechEvalConfig", "TransformerConfig", "MODEL_CLASSES",
           "MechEvalForCausalLM", "MechEvalModel", "auto_map", "save_remote_code", "register_auto_classes", "build_model",
           "count_parameters"]
