"""The architecture registry: one :class:`ArchitectureSpec` per architecture, the single place that
maps its user-facing name (``--architecture``, sweeps, run.json) to its config class (whose
``model_type`` is the Hugging Face model type), to the mixer classes under the names its
``config.layer_mixers()`` uses, to the optional kernel packages of those mixers and to the tiny
configuration the tests build it with.

Built-in mixer files register their architecture at their end, exactly as a plug-in does::

    register_architecture(ArchitectureSpec(name="mamba", config_class=MechEvalMambaConfig,
                                           mixers={"mamba": MambaMixer}, class_stem="Mamba", ...))

Everything else is derived from the registered specs: the model classes (``MechEval<stem>Model``
and ``MechEval<stem>ForCausalLM``: a built-in's written out in ``modeling_mecheval.py`` and checked
against its spec, a plug-in's made when it registers), the Auto registration
(``models/__init__.py``), the choices the command line and sweeps accept, the benchmarks' and
the tests' lists. Code that derives something from every architecture subscribes with
:func:`on_register`; it is then also told about architectures registered later (plug-ins).

This module is part of the checkpoints' remote code: plain Python, importing nothing outside this
folder but transformers' table of its own config class names (which a spec's config class must
not take).
Plug-ins found through entry points are loaded by ``plugins.py``, which the remote code does not
carry.
"""
from __future__ import annotations

import dataclasses

from .errors import ConfigError

TINY_SIZES = {"vocab_size": 11, "hidden_size": 8, "num_hidden_layers": 2}
"""The sizes of the tests' tiny models; each spec's ``tiny_config`` adds its own fields."""


@dataclasses.dataclass(frozen=True)
class ArchitectureSpec:
    """What hf-mecheval needs to know about one architecture."""

    name: str
    """User-facing name: ``mecheval train --architecture NAME``, sweeps, run.json."""
    config_class: type
    """A ``MechEvalConfig`` subclass; its ``model_type`` is the checkpoint's model type."""
    mixers: dict
    """Mixer name (as ``config.layer_mixers()`` returns it) -> mixer class (contract: ``mixers.py``)."""
    class_stem: str = ""
    """Model classes are named ``MechEval<class_stem>Model`` / ``MechEval<class_stem>ForCausalLM``
    (saved in config.json's ``architectures``); default: the name in CamelCase."""
    kernel_packages: dict = dataclasses.field(default_factory=dict)
    """Mixer name -> the optional packages its fused kernel path imports (``kernels.py``)."""
    tiny_config: dict = dataclasses.field(default_factory=dict)
    """Config fields that, over ``TINY_SIZES``, make a tiny model for tests (sub-second)."""
    test_variants: tuple = ()
    """Further field sets over ``tiny_config`` (ablation switches such as no short convolution)
    that the mixer contract test checks as well."""
    package: str = ""
    """What provides the architecture: the distribution or top-level module a checkpoint needs
    to reload (default: the config class's top-level module)."""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ConfigError("name", f"an architecture name must be a Python identifier, got {self.name!r}")
        if not getattr(self.config_class, "model_type", None) or not callable(getattr(self.config_class,
                                                                                      "layer_mixers", None)):
            raise ConfigError("config_class", f"{self.name}: must be a MechEvalConfig subclass with a model_type, "
                                              f"got {self.config_class!r}")
        if not isinstance(self.mixers, dict) or not self.mixers:
            raise ConfigError("mixers", f"{self.name}: must map mixer names to mixer classes, got {self.mixers!r}")
        for mixer_name, mixer_class in self.mixers.items():
            if not isinstance(mixer_name, str) or not isinstance(mixer_class, type):
                raise ConfigError("mixers", f"{self.name}: {mixer_name!r} -> {mixer_class!r} is not a name -> class")
            if not callable(getattr(mixer_class, "step", None)):
                raise ConfigError("mixers", f"{self.name}: {mixer_class.__name__} has no recurrent step(); "
                                            f"see the mixer contract in hf_mecheval/models/mixers.py")
        unknown = sorted(set(self.kernel_packages) - set(self.mixers))
        if unknown:
            raise ConfigError("kernel_packages", f"{self.name}: names mixers it does not have: {', '.join(unknown)}; "
                                                 f"its mixers: {', '.join(self.mixers)}")
        if not self.class_stem:
            object.__setattr__(self, "class_stem", "".join(part.title() for part in self.name.split("_")))
        if not self.class_stem.isidentifier():
            raise ConfigError("class_stem", f"{self.name}: must be an identifier, got {self.class_stem!r}")
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        # transformers' Auto classes and pipelines recognise a config class by its *name*: one named
        # like one of theirs (MambaConfig) is taken for theirs, and builds their model
        if self.config_class.__name__ in set(CONFIG_MAPPING_NAMES.values()):
            raise ConfigError("config_class", f"{self.name}: {self.config_class.__name__} is the name of a "
                                              f"transformers config class; name it after the architecture, e.g. "
                                              f"MechEval{self.class_stem}Config")
        if not self.package:
            object.__setattr__(self, "package", self.config_class.__module__.split(".")[0])

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def model_class_name(self) -> str:
        return f"MechEval{self.class_stem}Model"

    @property
    def causal_lm_class_name(self) -> str:
        return f"MechEval{self.class_stem}ForCausalLM"

    @property
    def builtin(self) -> bool:
        """Whether the config and every mixer are in this folder, so a checkpoint's remote code
        (this folder's copy) rebuilds the model without hf-mecheval or any plug-in installed."""
        here = __name__.rpartition(".")[0]
        classes = [self.config_class, *self.mixers.values()]
        return all(c.__module__.rpartition(".")[0] == here for c in classes)

    def tiny_fields(self, **overrides) -> dict:
        """Config fields of the tests' tiny model of this architecture."""
        return {**TINY_SIZES, **self.tiny_config, **overrides}


