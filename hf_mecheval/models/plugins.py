"""Architectures from other packages: Python entry points in the group ``hf_mecheval.architectures``.

A plug-in package declares, in its packaging metadata (``pyproject.toml``)::

    [project.entry-points."hf_mecheval.architectures"]
    cummean = "mecheval_cummean:SPEC"

The object named is an :class:`~.registry.ArchitectureSpec` (registered as is), a module (that
registers its architecture when imported, as the built-in mixer files do) or a callable (called;
whatever specs it returns are registered). A package may also call
``hf_mecheval.register_architecture(spec)`` itself; then the architecture exists once that code ran.

Entry points are loaded lazily: the first time a name is looked up that is not registered, or the
whole list is asked for (the command line, sweeps, reloading a checkpoint of an unknown model type),
never at ``import hf_mecheval``, so that importing the package imports no plug-in (nor the heavy
optional packages a plug-in may need) and costs no scan of the installed distributions.

A plug-in's checkpoints reload where hf-mecheval and the plug-in are installed: the remote code a
checkpoint carries holds only the built-in mixers. Their config.json names the plug-in
(``mecheval_plugin``), so a missing plug-in is reported by name.

This module is not part of the remote code.
"""
from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from types import ModuleType

from transformers.utils import logging

from .errors import ConfigError, MechEvalError
from .registry import ARCHITECTURES, ArchitectureSpec, register_architecture

ENTRY_POINT_GROUP = "hf_mecheval.architectures"

logger = logging.get_logger(__name__)

_loaded = False
_failures: dict[str, str] = {}      # entry point name -> why it did not load


def load_plugins(reload: bool = False) -> None:
    """Register the architectures of every installed entry point (once; ``reload`` looks again,
    after installing a package in the running process). A broken plug-in is logged and named when
    its architecture is asked for; it does not stop the others."""
    global _loaded
    if _loaded and not reload:
        return
    _loaded = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in ARCHITECTURES and not reload:
            continue
        distribution = getattr(entry.dist, "name", None) or entry.value.split(".")[0].split(":")[0]
        try:
            found = entry.load()
            if isinstance(found, ModuleType):
                specs = []                             # registered itself on import
            elif isinstance(found, ArchitectureSpec):
                specs = [found]
            elif callable(found):
                returned = found()
                specs = [returned] if isinstance(returned, ArchitectureSpec) else list(returned or [])
            else:
                raise TypeError(f"{entry.value} is a {type(found).__name__}, not an ArchitectureSpec, "
                                f"a module or a callable")
            for spec in specs:
                register_architecture(spec)
            _failures.pop(entry.name, None)
        except Exception as exc:                       # noqa: BLE001  (any error of foreign code)
            _failures[entry.name] = f"the plug-in {distribution} ({entry.value}) failed to load: " \
                                    f"{type(exc).__name__}: {exc}"
            logger.warning(f"hf-mecheval: {_failures[entry.name]}")


def architecture_names() -> list[str]:
    """Every architecture name, built-in ones first, then plug-ins'."""
    load_plugins()
    return list(ARCHITECTURES)


def get_architecture(name: str) -> ArchitectureSpec:
    """The spec registered under ``name``, looking at the plug-ins' entry points when it is not
    registered yet."""
    if name not in ARCHITECTURES:
        load_plugins()
    if name not in ARCHITECTURES:
        why = f" ({_failures[name]})" if name in _failures else ""
        raise ConfigError("architecture", f"unknown architecture {name!r}{why}; choose one of "
                                          f"{', '.join(ARCHITECTURES)}, or install the plug-in that provides it")
    return ARCHITECTURES[name]


def require_checkpoint_architecture(folder) -> None:
    """Make sure the architecture of the checkpoint in ``folder`` is registered (loading plug-ins if
    needed) before transformers reads it; a checkpoint of a plug-in that is not installed is refused
    with the plug-in's name. Folders without a readable config.json are left to transformers."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
        model_type = config["model_type"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if any(spec.model_type == model_type for spec in ARCHITECTURES.values()):
        return
    load_plugins()
    if any(spec.model_type == model_type for spec in ARCHITECTURES.values()):
        return
    plugin = config.get("mecheval_plugin")
    if plugin:
        raise MechEvalError(f"{Path(folder) / 'config.json'}: model type {model_type!r} comes from the hf-mecheval "
                            f"plug-in {plugin!r}, which is not installed here (no entry point of group "
                            f"{ENTRY_POINT_GROUP!r} registers it): install {plugin} to load this checkpoint")
