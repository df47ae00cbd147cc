"""SP0253: a language builtin (``sp.arange``, ``sp.load``) called from plain Python. Builtins emit
kernel IR; outside a kernel there is nothing to emit into, so the call is refused with what the host
has instead: the numpy function that computes the same on whole arrays, or, for the builtins that only
mean something on the GPU (``load``, ``program_id``, ``tma.load``), how to run the kernel."""

from __future__ import annotations

from ..diagnostics import SparsileError

SP_BUILTIN_ON_HOST = "SP0253"

_SAME_NAME = ("arange", "zeros", "full", "where", "abs", "ceil", "cos", "exp", "exp2", "floor", "log", "log2",
              "sin", "sqrt", "tanh", "maximum", "minimum", "sum", "max", "min", "argmax", "argmin",
              "broadcast_to", "expand_dims", "reshape")
NUMPY_EQUIVALENTS: dict[str, str] = {
    **{name: f"np.{name}" for name in _SAME_NAME},
    "permute": "np.transpose", "trans": "np.transpose", "dot": "np.matmul (a @ b)",
    "sigmoid": "1 / (1 + np.exp(-x))", "rsqrt": "1 / np.sqrt(x)", "erf": "scipy.special.erf (math.erf for one number)",
    "to": "x.astype(dtype)",
}
"""What computes a builtin's result on the host, by the builtin's (top-level) name."""


class BuiltinOnHost(SparsileError, RuntimeError):
    """SP0253: a language builtin called outside a kernel; a RuntimeError too, as the call raised
    one before it had a code."""


def builtin_on_host(name: str) -> BuiltinOnHost:
    """The error of builtin ``name`` ("arange", "tma.load") called from plain Python."""
    run = ("launch the kernel that calls it, `kernel[grid](...)`, or run it on the CPU with "
           "`kernel.interpret[grid](...)`")
    if name in NUMPY_EQUIVALENTS:
        help = f"on the host, use numpy instead: {NUMPY_EQUIVALENTS[name]}"
    else:
        help = (f"`{name}` has no meaning outside a kernel (it works on the program's own tiles, memory or "
                f"hardware); {run}; on the host, compute on whole arrays with numpy")
    return BuiltinOnHost(SP_BUILTIN_ON_HOST, f"`sparsile.{name}` can only be called inside a kernel (a function "
                                             "decorated with @sparsile.jit or defined in a .spk file)", help=help)
