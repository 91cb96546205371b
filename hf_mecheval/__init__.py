"""hf-mecheval: mechanistic evaluation of Transformers and state-space models.

``import hf_mecheval`` registers the nine model types with the transformers Auto classes.
It imports no kernel packages (flash-linear-attention would replace transformers' ``mamba``
types) and no task, training or intervention code.
"""
__version__ = "0.1.0"

from .models import register_auto_classes as _register

_register()
