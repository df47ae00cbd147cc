"""Mutation fuzzing of the shipped ``.spk`` kernels (quick run in CI, long run: scripts/fuzz.py)."""
