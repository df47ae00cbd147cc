"""Help lines for Triton spellings that sparsile writes another way (docs/language.md, "Coming from
Triton"): an unknown name or member (``tl.cast``, ``tl.math.exp``, ``tl.multiple_of``) and an
unknown keyword of a builtin (``load(..., eviction_policy=...)``, ``dot(..., allow_tf32=...)``) get
the sparsile spelling instead of a "did you mean" guess."""

from __future__ import annotations

_NO_HINTS = ("not needed: sparsile works out the divisibility and contiguity of offsets itself "
             "(and specializes integer arguments on divisibility by 16, as Triton does); use the value as it is")
_MATH = ("the math functions are top-level builtins: `exp`, `exp2`, `log`, `log2`, `sqrt`, `rsqrt`, `sin`, `cos`, "
         "`floor`, `ceil`, `abs`, `sigmoid`, `tanh`, `erf` (`sp.exp(x)`)")
_BLOCK_PTR = ("declare the parameter as `tensor[T, rank]` and read or write boxes with `t.load_tile(offsets, "
              "shape)` / `t.store_tile(offsets, tile)` (zero outside the tensor); offsets are plain integers")
_ATOMICS = ("the language's atomics are `atomic_add`, `atomic_max`, `atomic_min`, `atomic_xchg` and `atomic_cas`; "
            "bitwise atomics are not in the language")
_FP8 = ("sparsile's 8-bit floats are `e4m3` (Triton's `float8e4nv`) and `e5m2` (Triton's `float8e5`); "
        "this fp8 variant is not in the language")
_SCAN = "scans are not in the language; a reduction is `sum`, `max`, `min`, `argmax` or `argmin` along an axis"

NAMES: dict[str, str] = {
    "cast": "convert with `x.to(dtype)`",
    "zeros_like": "write `zeros(x.shape, x.dtype)`",
    "full_like": "write `full(x.shape, value, x.dtype)`",
    "multiple_of": _NO_HINTS,
    "max_contiguous": _NO_HINTS,
    "max_constancy": _NO_HINTS,
    "assume": _NO_HINTS,
    "debug_barrier": "write `barrier()`",
    "device_print": ("kernels do not print at run time: store the values to an output array; "
                     "`static_print(...)` prints constants at compile time"),
    "device_assert": "write `assert cond, \"message\"` (checked at run time by the interpreter)",
    "math": _MATH,
    "libdevice": _MATH,
    "extra": _MATH,  # tl.extra.cuda.libdevice
    "fma": "write `a * b + c`",
    "clamp": "write `minimum(maximum(x, lo), hi)`",
    "fdiv": "write `x / y`",
    "div_rn": "write `x / y`",
    "sqrt_rn": "write `sqrt(x)` (exact)",
    "view": "write `reshape(x, shape)`",
    "ravel": "write `reshape(x, (n,))` with `n` the number of elements",
    "make_block_ptr": _BLOCK_PTR,
    "make_tensor_descriptor": _BLOCK_PTR,
    "tensor_descriptor": _BLOCK_PTR,
    "load_tensor_descriptor": _BLOCK_PTR,
    "store_tensor_descriptor": _BLOCK_PTR,
    "advance": _BLOCK_PTR,
    "broadcast": ("operands of an operator broadcast by themselves; for one shape write `broadcast_to(x, shape)` "
                  "for each"),
    "softmax": ("write it out: `e = exp(x - max(x, axis=a, keep_dims=True))`, then `e / sum(e, axis=a, "
                "keep_dims=True)`"),
    "atomic_and": _ATOMICS,
    "atomic_or": _ATOMICS,
    "atomic_xor": _ATOMICS,
    "float8e4b15": _FP8,
    "float8e4b8": _FP8,
    "float8e5b16": _FP8,
    "cumsum": _SCAN,
    "cumprod": _SCAN,
    "associative_scan": _SCAN,
    "reduce": "use `sum`, `max`, `min`, `argmax` or `argmin` along an axis (custom combine functions are not "
              "in the language)",
    "xor_sum": "use `sum`, `max`, `min`, `argmax` or `argmin` along an axis (an xor reduction is not in the language)",
    "rand": "there are no random numbers in a kernel: pass them in an array",
    "randn": "there are no random numbers in a kernel: pass them in an array",
    "pointer_type": ("a pointer cannot be made from an integer loaded from memory: pass each array as an argument, "
                     "or one array holding every group with integer offsets into it"),
    "int_to_ptr": ("a pointer cannot be made from an integer: pass each array as an argument, or one array holding "
                   "every group with integer offsets into it"),
    "flip": ("the language has no `flip`: reverse the offsets instead, where the tile is loaded or stored "
             "(`load(p + (N - 1 - arange(0, N)))`)"),
    "swizzle2d": "compute the grouped program order with integer arithmetic (Triton tutorial 03's `GROUP_SIZE_M` "
                 "code works as written)",
}
"""Triton's ``tl.NAME`` (or a bare ``NAME``) -> the help line naming sparsile's spelling."""

_DROP_HINT = "sparsile's `{b}` takes no cache or eviction hints: drop `{k}=`"
_TF32 = ("`dot` of f32 operands rounds them to tf32 (Triton's default, `input_precision=\"tf32\"`); "
         "drop `{k}=`; for IEEE f32 products write `sum(a[:, :, None] * b[None, :, :], axis=1)`")

_KEEP_DIMS = "did you mean `keep_dims`? (sparsile and Triton spell NumPy's `keepdims` `keep_dims=True`)"
REDUCTIONS = ("sum", "max", "min", "argmax", "argmin")
"""The builtins that take ``keep_dims=``."""

KEYWORDS: dict[tuple[str, str], str] = {
    **{(b, k): _DROP_HINT for b in ("load", "store") for k in ("eviction_policy", "cache_modifier", "volatile")},
    ("load", "boundary_check"): _BLOCK_PTR,
    ("load", "padding_option"): _BLOCK_PTR,
    ("store", "boundary_check"): _BLOCK_PTR,
    ("dot", "allow_tf32"): _TF32,
    ("dot", "input_precision"): _TF32,
    ("dot", "out_dtype"): "give `acc` of that type (`zeros((M, N), f16)`) or convert the result with `.to(dtype)`",
    ("dot", "max_num_imprecise_acc"): "drop `{k}=`: the accumulator keeps full precision",
    ("to", "bitcast"): "`x.to(dtype)` converts values; reinterpreting bits is not in the language",
    ("to", "fp_downcast_rounding"): "drop `{k}=`: conversions round to nearest even (docs/language.md, rule 8)",
    **{(b, "keepdims"): _KEEP_DIMS for b in REDUCTIONS},
    ("max", "return_indices"): "use `argmax(x, axis=...)` for the index",
    ("min", "return_indices"): "use `argmin(x, axis=...)` for the index",
}
"""(builtin, keyword) -> the help line for a Triton keyword that sparsile's builtin does not take."""


def name_help(name: str) -> str | None:
    """The help line for Triton's ``NAME`` that sparsile does not have, or None."""
    return NAMES.get(name)


def keyword_help(builtin: str, keyword: str) -> str | None:
    """The help line for Triton's keyword ``keyword`` of ``builtin``, or None."""
    text = KEYWORDS.get((builtin, keyword))
    return None if text is None else text.format(b=builtin, k=keyword)
