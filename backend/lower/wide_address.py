"""Per-register addresses of large pointer tiles whose offsets axis analysis does not relate.

``p + offs`` where :func:`address_form.address_plan` proves nothing (``s + arange(0, B)`` with s a
run-time scalar: the i32 sum may wrap inside the tile; ``(arange(0, B) * s) % n``; a gathered
index) lowers register by register, each ``gep p, sext(offs_r)``. Every such ``getelementptr`` is a
candidate of LLVM's NVPTX straight-line strength reduction, which compares it with the earlier ones:
code generation time grows with the square of the registers per thread (``s + arange(0, B)``, f32,
4 warps, B = 32768 / 65536 / 131072: 0.7 / 2.7 / 11 s, 98 % of it in that pass).

For tiles of more than :data:`tile_address.LINEAR_ABOVE` registers per thread (the threshold of the
box addresses' linear form, so the shipped kernels, 128 registers a tile at most, keep their PTX
byte for byte), each register's address is instead one inline-asm instruction, opaque to the pass:

* an i32 offset (or a narrower one, sign-extended to i32 first): ``mad.wide.s32 d, off, E, p``,
  i.e. ``p + sext(off) * E`` in 64 bits;
* an i64 offset: ``mad.lo.s64 d, off, E, p``, i.e. ``p + off * E`` modulo 2**64;

with ``E`` the element's bytes (1 for sub-byte elements, as the ``getelementptr i8`` of the
per-register form). That is the ``getelementptr``'s address without ``inbounds``: the same 64-bit
value for every offset, wrapped ones included (the per-register form's ``getelementptr``, which has
no ``inbounds`` on an i32 offset, is still related to its neighbours by the strength reduction, which
rewrites ``sext(a + 128)`` as ``sext(a) + 128``: that differs where the i32 sum wraps, docs/language.md
rule 7's known limit). The PTX keeps one instruction per distinct address, as before.

The offsets themselves were the pass's other quadratic input: a thread's coordinate of register r,
``base | k_r``, stays ``or disjoint`` after LLVM's O3 pipeline, which the pass cannot relate to the
others, so each ``s + (base | k_r)`` scanned every earlier one (2 s of code generation for 1024 of
them). For the same large tiles :meth:`CodeGen.coords` writes it ``add nuw nsw`` to an opaque copy
of the base (an inline-asm ``mov``: LLVM knows none of its bits, so it cannot turn the ``add`` back
into an ``or``), and the pass relates them at constant distances (0.03 s). Products of such offsets
by a run-time value (``arange(0, B) * s``) are still superlinear in the pass (about 1.5 s of it at
2048 registers per thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import tile_address
from .llvm_text import LLValue

if TYPE_CHECKING:
    from .codegen import CodeGen

GLOBAL_PTR = "ptr addrspace(1)"


def large_tile(registers: int) -> bool:
    """Whether a tile of ``registers`` registers per thread is past :data:`tile_address.LINEAR_ABOVE`
    (read at each call: the address fuzzer lowers it)."""
    return registers > tile_address.LINEAR_ABOVE


def wide_form_applies(registers: int, ptr_type: str) -> bool:
    """Whether a pointer tile of ``registers`` registers per thread, pointers of LLVM type
    ``ptr_type``, gets the opaque per-register addresses (64-bit global pointers only)."""
    return large_tile(registers) and ptr_type == GLOBAL_PTR


def wide_address(cg: CodeGen, ptr: LLValue, off: LLValue, elem_bytes: int) -> LLValue:
    """``ptr + off * elem_bytes`` (``off`` sign-extended, a 64-bit wrapping sum) in one inline-asm
    instruction (module docstring)."""
    fb = cg.fb
    p = fb.cast("ptrtoint", ptr, "i64")
    if off.type == "i64":
        text, cons = f"mad.lo.s64 $0, $1, {elem_bytes}, $2;", "=l,l,l"
    else:
        if off.type != "i32":
            off = fb.cast("sext", off, "i32")
        text, cons = f"mad.wide.s32 $0, $1, {elem_bytes}, $2;", "=l,r,l"
    a = cg.asm("i64", text, cons, [off, p], side_effect=False)
    assert a is not None
    return fb.cast("inttoptr", a, ptr.type)

