"""Benchmarks that ship with the package (``hf-sparse-verify bench ...``): named model-shape presets with random
weights, machine facts, and the per-step timing of ``bench step``."""
