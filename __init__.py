"""sparsile: a Triton-style kernel language for structured-sparse matrix multiply on NVIDIA tensor cores."""

__version__ = "0.1.0"