ARCHITECTURES: dict[str, ArchitectureSpec] = {}
"""Architecture name -> spec, in registration order (built-ins first)."""
MIXERS: dict[str, type] = {}
"""Mixer name (``config.layer_mixers()``) -> mixer class, over every registered architecture."""
_subscribers: list = []          # functions of an ArchitectureSpec, called on registration


def register_architecture(spec: ArchitectureSpec) -> ArchitectureSpec:
    """Add an architecture (idempotent for an equal spec). Refuses a name, model type, class name or
    mixer name that another architecture already uses differently."""
    if not isinstance(spec, ArchitectureSpec):
        raise ConfigError("architecture", f"register an ArchitectureSpec, got {type(spec).__name__}")
    if ARCHITECTURES.get(spec.name) == spec:
        return spec
    if spec.name in ARCHITECTURES:
        raise ConfigError("name", f"architecture {spec.name!r} is already registered (by "
                                  f"{ARCHITECTURES[spec.name].package})")
    for other in ARCHITECTURES.values():
        if other.model_type == spec.model_type:
            raise ConfigError("config_class", f"{spec.name}: model type {spec.model_type!r} is already "
                                              f"architecture {other.name!r}'s")
        if other.class_stem == spec.class_stem:
            raise ConfigError("class_stem", f"{spec.name}: class stem {spec.class_stem!r} is already "
                                            f"architecture {other.name!r}'s")
    for mixer_name, mixer_class in spec.mixers.items():
        if MIXERS.get(mixer_name, mixer_class) is not mixer_class:
            raise ConfigError("mixers", f"{spec.name}: mixer name {mixer_name!r} already means "
                                        f"{MIXERS[mixer_name].__module__}.{MIXERS[mixer_name].__name__}")
    ARCHITECTURES[spec.name] = spec
    MIXERS.update(spec.mixers)
    for subscriber in list(_subscribers):
        subscriber(spec)
    return spec


def on_register(subscriber) -> None:
    """Call ``subscriber(spec)`` for every architecture registered so far and every later one."""
    if subscriber in _subscribers:
        return
    _subscribers.append(subscriber)
    for spec in list(ARCHITECTURES.values()):
        subscriber(spec)


def spec_for_config(config_class: type) -> ArchitectureSpec:
    """The spec whose config class is ``config_class`` (or the nearest registered base class), else
    the one of its model type. The model type decides where the class is a second copy of a
    registered one: transformers imports a checkpoint's remote code into one module folder per
    file and its relative imports, so the config it reads (``configuration_mecheval`` alone) is not
    the class the model's code registered (``modeling_mecheval`` and everything it imports)."""
    for klass in config_class.__mro__:
        for spec in ARCHITECTURES.values():
            if spec.config_class is klass:
                return spec
    for spec in ARCHITECTURES.values():
        if spec.model_type == getattr(config_class, "model_type", None):
            return spec
    raise ConfigError("config_class", f"{config_class.__name__} belongs to no registered architecture")


def mixer_class(name: str) -> type:
    """The mixer class registered under ``name`` (a ``config.layer_mixers()`` entry)."""
    if name not in MIXERS:
        raise ConfigError("layer_mixers", f"no mixer is registered under {name!r}; registered: {', '.join(MIXERS)}")
    return MIXERS[name]


def kernel_packages(mixer_name: str) -> tuple:
    """The optional packages the fused kernel path of mixer ``mixer_name`` imports (() = none)."""
    for spec in ARCHITECTURES.values():
        if mixer_name in spec.kernel_packages:
            return tuple(spec.kernel_packages[mixer_name])
    return ()
