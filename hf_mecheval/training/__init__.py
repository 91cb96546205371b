"""Training with the transformers Trainer (and Accelerate): the reference recipe, run
directories, sweeps."""
