"""A run directory: the files a run writes and reads back (``RunDir``), the rules for replacing
and resuming one, its model card."""
from .run_dir import RunDir

__all__ = ["RunDir"]
