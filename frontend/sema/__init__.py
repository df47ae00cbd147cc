"""Semantic analysis: names, builtins, constants, Python captures and specialization to a signature."""
