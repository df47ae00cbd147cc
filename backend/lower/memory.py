"""Lowering of pointer arithmetic, masked global loads and stores, and tensor queries/tile I/O.

Loads and stores are vectorized to up to 16 bytes when (a) consecutive registers of the layout hold
consecutive elements of the last dimension, (b) axis analysis proves the pointers contiguous and
aligned, and (c) the mask is constant across the vector. Masked accesses are predicated PTX
(``@p ld.global.v4.b32``); masked-off lanes of a load read ``other`` (zero by default).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ...frontend.ir import types as T
from ...frontend.ir.axis_info import AxisAnalysis
from ...frontend.ir.core import Operation, Value
from ...frontend.layout.tile import distinct_registers, register_coords, replicated_thread_bits
from .address_form import AddressPlan, address_plan
from .codegen import CodeGen, DTile, lowering
from .deferred import Deferred
from .lane_exchange import exchange_plan, store_exchanged
from .llvm_text import LLValue, const, llvm_type
from .tile_address import tile_addresses
from .wide_address import wide_address, wide_form_applies

_WORD = {1: ("b8", "c", "i8"), 2: ("b16", "h", "i16"), 4: ("b32", "r", "i32"), 8: ("b64", "l", "i64")}


def _axis(cg: CodeGen) -> AxisAnalysis:
    if cg.state.axis is None:
        cg.state.axis = AxisAnalysis(cg.func)
    return cg.state.axis


@lowering("addptr")
def lower_addptr(cg: CodeGen, op: Operation) -> None:
    from .elementwise import map_values

    elem = T.element_type(op.result.type)
    assert isinstance(elem, T.PointerType)
    ety = llvm_type(elem.elem) if elem.elem.bits >= 8 else "i8"

    def gep(v: list[LLValue], flags: str = "inbounds") -> LLValue:
        off = v[1]
        if off.type != "i64":
            off = cg.fb.cast("sext", off, "i64")
        return cg.fb.gep(ety, v[0], off, flags=flags)

    def exact_gep(v: list[LLValue]) -> LLValue:
        # (no ``inbounds`` on a sign-extended i32 offset: with it, NVPTX code generation separates
        # the constant of sext(s + 128) as sext(s) + 128, the unwrapped sum; docs/language.md rule 7)
        return gep(v, "" if v[1].type != "i64" else "inbounds")

    def wide(v: list[LLValue]) -> LLValue:
        return wide_address(cg, v[0], v[1], max(1, elem.elem.bits // 8))

    ptype = llvm_type(elem)
    plan = _address_plan(cg, op)
    if plan is None:  # (a large tile: one opaque address per register, wide_address.py)
        registers = len(register_coords(op.result.layout)) if isinstance(op.result.type, T.TileType) else 0
        map_values(cg, op, wide if wide_form_applies(registers, ptype) else exact_gep)
        return
    # constant offsets from one base address per (pointer, base offset): address_form.py
    ptr, offs = cg.get(op.operand("ptr")), cg.tile(op.operand("offset"))
    ins = [(ptr.regs[r] if isinstance(ptr, DTile) else ptr, offs.regs[q], offs.regs[r], k)
           for r, (q, k) in enumerate(plan)]
    base_fn = wide if wide_form_applies(len({(p.ref, o.ref) for p, o, _, _ in ins}), ptype) else gep
    bases: dict[tuple[str, str], LLValue] = {}
    memo: dict[tuple[str, str], LLValue] = {}
    regs = []
    for p, base_off, off, k in ins:
        key = (p.ref, off.ref)
        if key not in memo:
            bkey = (p.ref, base_off.ref)
            if bkey not in bases:  # register q's own address, as map_values gives it
                bases[bkey] = base_fn([p, base_off])
            memo[key] = bases[bkey] if k == 0 else cg.fb.gep(ety, bases[bkey], const(k, "i64"), flags="")
        regs.append(memo[key])
    cg.set(op.result, DTile(op.result.layout, regs, elem))


def _address_plan(cg: CodeGen, op: Operation) -> AddressPlan | None:
    """The constant-offset form of an ``addptr``'s registers where axis analysis proves it (None:
    one extended offset per register, as for a scalar, a deferred operand or unproven offsets)."""
    off_v = op.operand("offset")
    elem = T.element_type(off_v.type)
    if cg.defers(op) or not isinstance(off_v.type, T.TileType) or not isinstance(elem, T.ScalarType):
        return None
    offs, ptr = cg.get(off_v), cg.get(op.operand("ptr"))
    if not elem.is_int or elem.bits not in (32, 64) or not isinstance(offs, DTile):
        return None
    if offs.layout != op.result.layout or (isinstance(ptr, DTile) and ptr.layout != op.result.layout):
        return None  # (map_values reports it: the plan's registers would not be the tiles')
    return address_plan(offs.layout, _axis(cg).get(off_v), elem.bits)


def axis_width(cg: CodeGen, ptr: Value, mask: Value | None, elem_bytes: int) -> int:
    """Elements per access that axis analysis allows for a pointer tile along its last dimension
    (contiguity, alignment, the mask's constancy; a power of two, 16 bytes at most), whatever the
    layout gives each thread."""
    if not isinstance(ptr.type, T.TileType):
        return 1
    last = len(T.shape_of(ptr.type)) - 1
    info = _axis(cg).get(ptr)
    vec = min(max(1, 16 // elem_bytes), info.contiguity[last], max(1, info.divisibility[last] // elem_bytes))
    if mask is not None and isinstance(mask.type, T.TileType):
        vec = min(vec, _axis(cg).get(mask).constancy[last])
    return 1 << (max(1, vec).bit_length() - 1)


def vector_width(cg: CodeGen, ptr: Value, mask: Value | None, elem_bytes: int, allowed: int | None = None) -> int:
    """Elements per access for a pointer tile (a power of two, 16 bytes at most); ``allowed``: its
    :func:`axis_width` where the caller has it."""
    if not isinstance(ptr.type, T.TileType):
        return 1
    layout = ptr.layout
    shape = T.shape_of(ptr.type)
    last = len(shape) - 1
    vec = axis_width(cg, ptr, mask, elem_bytes) if allowed is None else allowed
    # consecutive registers must walk the last dim: reg bit b -> last-dim bit b
    offs = register_coords(layout)
    v = 1
    while v < vec and v < len(offs):
        ok = all(offs[i] == tuple(i if d == last else 0 for d in range(len(shape))) for i in range(2 * v))
        if not ok:
            break
        v *= 2
    return max(1, v)


def _groups(n_regs: int, vec: int) -> list[list[int]]:
    return [list(range(s, s + vec)) for s in range(0, n_regs, vec)]


def run_words(vec: int, elem_bytes: int) -> tuple[int, int, int]:
    """(bytes, word bytes, words) of a run of ``vec`` elements: 32-bit words, a narrower run in one
    word of its size, 8-byte elements in 64-bit words."""
    total = vec * elem_bytes
    word = elem_bytes if elem_bytes > 4 else (4 if total >= 4 else total)
    return total, word, total // word


def pack_words(cg: CodeGen, vals: list[LLValue], elem_bytes: int, word_bytes: int) -> list[LLValue]:
    """Bit-pack element values into ``word_bytes``-sized integers (little-endian)."""
    fb = cg.fb
    ity = f"i{8 * elem_bytes}"
    ints = [fb.cast("bitcast", v, ity) if v.type != ity else v for v in vals]
    per = word_bytes // elem_bytes
    if per == 1:
        wty = f"i{8 * word_bytes}"
        return [fb.cast("zext", x, wty) if x.type != wty else x for x in ints] if word_bytes >= elem_bytes else ints
    words = []
    wty = f"i{8 * word_bytes}"
    for s in range(0, len(ints), per):
        acc: LLValue = const(0, wty)
        for i, x in enumerate(ints[s:s + per]):
            z = fb.cast("zext", x, wty)
            if i:
                z = fb.binop("shl", z, const(8 * elem_bytes * i, wty))
            acc = fb.binop("or", acc, z)
        words.append(acc)
    return words


def unpack_words(cg: CodeGen, words: list[LLValue], elem_bytes: int, word_bytes: int, ety: str) -> list[LLValue]:
    fb = cg.fb
    ity = f"i{8 * elem_bytes}"
    per = word_bytes // elem_bytes
    out = []
    for w in words:
        for i in range(per):
            x = w
            if i:
                x = fb.binop("lshr", x, const(8 * elem_bytes * i, w.type))
            x = fb.cast("trunc", x, ity) if ity != w.type else x
            out.append(fb.cast("bitcast", x, ety) if ety != ity else x)
    return out


def _elem_bytes(elem: T.ScalarType) -> int:
    return 1 if elem.is_bool else elem.bytes


def global_access(cg: CodeGen, is_load: bool, ptr: LLValue, mask: LLValue | None, vals: list[LLValue] | None,
                  others: list[LLValue] | None, elem: T.ScalarType, vec: int) -> list[LLValue]:
    """One (possibly predicated) access of ``vec`` consecutive elements starting at ``ptr``."""
    fb = cg.fb
    eb = _elem_bytes(elem)
    ety = llvm_type(elem) if not elem.is_bool else "i8"
    total, word, nwords = run_words(vec, eb)
    wname, wcon, wty = _WORD[word]
    if word == 1:  # PTX has no 8-bit registers: bytes travel in 16-bit ones
        wcon, wty = "h", "i16"
    vsuffix = f".v{nwords}" if nwords > 1 else ""
    regs = "{" + ", ".join(f"${i}" for i in range(nwords)) + "}" if nwords > 1 else "$0"
    if is_load:
        if mask is None:
            vty = f"<{nwords} x i{8 * word}>" if nwords > 1 else f"i{8 * word}"
            raw = fb.value(f"load {vty}, ptr addrspace(1) {ptr.ref}, align {total}", vty, "ld")
            words = [raw] if nwords == 1 else [fb.extract_element(raw, i, f"i{8 * word}") for i in range(nwords)]
        else:
            zero = const(0, f"i{8 * word}")
            if elem.is_bool and others is not None:  # i1 values travel as bytes, as stored ones do
                others = [fb.cast("zext", v, "i8") if v.type == "i1" else v for v in others]
            other_words = pack_words(cg, others, eb, word) if others is not None else [zero] * nwords
            if word == 1:
                other_words = [fb.cast("zext", w, "i16") for w in other_words]
            movs = " ".join(f"mov.b{16 if word == 1 else 8 * word} ${i}, ${nwords + 1 + i};" for i in range(nwords))
            text = f"{movs} @${2 * nwords + 1} ld.global{vsuffix}.{wname} {regs}, [${nwords}];"
            cons = ",".join(["=&" + wcon] * nwords) + ",l," + ",".join([wcon] * nwords) + ",b"
            ret = wty if nwords == 1 else "{" + ", ".join([wty] * nwords) + "}"
            res = cg.asm(ret, text, cons, [ptr, *other_words, mask], side_effect=True)
            assert res is not None
            words = [res] if nwords == 1 else [fb.extract(res, i, wty) for i in range(nwords)]
            if word == 1:
                words = [fb.cast("trunc", w, "i8") for w in words]
        elems = unpack_words(cg, words, eb, word, ety)
        if elem.is_bool:
            elems = [fb.icmp("ne", e, const(0, "i8")) for e in elems]
        return elems
    assert vals is not None
    if elem.is_bool:
        vals = [fb.cast("zext", v, "i8") for v in vals]
    words = pack_words(cg, vals, eb, word)
    if mask is None:
        vty = f"<{nwords} x i{8 * word}>" if nwords > 1 else f"i{8 * word}"
        if nwords > 1:
            vec_v = LLValue("poison", vty)
            for i, w in enumerate(words):
                vec_v = fb.insert_element(vec_v, w, i)
        else:
            vec_v = words[0]
        fb.emit(f"store {vty} {vec_v.ref}, ptr addrspace(1) {ptr.ref}, align {total}")
        return []
    if word == 1:
        words = [fb.cast("zext", w, "i16") for w in words]
    ins = ", ".join(f"${i + 1}" for i in range(nwords))
    text = f"@${nwords + 1} st.global{vsuffix}.{wname} [$0], {('{' + ins + '}') if nwords > 1 else ins};"
    cons = "l," + ",".join([wcon] * nwords) + ",b"
    cg.asm("void", text, cons, [ptr, *words, mask], side_effect=True)
    return []


@lowering("load")
def lower_load(cg: CodeGen, op: Operation) -> None:
    ptr_v, mask_v, other_v = op.operand("ptr"), op.optional_operand("mask"), op.optional_operand("other")
    elem = T.element_type(op.result.type)
    assert isinstance(elem, T.ScalarType)
    ptr = cg.get(ptr_v)
    if not isinstance(ptr, DTile):
        mask = cg.get(mask_v) if mask_v is not None else None
        other = [cg.get(other_v)] if other_v is not None else None
        cg.set(op.result, global_access(cg, True, ptr, mask, None, other, elem, 1)[0])
        return
    vec = vector_width(cg, ptr_v, mask_v, _elem_bytes(elem))
    mask = cg.tile(mask_v) if mask_v is not None else None
    other = cg.tile(other_v) if other_v is not None else None
    # registers at the same coordinates hold the same element (a broadcast register basis, e.g. a
    # per-row bias of an MMA accumulator's (BM, 1) slice): one load each, its value reused (a masked
    # load is inline asm, which LLVM does not merge)
    offsets = register_coords(ptr_v.layout)
    groups = [(g, tuple(offsets[i] for i in g)) for g in _groups(len(ptr.regs), vec)]

    def access(g: tuple[int, ...]) -> list[LLValue]:  # the load of one group of registers
        m = mask.regs[g[0]] if mask is not None else None
        o = [other.regs[i] for i in g] if other is not None else None
        return global_access(cg, True, ptr.regs[g[0]], m, None, o, elem, vec)

    if len({at for _, at in groups}) < len(groups):
        # a broadcast vector (an epilogue's bias or scales): each access emitted where its value is
        # first used, so that its registers do not sit next to the accumulator's (deferred.py)
        cg.set(op.result, DTile(op.result.layout, cg.pending.add(_deferred_loads(groups, access)), elem))
        return
    cg.pending.force()  # an op that defers nothing: what is pending goes first
    regs = [v for g, _ in groups for v in access(tuple(g))]
    cg.set(op.result, DTile(op.result.layout, regs, elem))


def _deferred_loads(groups: list[tuple[list[int], tuple[tuple[int, ...], ...]]],
                    access: Callable[[tuple[int, ...]], list[LLValue]]) -> list[Deferred]:
    """The registers of a load, one ``access`` per distinct group of coordinates, emitted when one
    of its registers is first read."""
    by_coords: dict[tuple[tuple[int, ...], ...], list[Deferred]] = {}
    regs: list[Deferred] = []
    for g, at in groups:
        if at not in by_coords:
            once = functools.cache(functools.partial(access, tuple(g)))
            by_coords[at] = [Deferred(lambda once=once, j=j: once()[j]) for j in range(len(g))]
        regs.extend(by_coords[at])
    return regs


@lowering("store")
def lower_store(cg: CodeGen, op: Operation) -> None:
    ptr_v, val_v, mask_v = op.operand("ptr"), op.operand("value"), op.optional_operand("mask")
    elem = T.element_type(val_v.type)
    assert isinstance(elem, T.ScalarType)
    ptr = cg.get(ptr_v)
    if not isinstance(ptr, DTile):
        mask = cg.get(mask_v) if mask_v is not None else None
        global_access(cg, False, ptr, mask, [cg.get(val_v)], None, elem, 1)
        return
    val = cg.tile(val_v)
    mask = cg.tile(mask_v) if mask_v is not None else None
    eb = _elem_bytes(elem)
    allowed = axis_width(cg, ptr_v, mask_v, eb)
    vec = vector_width(cg, ptr_v, mask_v, eb, allowed)
    plan = exchange_plan(ptr_v, val_v, mask_v, vec, allowed, _axis(cg).get(ptr_v).contiguity[-1], eb)
    if plan is not None:  # wider accesses after a lane exchange (lane_exchange.py)
        store_exchanged(cg, plan, ptr, val, mask, elem, eb)
        return
    seen: set[tuple[str, ...]] = set()
    for g in _groups(len(ptr.regs), vec):
        key = tuple(ptr.regs[i].ref for i in g)
        if key in seen:  # replicated registers hold the same element: store it once per thread
            continue
        seen.add(key)
        m = mask.regs[g[0]] if mask is not None else None
        global_access(cg, False, ptr.regs[g[0]], m, [val.regs[i] for i in g], None, elem, vec)


# ------------------------------------------------------------------------------------------------
# Tensors (generic path: per-element addresses, tile_address.py; the Hopper/Blackwell lowering uses TMA instead)
# ------------------------------------------------------------------------------------------------
@lowering("tensor.dim", "tensor.stride")
def lower_tensor_query(cg: CodeGen, op: Operation) -> None:
    t = cg.get(op.operand("tensor"))
    d = op.attrs["dim"]
    cg.set(op.result, t.shape[d] if op.name == "tensor.dim" else t.strides[d])


@lowering("tensor.load_tile")
def lower_load_tile(cg: CodeGen, op: Operation) -> None:
    t = cg.get(op.operand("tensor"))
    offs = [cg.scalar(v) for v in op.operand_group("offset")]
    res = op.result
    elem = T.element_type(res.type)
    assert isinstance(elem, T.ScalarType)
    ptrs, preds = tile_addresses(cg, t, offs, res.layout)
    regs = [global_access(cg, True, p, m, None, None, elem, 1)[0] for p, m in zip(ptrs, preds, strict=True)]
    cg.set(res, DTile(res.layout, regs, elem))


@lowering("tensor.store_tile")
def lower_store_tile(cg: CodeGen, op: Operation) -> None:
    t = cg.get(op.operand("tensor"))
    offs = [cg.scalar(v) for v in op.operand_group("offset")]
    val_v = op.operand("value")
    val = cg.tile(val_v)
    elem = T.element_type(val_v.type)
    assert isinstance(elem, T.ScalarType)
    ptrs, preds = tile_addresses(cg, t, offs, val.layout)
    seen: set[str] = set()
    for p, m, v in zip(ptrs, preds, val.regs, strict=True):
        if p.ref in seen:
            continue
        seen.add(p.ref)
        global_access(cg, False, p, m, [v], None, elem, 1)


# ------------------------------------------------------------------------------------------------
# Atomics (frontend/ops/atomic.py). PTX ``atom`` through inline asm: LLVM 22's NVPTX backend drops
# the ordering and the syncscope of ``atomicrmw`` (``acq_rel`` at block scope became a plain
# relaxed ``atom.global.add.u32``; checked in tests/backend/test_lower_atomic.py), and the asm
# predicates each access on its mask as the masked loads and stores above do.
# ------------------------------------------------------------------------------------------------
_ATOM_TYPES = {
    "add": {"i32": "s32", "u32": "u32", "i64": "u64", "u64": "u64", "f16": "noftz.f16", "f32": "f32", "f64": "f64"},
    "max": {"i32": "s32", "u32": "u32", "i64": "s64", "u64": "u64"},
    "xchg": {n: f"b{b}" for n, b in (("i32", 32), ("u32", 32), ("f32", 32), ("i64", 64), ("u64", 64), ("f64", 64))},
}
_ATOM_TYPES["min"] = _ATOM_TYPES["max"]
_ATOM_TYPES["cas"] = _ATOM_TYPES["xchg"]
_ATOM_OP = {"add": "add", "max": "max", "min": "min", "xchg": "exch", "cas": "cas"}


def atom_instruction(kind: str, elem: T.ScalarType, sem: str, scope: str) -> str:
    """The PTX instruction of one atomic, e.g. ``atom.acq_rel.gpu.global.add.u32``."""
    return f"atom.{sem}.{scope}.global.{_ATOM_OP[kind]}.{_ATOM_TYPES[kind][elem.name]}"


def _atomic_one(cg: CodeGen, op: Operation, elem: T.ScalarType, ptr: LLValue, operands: list[LLValue],
                pred: LLValue | None) -> LLValue:
    """One atomic where ``pred`` holds (always when None); its old value, 0 where it did not run."""
    fb = cg.fb
    wname, wcon, wty = _WORD[_elem_bytes(elem)]
    ety = llvm_type(elem)
    words = [fb.cast("bitcast", v, wty) for v in operands]
    ins = ", ".join(f"${i + 2}" for i in range(len(words)))
    inst = atom_instruction(op.attrs["kind"], elem, op.attrs["sem"], op.attrs["scope"])
    args = [ptr, *words]
    if pred is None:
        text, cons = f"{inst} $0, [$1], {ins};", f"=&{wcon},l," + ",".join([wcon] * len(words))
    else:
        text = f"mov.{wname} $0, 0; @${2 + len(words)} {inst} $0, [$1], {ins};"
        cons = f"=&{wcon},l," + ",".join([wcon] * len(words)) + ",b"
        args.append(pred)
    res = cg.asm(wty, text, cons + ",~{memory}", args, side_effect=True)
    assert res is not None
    return fb.cast("bitcast", res, ety)


def _and(cg: CodeGen, a: LLValue | None, b: LLValue | None) -> LLValue | None:
    if a is None or b is None:
        return a if b is None else b
    return cg.fb.binop("and", a, b)


def _result_used(cg: CodeGen, op: Operation) -> bool:
    res = op.result
    return any(v is res for o in cg.func.body.block.ops for x in o.walk() for v in x.operands)


def _holder_predicate(cg: CodeGen, lane_mask: int, warp_mask: int) -> LLValue | None:
    """True in the threads whose replicated lane and warp bits are zero (``replicated_thread_bits``)."""
    fb = cg.fb
    pred: LLValue | None = None
    for src, bits in ((cg.lane_id, lane_mask), (cg.warp_id, warp_mask)):
        if bits:
            masked = fb.value(f"and i32 {src().ref}, {bits}", "i32", "rep", entry=True)
            pred = _and(cg, pred, fb.value(f"icmp eq i32 {masked.ref}, 0", "i1", "rep", entry=True))
    return pred


@lowering("atomic_rmw", "atomic_cas")
def lower_atomic(cg: CodeGen, op: Operation) -> None:
    from .reduce import linear_index, storage_of

    names = ("cmp", "value") if op.name == "atomic_cas" else ("value",)
    ptr_v, mask_v = op.operand("ptr"), op.optional_operand("mask")
    elem = T.element_type(op.result.type)
    assert isinstance(elem, T.ScalarType)
    fb = cg.fb
    ptr = cg.get(ptr_v)
    used = _result_used(cg, op)
    if not isinstance(ptr, DTile):  # a scalar: one thread performs it, the others read its result
        pred = _and(cg, cg.get(mask_v) if mask_v is not None else None, cg.is_leader())
        old = _atomic_one(cg, op, elem, ptr, [cg.get(op.operand(n)) for n in names], pred)
        if used:
            sty, eb = storage_of(elem)
            slot = cg.smem_ptr(cg.smem_alloc(eb, max(eb, 4)))
            cg.barrier()
            then, cont = fb.new_block("atom_w"), fb.new_block("atom_c")
            fb.cond_br(cg.is_leader(), then, cont)
            fb.set_block(then)
            fb.emit(f"store {sty} {old.ref}, ptr addrspace(3) {slot.ref}, align {eb}")
            fb.br(cont)
            fb.set_block(cont)
            cg.barrier()
            old = fb.value(f"load {sty}, ptr addrspace(3) {slot.ref}, align {eb}", sty, "atom")
        cg.set(op.result, old)
        return
    layout = ptr.layout
    vals = [cg.tile(op.operand(n)) for n in names]
    mask = cg.tile(mask_v) if mask_v is not None else None
    lane_mask, warp_mask = replicated_thread_bits(layout)
    holder = _holder_predicate(cg, lane_mask, warp_mask)
    offs = register_coords(layout)
    first: dict[tuple[int, ...], LLValue] = {}
    for r in distinct_registers(layout):  # each element once: its first register, in its holder thread
        pred = _and(cg, mask.regs[r] if mask is not None else None, holder)
        first[offs[r]] = _atomic_one(cg, op, elem, ptr.regs[r], [v.regs[r] for v in vals], pred)
    if used and holder is not None:  # the other threads holding an element read its old value
        shape = T.shape_of(op.result.type)
        sty, eb = storage_of(elem)
        numel = 1
        for s in shape:
            numel *= s
        base = cg.smem_alloc(numel * eb, 16)
        coords = cg.coords(layout)
        cg.barrier()
        then, cont = fb.new_block("atom_w"), fb.new_block("atom_c")
        fb.cond_br(holder, then, cont)
        fb.set_block(then)

        def slot(r: int) -> LLValue:
            lin = linear_index(cg, coords[r], shape)
            return cg.smem_ptr(fb.binop("add", fb.binop("mul", lin, const(eb, "i32")), const(base, "i32")))

        for r in distinct_registers(layout):
            fb.emit(f"store {sty} {first[offs[r]].ref}, ptr addrspace(3) {slot(r).ref}, align {eb}")
        fb.br(cont)
        fb.set_block(cont)
        cg.barrier()
        for r in distinct_registers(layout):
            first[offs[r]] = fb.value(f"load {sty}, ptr addrspace(3) {slot(r).ref}, align {eb}", sty, "atom")
    cg.set(op.result, DTile(op.result.layout, [first[o] for o in offs], elem))


@lowering("fence.memory")
def lower_fence(cg: CodeGen, op: Operation) -> None:
    """``fence.<sem>.<scope>`` (inline asm with a memory clobber, so LLVM moves no access across)."""
    cg.asm("void", f"fence.{op.attrs['sem']}.{op.attrs['scope']};", "~{memory}", [], side_effect=True)
