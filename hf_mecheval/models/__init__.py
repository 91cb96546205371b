"""The architectures as Hugging Face models, from the architecture registry (``registry.py``).

``import hf_mecheval`` registers every registered config and model with ``AutoConfig``,
``AutoModel`` and ``AutoModelForCausalLM`` (and any architecture registered later, as plug-ins
are)::

    config = AutoConfig.for_model("mecheval-mamba", hidden_size=128, conv_kernel=4, vocab_size=8196)
    model = AutoModelForCausalLM.from_config(config)

Architectures are looked up by name with :func:`get_architecture` (which loads plug-ins' entry
points the first time a name is not among the registered ones: ``plugins.py``).

Every module here but this one, ``plugins.py`` and ``stacked.py`` is the models' self-contained code
(relative imports only, within this folder), which a saved model carries as its remote code.
"""
from .builtin_architectures import (MechEvalBaseConvConfig, MechEvalBasedConfig, MechEvalDeltaNetConfig,
                                    MechEvalGatedDeltaNetConfig, MechEvalH3Config, MechEvalHyenaConfig, MechEvalMamba2Config,
                                    MechEvalMambaConfig, MechEvalTransformerConfig)
from .configuration_mecheval import MechEvalConfig
from .modeling_mecheval import MODEL_CLASSES, MechEvalForCausalLM, MechEvalModel, auto_map, save_remote_code
from .plugins import architecture_names, get_architecture, load_plugins, require_checkpoint_architecture
from .registry import ARCHITECTURES, MIXERS, TINY_SIZES, ArchitectureSpec, on_register, register_architecture

_registered = False


def _register_with_auto_classes(spec: ArchitectureSpec) -> None:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    config_cls, model_cls, lm_cls = MODEL_CLASSES[spec.name]
    AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
    AutoModel.register(config_cls, model_cls, exist_ok=True)
    AutoModelForCausalLM.register(config_cls, lm_cls, exist_ok=True)


def register_auto_classes() -> None:
    """Register every architecture, and every one registered later, with the transformers Auto
    classes (idempotent)."""
    global _registered
    if not _registered:
        on_register(_register_with_auto_classes)
        _registered = True


def model_classes(architecture: str) -> tuple[type, type, type]:
    """(config class, base model class, causal LM class) of a registered architecture (or plug-in)."""
    return MODEL_CLASSES[get_architecture(architecture).name]


def build_model(architecture: str, **config_fields) -> MechEvalForCausalLM:
    """A freshly initialised causal LM, e.g. ``build_model("mamba", hidden_size=64, conv_kernel=0)``."""
    config_cls, _, lm_cls = model_classes(architecture)
    return lm_cls(config_cls(**config_fields))


def non_finite_parameters(model) -> list[str]:
    """The names of ``model``'s parameters that hold NaN or infinity (a diverged model)."""
    import torch

    with torch.no_grad():
        return [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]


_PARAMETER_COUNTS: dict[tuple, int] = {}


def count_parameters(config) -> int:
    """Parameters of the model ``config`` describes, counted without allocating any: built on
    the meta device with at most 8 of its layers; further layers count as the mean of those (the
    layer patterns repeat with period 1 or 2), so a config with 10^6 layers is counted at once.
    Remembered per configuration: a sweep file checks every run's memory when it loads, and its
    1 000 runs share a few dozen models (building one, even on the meta device, takes ~40 ms)."""
    key = (type(config), config.to_json_string(use_diff=False))
    if key not in _PARAMETER_COUNTS:
        if len(_PARAMETER_COUNTS) >= 4096:
            _PARAMETER_COUNTS.clear()
        _PARAMETER_COUNTS[key] = _count_parameters(config)
    return _PARAMETER_COUNTS[key]


def _count_parameters(config) -> int:
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


__all__ = ["ARCHITECTURES", "MIXERS", "TINY_SIZES", "ArchitectureSpec", "register_architecture", "on_register",
           "get_architecture", "architecture_names", "load_plugins", "require_checkpoint_architecture",
           "MechEvalBasedConfig", "MechEvalBaseConvConfig", "MechEvalDeltaNetConfig", "MechEvalGatedDeltaNetConfig",
           "MechEvalH3Config", "MechEvalHyenaConfig", "MechEvalMamba2Config", "MechEvalMambaConfig", "MechEvalConfig",
           "MechEvalTransformerConfig", "MODEL_CLASSES", "MechEvalForCausalLM",
           "MechEvalModel", "auto_map", "save_remote_code", "register_auto_classes", "model_classes", "build_model",
           "count_parameters"]
