"""The built-in architectures: importing each mixer file registers its architecture
(``register_architecture`` at its end, as a plug-in does), and each config class comes from the
mixer file it configures.

These are static ``from .x import`` lines on purpose: transformers copies a checkpoint's remote
code by following exactly such relative imports from ``modeling_mecheval.py``, so a mixer file
that is not named here is neither registered nor carried by saved checkpoints. A new built-in
mixer file adds one line here (and its class pair in ``modeling_mecheval.py``).
"""
from .mixer_transformer import MechEvalTransformerConfig
from .mixer_baseconv import MechEvalBaseConvConfig
from .mixer_based import MechEvalBasedConfig
from .mixer_h3 import MechEvalH3Config
from .mixer_hyena import MechEvalHyenaConfig
from .mixer_mamba import MechEvalMambaConfig
from .mixer_deltanet import MechEvalDeltaNetConfig
from .mixer_mamba2 import MechEvalMamba2Config
from .mixer_gated_deltanet import MechEvalGatedDeltaNetConfig

__all__ = ["MechEvalTransformerConfig", "MechEvalBaseConvConfig", "MechEvalBasedConfig", "MechEvalH3Config",
           "MechEvalHyenaConfig", "MechEvalMambaConfig", "MechEvalDeltaNetConfig", "MechEvalMamba2Config",
           "MechEvalGatedDeltaNetConfig"]
