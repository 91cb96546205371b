"""The nine architectures as Hugging Face models.

``import hf_mecheval`` registers every config and model with ``AutoConfig``, ``AutoModel`` and
``AutoModelForCausalLM``::

    config = AutoConfig.for_model("mecheval-mamba", hidden_size=128, conv_kernel=4, vocab_size=8196)
    model = AutoModelForCausalLM.from_config(config)
"""
from .configuration_mecheval import (ARCHITECTURES, BasedConfig, BaseConvConfig, DeltaNetConfig,
                                     GatedDeltaNetConfig, H3Config, HyenaConfig, Mamba2Config, MambaConfig,
                                     MechEvalConfig, TransformerConfig)
from .modeling_mecheval import MODEL_CLASSES, MechEvalForCausalLM, MechEvalModel

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
    from ..errors import ConfigError

    if architecture not in MODEL_CLASSES:
        raise ConfigError("architecture", f"unknown architecture {architecture!r}; choose one of "
                                          f"{', '.join(MODEL_CLASSES)}")
    config_cls, _, lm_cls = MODEL_CLASSES[architecture]
    return lm_cls(config_cls(**config_fields))


__all__ = ["ARCHITECTURES", "BasedConfig", "BaseConvConfig", "DeltaNetConfig", "GatedDeltaNetConfig", "H3Config",
           "HyenaConfig", "Mamba2Config", "MambaConfig", "MechEvalConfig", "TransformerConfig", "MODEL_CLASSES",
           "MechEvalForCausalLM", "MechEvalModel", "register_auto_classes", "build_model"]
