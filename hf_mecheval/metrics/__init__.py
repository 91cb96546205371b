"""Plain metric functions: restoration (SPEC §5), bootstrap intervals, accuracy; and the mechanism
classifier built on them."""
from .restoration import (accuracy, bootstrap_interval, per_example_restoration, restoration,
                          summarize_restoration)

__all__ = ["accuracy", "bootstrap_interval", "per_example_restoration", "restoration", "summarize_restoration"]
