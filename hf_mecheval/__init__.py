"""hf-mecheval: mechanistic evaluation of Transformers and state-space models.

Importing the package is cheap: it imports no kernel packages and no model code beyond what
registration with the ``transformers`` Auto classes needs.
"""
__version__ = "0.1.0"
