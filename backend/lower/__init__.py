"""Lowering of the laid-out tile IR to LLVM IR text, one module per family of ops."""
