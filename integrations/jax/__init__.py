"""``sparsile.jax``: sparsile kernels inside ``jax.jit``, through XLA's FFI, with no copies
(needs the ``[jax]`` extra).

    import sparsile.jax as spj

    y = spj.call(kernel, grid, x, n=n, out_shapes=jax.ShapeDtypeStruct(x.shape, x.dtype))
    layer = spj.SparseLinear.from_dense(w, dtype="f16")      # prune to 2:4 and compress, once
    y = jax.jit(layer)(x)                                    # y = x @ W_pruned.T, in x's dtype

docs/jax.md describes the API, the FFI mechanism and what is not supported.
"""

from __future__ import annotations

from ...install_hints import install_hint
from .requires import JAX_MIN_TEXT, check_jax_version

try:
    import jax as _jax
except ModuleNotFoundError as _exc:
    if _exc.name != "jax":
        raise
    _error = ModuleNotFoundError("error[SP0930]: sparsile.jax needs JAX, which is not installed\n"
                                 f" = help: {install_hint('jax', f'jax>={JAX_MIN_TEXT}')}", name="jax")
    _error.code, _error.message = "SP0930", "sparsile.jax needs JAX, which is not installed"  # type: ignore[attr-defined]
    raise _error from _exc
check_jax_version(getattr(_jax, "__version__", ""))  # SP0937 for a jax older than the tested floor

from .call import call, sparsile_call_p  # noqa: E402 (after the checks above)
from .errors import JaxCallError  # noqa: E402
from .linear import SparseLinear, sparse_linear  # noqa: E402

__all__ = ["JaxCallError", "SparseLinear", "call", "sparse_linear", "sparsile_call_p"]
