"""Reports: plots, intervention evaluation of run directories, model cards."""
