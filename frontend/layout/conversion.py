"""Layout conversion plans: how a value moves from one register layout to another.

:func:`conversion_plan` — register layout to register layout over the same logical tensor: no-op,
register permutation, intra-warp shuffles or a round trip through shared memory, chosen by a small
cost model. A pure function returning a frozen :class:`ConversionPlan` (never a hand-written
table); a plan that cannot be made has kind ``none`` and a ``reason``; ``require()`` turns it into
a :class:`CompileError` (SP0409).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..spans import UNKNOWN_SPAN, Span
from .gf2 import GF2Span, LayoutError, bit_list, log2_exact
from .hardware_dims import BLOCK, LANE, REG, SUB, WARP
from .layouts import LinearLayout
from .smem import StorePlan, require_plan, store_plan, xor_images
from .smem_layouts import SWIZZLE_BYTES, smem_from_address_map


@dataclass(frozen=True)
class LinearIndex:
    """A run-time index ``const ^ XOR(masks[dim][i] for each set bit i of dim)``."""

    const: int
    masks: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def eval(self, **dims: int) -> int:
        v = self.const
        for dim, masks in self.masks:
            x = dims.get(dim, 0)
            for i, m in enumerate(masks):
                if x >> i & 1:
                    v ^= m
        return v

    @property
    def is_static(self) -> bool:
        return not any(m for _, ms in self.masks for m in ms)


@dataclass(frozen=True)
class ShuffleRound:
    """One ``shfl.sync.idx``: the receiver fills element ``dst_reg`` from lane ``src_lane`` (its own
    lane/warp); the sender passes its element ``src_reg`` (evaluated with the sender's lane/warp).
    ``local`` rounds read the thread's own registers and need no shuffle.  With ``accept`` set,
    the receiver keeps the value only if ``accept.eval(lane=own lane) == accept_value`` (a
    sender owes different registers to several receivers, so ``dst_reg`` takes several rounds)."""

    dst_reg: int
    src_lane: LinearIndex
    src_reg: LinearIndex
    local: bool = False
    accept: LinearIndex | None = None
    accept_value: int = 0


@dataclass(frozen=True)
class SmemExchange:
    smem_layout: LinearLayout
    swizzle: str
    store: StorePlan
    load: StorePlan


@dataclass(frozen=True)
class ConversionPlan:
    """How to convert a register layout ``src`` to ``dst`` over the same logical tensor.

    ``kind``: ``noop``; ``registers`` (same thread ownership: ``register_map[r]`` gives the source
    element of destination element ``r``); ``shuffle`` (same warp: ``rounds``); ``shared_memory``
    (``smem``: store with ``src``, barrier, load with ``dst``); or ``none`` with ``reason``.
    Element indices merge ``reg`` and ``sub`` (``reg·S + sub``).  ``cost`` is in issue slots per
    warp (register move 0, select 1, shuffle 2, shared-memory wavefront 2, barrier 8);
    ``considered`` lists every strategy with its cost or why it does not apply.
    """

    kind: str
    cost: float = 0.0
    reason: str | None = None
    register_map: tuple[LinearIndex, ...] = ()
    rounds: tuple[ShuffleRound, ...] = ()
    smem: SmemExchange | None = None
    considered: tuple[tuple[str, float | None, str], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.kind != "none"

    def require(self, span: Span = UNKNOWN_SPAN) -> ConversionPlan:
        require_plan(self.ok, "SP0409", self.reason, "the two layouts must describe the same tensor", span)
        return self


_THREAD_DIMS = (LANE, WARP, BLOCK)


def _normalize_reg_layout(layout: LinearLayout, out_order: Sequence[str]) -> LinearLayout:
    if SUB in layout.in_names:
        layout = layout.merge_ins([REG, SUB], REG)
    extra = [n for n in layout.in_names if n not in (REG, *_THREAD_DIMS)]
    if extra:
        raise LayoutError("SP0409", f"register layouts have input dims reg/sub/lane/warp/block, found {extra}")
    for n in (REG, *_THREAD_DIMS):
        if n not in layout.in_names:
            layout = layout * LinearLayout.zeros(n, 1, ())
    return layout.transpose_ins([REG, *_THREAD_DIMS]).transpose_outs(list(out_order))


STRATEGIES = ("registers", "shuffle", "shared_memory")


def conversion_plan(src: LinearLayout, dst: LinearLayout, *, elem_bits: int = 32,
                    allow: Sequence[str] = STRATEGIES) -> ConversionPlan:
    """Plan ``convert_layout(src -> dst)`` (Triton's strategy ladder, arXiv 2505.23819 §5.4, with a
    simple cost model): the cheapest of the ``allow``-ed strategies that apply (registers when
    every thread already holds what it needs, shuffles when elements stay in their warp, shared
    memory otherwise)."""
    unknown = set(allow) - set(STRATEGIES)
    if unknown:
        raise LayoutError("SP0409", f"unknown conversion strategies {sorted(unknown)}", help=f"use {STRATEGIES}")
    if sorted(src.out_dims) != sorted(dst.out_dims):
        return ConversionPlan("none", reason=f"different tensors: {sorted(src.out_dims)} vs {sorted(dst.out_dims)}")
    order = [n for n, _ in src.out_dims]
    s = _normalize_reg_layout(src, order)
    d = _normalize_reg_layout(dst, order)
    if s == d:
        return ConversionPlan("noop", 0.0, considered=(("noop", 0.0, "identical layouts"),))
    considered: list[tuple[str, float | None, str]] = []
    candidates: list[ConversionPlan] = []
    same_threads = all(s.in_size(n) == d.in_size(n) for n in _THREAD_DIMS)
    if not same_threads:
        considered.append(("registers", None, "different numbers of lanes/warps/CTAs"))
        considered.append(("shuffle", None, "different numbers of lanes/warps/CTAs"))
    else:
        reg_plan = _register_plan(s, d)
        considered.append(("registers", reg_plan.cost if reg_plan else None,
                           "same thread ownership" if reg_plan else "elements change threads"))
        if reg_plan:
            candidates.append(reg_plan)
        shfl = _shuffle_plan(s, d, elem_bits) if s.in_size(LANE) == 32 else None
        considered.append(("shuffle", shfl.cost if shfl else None,
                           "elements stay in their warp" if shfl else "elements change warps"))
        if shfl:
            candidates.append(shfl)
    smem = _smem_plan(s, d, elem_bits)
    if isinstance(smem, str):
        considered.append(("shared_memory", None, smem))
    else:
        considered.append(("shared_memory", smem.cost, f"{smem.smem.swizzle} swizzle"))
        candidates.append(smem)
    if not candidates:
        return ConversionPlan("none", reason="; ".join(f"{k}: {why}" for k, _, why in considered),
                              considered=tuple(considered))
    candidates = [c for c in candidates if c.kind in allow]
    if not candidates:
        return ConversionPlan("none", reason="no allowed strategy applies: " + "; ".join(
            f"{k}: {why}" for k, _, why in considered), considered=tuple(considered))
    best = min(candidates, key=lambda p: p.cost)
    return ConversionPlan(best.kind, best.cost, None, best.register_map, best.rounds, best.smem, tuple(considered))


def _cols(layout: LinearLayout, dim: str) -> list[int]:
    cols = layout.flat_columns()
    start = layout.in_bit_offsets()[dim]
    return list(cols[start:start + layout.in_bits(dim)])


def _register_plan(s: LinearLayout, d: LinearLayout) -> ConversionPlan | None:
    span = GF2Span(_cols(s, REG))
    const_cols = []
    for v in _cols(d, REG):
        sol = span.solve(v)
        if sol is None:
            return None
        const_cols.append(sol)
    masks = []
    for dim in _THREAD_DIMS:
        dim_masks = []
        for dv, sv in zip(_cols(d, dim), _cols(s, dim)):
            sol = span.solve(dv ^ sv)
            if sol is None:
                return None
            dim_masks.append(sol)
        masks.append((dim, tuple(dim_masks)))
    reg_map = tuple(LinearIndex(xor_images(const_cols, r), tuple(masks)) for r in range(d.in_size(REG)))
    selects = sum(1 for m in reg_map if not m.is_static)
    return ConversionPlan("registers", float(selects), register_map=reg_map)


def _shuffle_plan(s: LinearLayout, d: LinearLayout, elem_bits: int) -> ConversionPlan | None:
    nr = s.in_bits(REG)
    span = GF2Span(_cols(s, REG) + _cols(s, LANE))

    def solve(v: int) -> tuple[int, int] | None:
        sol = span.solve(v)
        return None if sol is None else (sol & ((1 << nr) - 1), sol >> nr)

    parts: dict[str, list[tuple[int, int]]] = {}
    for dim in (REG, LANE, WARP, BLOCK):
        out = []
        for i, dv in enumerate(_cols(d, dim)):
            sv = _cols(s, dim)[i] if dim in (WARP, BLOCK) else 0
            sol = solve(dv ^ sv)
            if sol is None:
                return None
            out.append(sol)
        parts[dim] = out
    a = [r for r, _ in parts[REG]]
    e = [lane for _, lane in parts[REG]]
    b = [r for r, _ in parts[LANE]]
    f = [lane for _, lane in parts[LANE]]
    # Receivers l' with the same F·l' read the same sender; they want different registers when B
    # does not vanish on ker(F).  Then one round per value v of B on ker(F): the sender passes the
    # register for v and only receivers whose B·P_ker(l') == v keep it.
    kernel = []
    f_span = GF2Span()
    for i, col in enumerate(f):
        if not f_span.add(col):
            sol = f_span.solve(col)
            assert sol is not None
            kernel.append((1 << i) ^ sol)
    f_plus = _pseudo_inverse(f, 5)
    bk_span = GF2Span(xor_images(b, k) for k in kernel)
    values = _span_elements(bk_span.basis())
    p_ker = [(1 << i) ^ xor_images(f_plus, f[i]) for i in range(5)]
    accept = LinearIndex(0, ((LANE, tuple(xor_images(b, v) for v in p_ker)),)) if len(values) > 1 else None
    shfl_cost = 2 * max(1, -(-elem_bits // 32))
    recv_masks = ((LANE, tuple(f)), (WARP, tuple(x[1] for x in parts[WARP])),
                  (BLOCK, tuple(x[1] for x in parts[BLOCK])))
    send_lane = tuple(xor_images(b, f_plus[i]) for i in range(5))
    send_warp = tuple(xor_images(b, xor_images(f_plus, lane)) ^ reg for reg, lane in parts[WARP])
    send_block = tuple(xor_images(b, xor_images(f_plus, lane)) ^ reg for reg, lane in parts[BLOCK])
    identity_lanes = f == [1 << i for i in range(5)] and not any(x[1] for x in parts[WARP] + parts[BLOCK])
    rounds = []
    cost = 0.0
    for r in range(d.in_size(REG)):
        lane_const = xor_images(e, r)
        base_reg = xor_images(a, r) ^ xor_images(b, xor_images(f_plus, lane_const))
        src_lane = LinearIndex(lane_const, recv_masks)
        local = lane_const == 0 and identity_lanes
        for v in values:
            src_reg = LinearIndex(base_reg ^ v, ((LANE, send_lane), (WARP, send_warp), (BLOCK, send_block)))
            rounds.append(ShuffleRound(r, src_lane, src_reg, local, accept, v))
            cost += (0 if local else shfl_cost) + (0 if src_reg.is_static else 1) + (1 if accept else 0)
    return ConversionPlan("shuffle", cost, rounds=tuple(rounds))


def _span_elements(basis: Sequence[int]) -> list[int]:
    """Every XOR combination of ``basis`` (0 first)."""
    out = [0]
    for v in basis:
        out += [x ^ v for x in out]
    return out


def _pseudo_inverse(columns: Sequence[int], nbits: int) -> list[int]:
    """``P`` with ``M·P·y == y`` for ``y`` in the image of ``M`` (columns over ``nbits``-bit
    inputs); returned as the images of the unit vectors of the output space."""
    span = GF2Span(columns)
    image = [columns[i] for i in span.pivots]
    pre = [1 << i for i in span.pivots]
    basis = GF2Span(image)
    completion = list(image)
    for j in range(nbits):
        if basis.add(1 << j):
            completion.append(1 << j)
    full = GF2Span(completion)
    out = []
    for j in range(nbits):
        sol = full.solve(1 << j)
        v = 0
        for k in bit_list(sol or 0):
            if k < len(pre):
                v ^= pre[k]
        out.append(v)
    return out


def _row_major_smem(logical: Sequence[tuple[str, int]], elem_bits: int, swizzle: str,
                    order: Sequence[int]) -> LinearLayout:
    """``offset -> logical`` with logical dims flattened in ``order`` (first fastest), then a
    hardware swizzle on byte addresses."""
    addr: dict[str, list[int]] = {n: [] for n, _ in logical}
    shift = 0
    for i in order:
        name, size = logical[i]
        for _ in range(log2_exact(size)):
            addr[name].append((1 << shift) * elem_bits)
            shift += 1
    return smem_from_address_map(list(logical), addr, elem_bits, swizzle)


def _smem_plan(s: LinearLayout, d: LinearLayout, elem_bits: int) -> ConversionPlan | str:
    if s.in_size(BLOCK) > 1 or d.in_size(BLOCK) > 1:
        return "the layouts span several CTAs; shared memory is per CTA"
    logical = list(s.out_dims)
    total_bytes = 1
    for _, size in logical:
        total_bytes *= size
    total_bytes = total_bytes * elem_bits // 8
    best: ConversionPlan | None = None
    rank = len(logical)
    orders = [list(range(rank - 1, -1, -1)), list(range(rank))] if rank > 1 else [[0]]
    s_sub = s.sublayout([REG, LANE, WARP], s.out_names)
    d_sub = d.sublayout([REG, LANE, WARP], d.out_names)
    for order in orders:
        for sw in ("none", "32B", "64B", "128B"):
            if sw != "none" and total_bytes < 8 * SWIZZLE_BYTES[sw]:
                continue
            smem = _row_major_smem(logical, elem_bits, sw, order)
            st = store_plan(s_sub, smem, elem_bits, method="st.shared")
            ld = store_plan(d_sub, smem, elem_bits, method="ld.shared")
            if not (st.ok and ld.ok):
                continue
            warps = s.in_size(WARP)
            cost = 2.0 * (st.wavefronts + ld.wavefronts) * warps + 8.0
            if best is None or cost < best.cost:
                best = ConversionPlan("shared_memory", cost, smem=SmemExchange(smem, sw, st, ld))
    return best if best is not None else "no shared-memory layout could hold both access patterns"


__all__ = ["ConversionPlan", "LinearIndex", "ShuffleRound", "SmemExchange", "conversion_plan"]
