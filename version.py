"""The package version (pyproject's, checked by tests/test_packaging.py); the compile cache keys on it."""

__version__ = "0.1.0"
