"""hf-mecheval: mechanistic evaluation of Transformers and state-space models.

``import hf_mecheval`` registers every built-in architecture with the transformers Auto classes
(and, as they come, architectures that plug-ins register: ``register_architecture``; entry points
of the group ``hf_mecheval.architectures`` are loaded when an architecture is first looked up, not
here). It imports no kernel packages (flash-linear-attention would replace transformers' ``mamba``
types), no plug-in and no task, training or intervention code.
"""
__version__ = "0.1.0"

from .models import ArchitectureSpec, get_architecture, register_architecture
from .models import register_auto_classes as _register

_register()

__all__ = ["ArchitectureSpec", "get_architecture", "register_architecture", "__version__"]
