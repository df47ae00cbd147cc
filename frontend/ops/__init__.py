"""The ops of the language: the op registry (opdefs) and one module per family of ops."""
