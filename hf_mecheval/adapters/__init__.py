"""transformers' own causal LMs as they are (``--architecture hf:<model_type>``).

``native_config`` builds a family's config from the run's flags (small heads and MLPs derived
from the width); ``native_sites`` finds a built model's decoder layers and offers residual-stream
sites on them, so the intervention grid runs on a GPT-2, Llama or Mamba of transformers next to
ours. Nothing here imports a CUDA kernel package: transformers chooses its pure-torch paths on a
CPU by itself.
"""
from .native_config import (NATIVE_PREFIX, build_native_model, count_native_parameters, is_native, native_config,
                            native_model_type)
from .native_sites import HookPoint, NativeSites, native_sites

__all__ = ["NATIVE_PREFIX", "HookPoint", "NativeSites", "build_native_model", "count_native_parameters", "is_native",
           "native_config", "native_model_type", "native_sites"]
