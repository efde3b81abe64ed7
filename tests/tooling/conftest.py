"""The tools around the runtime: the CLI and its errors, config and its reference, README and docs, plots and
panel, loggers, benchmarks, mutants and the layout guard.
"""
