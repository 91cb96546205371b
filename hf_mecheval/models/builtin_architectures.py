"""The built-in architectures: importing each mixer file registers its architecture
(``register_architecture`` at its end, as a plug-in does).

These are static ``from .x import`` lines on purpose: transformers copies a checkpoint's remote
code by following exactly such relative imports from ``modeling_mecheval.py``, so a mixer file
that is not named here is neither registered nor carried by saved checkpoints. A new built-in
mixer file adds one line here.
"""
from .mixer_attention import CausalSelfAttention  # noqa: F401
from .mixer_base_conv import BaseConv  # noqa: F401
from .mixer_based import BasedLinearAttention  # noqa: F401
from .mixer_h3 import H3Reference  # noqa: F401
from .mixer_hyena import HyenaOperator  # noqa: F401
from .mixer_mamba import MambaMixer  # noqa: F401
from .mixer_delta_net import DeltaNetMixer  # noqa: F401
from .mixer_mamba2 import Mamba2Mixer  # noqa: F401
from .mixer_gated_delta_net import GatedDeltaNetMixer  # noqa: F401
