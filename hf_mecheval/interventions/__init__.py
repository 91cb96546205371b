"""Interchange interventions (activation patching) on the models' named sites."""
from .engine import FullForwardEngine, InterventionEngine, engine_for
from .grid import POSITIONS, run_grid

__all__ = ["FullForwardEngine", "InterventionEngine", "POSITIONS", "engine_for", "run_grid"]
