"""Per-register element addresses and in-bounds predicates of a ``tensor[T, rank]`` box on the generic
(non-TMA) path of ``t.load_tile(offsets, shape)`` / ``t.store_tile(offsets, tile)``.

Register r holds the element at coordinates ``c = thread ^ reg_r`` of the box (``thread``: the XOR of
the thread's lane and warp bases; ``reg_r``: the register's compile-time offset). Its index along dim
d is the i32 ``idx_d = c_d + off_d`` (wrapping), it is inside the tensor where ``idx_d <u shape_d`` for
every d, and its address is ``ptr + sum_d sext(idx_d) * sext(stride_d)`` (64-bit, in elements).

The exact form (:func:`exact_tile_addresses`) computes all of that per register: per element and
dim an i32 add, an extension, a 64-bit multiply and add. LLVM's NVPTX straight-line strength
reduction relates each of those addresses to earlier ones, and its time grows faster than the
elements per thread (a 1 x 8192 x 16 bf16 box for sm_100, 1024 elements per thread on 4 warps: 3.9 s
of LLVM, 77 % of it in that pass; a 1 x 65536 x 16 one: about 300 s. The linear form: 0.85 s and 12 s).

The linear form (:func:`linear_tile_addresses`), used where every dim's register part shares no bit
with its lane and warp parts (``disjoint_dims``: then ``c_d = thread_d + reg_d`` as integers):

* per dim, once per thread: ``v_d = thread_d + off_d`` (i32, wrapping) and the thread's base address
  ``base = ptr + sum_d sext(v_d) * sext(stride_d)`` (a ``getelementptr`` without ``inbounds``:
  the base element may lie outside the tensor, even outside its allocation, while elements of the
  thread's other registers are inside);
* per dim and distinct register offset k: ``idx = v_d + k`` (i32) and ``idx <u shape_d``: the same
  i32 value as the exact form's ``(thread_d | k) + off_d`` for every lane (addition modulo 2**32 is
  associative and ``thread_d | k == thread_d + k``), so each register's predicate is the exact one;
* per register r > 0: its address is that of register ``q = r & (r - 1)`` (r without its lowest set
  bit) plus the 64-bit step ``sum_d (reg_d(r) - reg_d(q)) * sext(stride_d) * element bytes``, one
  step per distinct coordinate difference (about one per register bit), added by an inline-asm
  ``add.s64``. The add is inline asm because any ``add`` or ``getelementptr`` with a run-time
  operand is a candidate of the straight-line strength reduction, which for each candidate scans
  the earlier ones that share its stride or base and stops early only on a compile-time delta: run-time
  strides give none, so the scan is quadratic whatever the arrangement (a chain of
  ``getelementptr``s took six times as long as the exact form). The PTX has one ``add.s64`` per element.

Why the address is the exact one wherever the predicate holds. Fix a lane and a register, and a dim
d with register offset ``k`` (``0 <= k < 2**20``: a box has at most 2**20 elements, SP0344, and
:func:`linear_form_applies` checks it). The predicate holds, so the exact i32 index ``idx_d`` lies in
``[0, shape_d)``, ``shape_d <= 2**31 - 1``: its sign extension is its value. ``v_d == idx_d - k (mod
2**32)`` and ``idx_d - k`` lies in ``(-2**20, 2**31)``, inside the i32 range, so ``sext(v_d) == idx_d
- k`` exactly, and ``sext(v_d) + k == sext(idx_d)``: the per-dim indices of the two forms are equal as
integers. Summing over the chain from register 0 (offset 0, whose address is ``base``) to r, the
steps add up to ``sum_d reg_d(r) * stride_d`` elements, so the linear address is ``ptr + sum_d
(sext(v_d) + reg_d(r)) * sext(stride_d)`` modulo 2**64: the exact form's sum, whose 64-bit adds and
``getelementptr`` are modulo 2**64 too (modular addition is associative). Where the predicate fails
for a lane (outside the tensor, or an index that wrapped: ``v_d + k`` past ``2**31 - 1`` is
negative, above ``shape_d`` unsigned), the linear address may differ from the exact one; it is only
computed, never dereferenced: every access of a box is predicated on its register's predicate
(``@p ld.global`` / ``@p st.global``), and as a ``getelementptr`` without ``inbounds`` or an asm
result it is an ordinary value, not poison (the exact form's ``inbounds`` address of such a lane is
poison where it leaves the allocation; neither is read).

Where a dim's register and thread parts share bits (an XOR that is not an addition), and for tiles of
at most :data:`LINEAR_ABOVE` registers per thread, the exact form is kept, IR for IR as before.
Registers at the same coordinates (a replicated layout) get the same pointer value, so a store
writes their element once per thread (the exact form wrote it once per register).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...frontend.layout.layouts import LinearLayout
from ...frontend.layout.tile import register_coords
from .address_form import disjoint_dims
from .llvm_text import LLValue, const, llvm_type

if TYPE_CHECKING:
    from .codegen import CodeGen, TensorArg

MAX_REGISTER_OFFSET = 1 << 20
"""The largest box dim (SP0344's 2**20 elements): register offsets lie below it, which the proof needs."""


LINEAR_ABOVE = 128
"""Tiles of at most this many registers per thread keep the exact form: there the strength reduction
is cheap (0.2 s of code generation at 128 elements per thread) and the shipped kernels' tiles (128 x
128 at most over 4 warps) keep their PTX byte for byte."""

def linear_form_applies(layout: LinearLayout) -> bool:
    """Whether :func:`linear_tile_addresses` gives ``layout``'s registers their exact addresses
    (every dim's register part disjoint from its thread part; register offsets below 2**20,
    register 0 at offset 0), for tiles of more than :data:`LINEAR_ABOVE` registers per thread."""
    coords = register_coords(layout)
    return (len(coords) > LINEAR_ABOVE and all(disjoint_dims(layout)) and not any(coords[0])
            and all(0 <= k < MAX_REGISTER_OFFSET for c in coords for k in c))


def tile_addresses(cg: CodeGen, t: TensorArg, offsets: list[LLValue], layout: LinearLayout
                   ) -> tuple[list[LLValue], list[LLValue]]:
    """Per register of ``layout``: the element pointer and the in-bounds predicate of the box of
    ``t`` at ``offsets`` (the linear form where it applies, else the exact one)."""
    if linear_form_applies(layout):
        return linear_tile_addresses(cg, t, offsets, layout)
    return exact_tile_addresses(cg, t, offsets, layout)


def exact_tile_addresses(cg: CodeGen, t: TensorArg, offsets: list[LLValue], layout: LinearLayout
                         ) -> tuple[list[LLValue], list[LLValue]]:
    """Per register: its pointer and predicate, each computed on its own (module docstring)."""
    fb = cg.fb
    coords = cg.coords(layout)
    ptrs, preds = [], []
    ety = llvm_type(t.elem)
    for c in coords:
        lin: LLValue = const(0, "i64")
        ok: LLValue | None = None
        for d in range(len(offsets)):
            idx = fb.binop("add", c[d], offsets[d])
            inside = fb.icmp("ult", idx, t.shape[d])
            ok = inside if ok is None else fb.binop("and", ok, inside)
            term = fb.binop("mul", fb.cast("sext", idx, "i64"), fb.cast("sext", t.strides[d], "i64"))
            lin = fb.binop("add", lin, term)
        ptrs.append(fb.gep(ety, t.ptr, lin))
        assert ok is not None
        preds.append(ok)
    return ptrs, preds


def linear_tile_addresses(cg: CodeGen, t: TensorArg, offsets: list[LLValue], layout: LinearLayout
                          ) -> tuple[list[LLValue], list[LLValue]]:
    """Per register: its pointer (the thread's base plus steps, each a constant multiple of the
    strides) and its exact predicate (module docstring); needs :func:`linear_form_applies`."""
    fb = cg.fb
    rank = len(offsets)
    ety = llvm_type(t.elem)
    thread = cg.thread_base(layout)
    v = [fb.binop("add", thread[d], offsets[d]) for d in range(rank)]
    strides = [fb.cast("sext", t.strides[d], "i64") for d in range(rank)]
    lin: LLValue = const(0, "i64")
    for d in range(rank):
        lin = fb.binop("add", lin, fb.binop("mul", fb.cast("sext", v[d], "i64"), strides[d]))
    base = fb.gep(ety, t.ptr, lin, flags="")
    inside: dict[tuple[int, int], LLValue] = {}
    oks: dict[tuple[int, ...], LLValue] = {}
    preds = []
    coords = register_coords(layout)
    for c in coords:
        for d, k in enumerate(c):
            if (d, k) not in inside:
                idx = v[d] if k == 0 else fb.binop("add", v[d], const(k, "i32"))
                inside[(d, k)] = fb.icmp("ult", idx, t.shape[d])
            prefix = c[:d + 1]
            if prefix not in oks:
                oks[prefix] = inside[(d, k)] if d == 0 else fb.binop("and", oks[c[:d]], inside[(d, k)])
        preds.append(oks[c])
    # register r's address: that of r without its lowest set bit plus a step shared by all the
    # registers that differ from theirs by the same coordinates, added in inline asm (opaque to LLVM's
    # straight-line strength reduction, which would compare every address with every earlier one)
    eb = t.elem.bytes  # the bytes between consecutive elements in global memory (a bool takes one)
    steps: dict[tuple[int, ...], LLValue] = {}
    addrs = [fb.cast("ptrtoint", base, "i64")]
    ptrs = [base]
    for r in range(1, len(coords)):
        q = r & (r - 1)
        diff = tuple(a - b for a, b in zip(coords[r], coords[q], strict=True))
        if not any(diff):
            addrs.append(addrs[q])
            ptrs.append(ptrs[q])
            continue
        if diff not in steps:
            step: LLValue | None = None
            for d, k in enumerate(diff):
                if k:
                    term = fb.binop("mul", strides[d], const(k * eb, "i64"))
                    step = term if step is None else fb.binop("add", step, term)
            assert step is not None
            steps[diff] = step
        a = cg.asm("i64", "add.s64 $0, $1, $2;", "=l,l,l", [addrs[q], steps[diff]], side_effect=False)
        assert a is not None
        addrs.append(a)
        ptrs.append(fb.cast("inttoptr", a, "ptr addrspace(1)"))
    return ptrs, preds
