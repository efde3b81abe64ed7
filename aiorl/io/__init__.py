"""Files of a run: its directory, checkpoints, the exported policy, metrics and loggers."""
