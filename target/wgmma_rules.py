"""The sm90 ``wgmma.mma_async[.sp]`` instruction rules (``docs/hardware.md`` §4.1): operand and
accumulator types, N, the sparsity selector and transposes (codes SP0530-SP0534), and the K of one
instruction.
"""

from __future__ import annotations

from .descriptor_fields import Problem, join_values

WGMMA_DTYPES = ("f16", "bf16", "tf32", "e4m3", "e5m2", "s8", "u8")
_WGMMA_FAMILY = {"f16": "f16", "bf16": "bf16", "tf32": "tf32", "e4m3": "fp8", "e5m2": "fp8", "s8": "int",
                 "u8": "int"}
_WGMMA_ACCUMULATORS = {"f16": ("f16", "f32"), "bf16": ("f32",), "tf32": ("f32",), "fp8": ("f16", "f32"),
                       "int": ("s32",)}
WGMMA_INT_N = frozenset({8, 16, 24, *range(32, 257, 16)})


def wgmma_k(dtype: str, sparse: bool = True) -> int:
    """K of one m64nNkK wgmma (§4.1: sparse k32 for 16-bit, k16 for tf32, k64 for 8-bit)."""
    dense = {"f16": 16, "bf16": 16, "tf32": 8, "fp8": 32, "int": 32}[_WGMMA_FAMILY[dtype]]
    return dense * 2 if sparse else dense


def wgmma_problems(a_dtype: str, b_dtype: str, d_dtype: str, n: int, *, sparse: bool = True, spsel: int = 0,
                   a_from_regs: bool = False, trans_a: bool = False, trans_b: bool = False) -> list[Problem]:
    """Rules of §4.1 for ``wgmma.mma_async[.sp]``: types and accumulators, N (8..256 step 8;
    integer types 8, 16, 24, 32, 48, ..., 256), the immediate sparsity selector (0/1 for
    16-bit and tf32, 0 for 8-bit types), and transposes (f16/bf16 operands read from shared
    memory only)."""
    out = []
    for fld, value in (("a_dtype", a_dtype), ("b_dtype", b_dtype)):
        if value not in WGMMA_DTYPES:
            out.append(Problem("SP0530", f"wgmma does not take {value} operands",
                               f"use one of: {join_values(WGMMA_DTYPES)}", fld))
    if out:
        return out
    fam_a, fam_b = _WGMMA_FAMILY[a_dtype], _WGMMA_FAMILY[b_dtype]
    if fam_a != fam_b:
        out.append(Problem("SP0530", f"wgmma cannot multiply {a_dtype} by {b_dtype}",
                           "give A and B the same type (8-bit floats and 8-bit integers may mix signedness "
                           "or format)", "b_dtype"))
    accs = _WGMMA_ACCUMULATORS[fam_a]
    if d_dtype not in accs:
        out.append(Problem("SP0531", f"accumulator type {d_dtype} is not valid for wgmma with {a_dtype} "
                           "inputs", f"use a {' or '.join(accs)} accumulator", "d_dtype"))
    integer = fam_a == "int"
    if not isinstance(n, int) or not 8 <= n <= 256:
        msg = f"N = {n} is out of range for wgmma"
    elif n % 8:
        msg = f"N = {n} is not a multiple of 8 for wgmma"
    elif integer and n not in WGMMA_INT_N:
        msg = f"N = {n} is not a supported N for wgmma with {a_dtype} inputs"
    else:
        msg = ""
    if msg:
        help_text = "use N in {8, 16, 24} or 32..256 step 16" if integer else "use N in 8..256, step 8"
        out.append(Problem("SP0532", msg, help_text, "n"))
    selectors = (0, 1) if fam_a in ("f16", "bf16", "tf32") and sparse else (0,)
    if spsel not in selectors:
        where = f"sparse wgmma with {a_dtype} inputs" if sparse else "a dense wgmma"
        out.append(Problem("SP0533", f"sparsity selector {spsel} is not valid for {where}",
                           f"use selector {' or '.join(map(str, selectors))}", "spsel"))
    if trans_a and a_from_regs:
        out.append(Problem("SP0534", "A read from registers cannot be transposed",
                           "store A K-major in registers or read it from shared memory", "trans_a"))
    for fld, flag in (("trans_a", trans_a and not a_from_regs), ("trans_b", trans_b)):
        if flag and fam_a not in ("f16", "bf16"):
            out.append(Problem("SP0534", f"wgmma can only transpose f16/bf16 operands, not {a_dtype}",
                               "store the operand K-major in shared memory", fld))
    return out
