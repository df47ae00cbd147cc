"""The user-facing driver: ``@jit``/``Kernel``, ``kernel[grid]``, the compile pipeline and its cache."""
