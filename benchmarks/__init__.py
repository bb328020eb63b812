"""Measurements run by hand from the repository root: ``python -m benchmarks.<name>``; results in ``results/``."""
