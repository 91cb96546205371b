"""Interchange interventions (activation patching) on the models' named sites."""
from .engine import InterventionEngine
from .grid import POSITIONS, run_grid

__all__ = ["InterventionEngine", "POSITIONS", "run_grid"]
