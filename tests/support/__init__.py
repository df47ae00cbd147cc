"""Helpers shared by the test suite, in one place: compiling kernels from source text or from the
shipped stdlib (:mod:`.compile`), loading benchmark scripts (:mod:`.scripts`), and the kernels and
operands that a CPU test and a GPU test of the same feature both use (:mod:`.mma_harness`,
:mod:`.wgmma_register_a`). Tests import from here; no test file loads another by path."""

from sparsile.tests.support.compile import KERNELS, ROOT, compile_src, compile_stdlib, signature, stdlib_module
from sparsile.tests.support.scripts import load_script

__all__ = ["KERNELS", "ROOT", "compile_src", "compile_stdlib", "load_script", "signature", "stdlib_module"]
