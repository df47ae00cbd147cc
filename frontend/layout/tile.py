"""Register layouts of tiles, as linear layouts from ``(reg, lane, warp)`` to ``(dim0, dim1, ...)``.

Every tile value gets such a layout at layout inference. The helpers here derive the layouts that
shape ops produce (drop a dimension after a reduction, insert a unit dimension, broadcast, permute,
reshape) so that those ops move no data: each output register is one input register of the same
thread. Conversions that do move data are planned by :mod:`conversion` and emitted by the backend.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from .gf2 import GF2Span
from .layouts import LinearLayout
from .library import blocked

REG, LANE, WARP = "reg", "lane", "warp"


def dim_names(rank: int) -> list[str]:
    return [f"dim{i}" for i in range(rank)]


def normalize(layout: LinearLayout, num_warps: int) -> LinearLayout:
    """The same map with input dims exactly ``reg, lane (32), warp (num_warps)`` in that order."""
    rows: dict[str, list[tuple[int, ...]]] = {}
    zero = tuple(0 for _ in layout.out_dims)
    for name, size in ((REG, None), (LANE, 32), (WARP, num_warps)):
        have = [tuple(layout.basis(name, b).values()) for b in range(layout.in_bits(name))] \
            if name in layout.in_names else []
        if size is not None:
            need = size.bit_length() - 1
            if len(have) > need:
                raise ValueError(f"layout uses {1 << len(have)} {name}s, only {size} exist")
            have = have + [zero] * (need - len(have))
        rows[name] = have
    return LinearLayout.from_bases(rows, layout.out_dims)


def default_blocked(shape: Sequence[int], num_warps: int, vec: int = 1) -> LinearLayout:
    """A coalesced blocked layout: ``vec`` consecutive elements of the last dim per thread, lanes
    along the last dim first, warps along the first dims (Triton's default)."""
    rank = len(shape)
    if rank == 0:
        raise ValueError("scalars have no layout")
    spt = [1] * rank
    spt[-1] = max(1, min(vec, shape[-1]))
    tpw = [1] * rank
    left = 32
    for d in reversed(range(rank)):
        room = max(1, shape[d] // spt[d]) if d == rank - 1 else max(1, shape[d])
        take = 1
        while take * 2 <= min(left, room):
            take *= 2
        tpw[d] = take
        left //= take
    tpw[0] *= left  # remaining lanes replicate along dim 0
    wpc = [1] * rank
    wleft = num_warps
    for d in range(rank):
        room = max(1, shape[d] // (spt[d] * tpw[d]))
        take = 1
        while take * 2 <= min(wleft, room):
            take *= 2
        wpc[d] = take
        wleft //= take
    wpc[0] *= wleft
    layout = blocked(list(shape), spt, tpw, wpc, list(reversed(range(rank))))
    return normalize(layout, num_warps)


def drop_dim(layout: LinearLayout, axis: int) -> LinearLayout:
    """The layout of a reduction along ``axis``: the same hardware, that coordinate forgotten
    (bases that only moved along ``axis`` become replication)."""
    names = list(layout.out_names)
    keep = [n for i, n in enumerate(names) if i != axis]
    sub = layout.sublayout(layout.in_names, keep)
    return sub.rename_outs({n: f"dim{i}" for i, n in enumerate(keep)}) if keep else sub


def insert_unit_dim(layout: LinearLayout, axis: int) -> LinearLayout:
    """Add a size-1 logical dim at ``axis`` (expand_dims)."""
    names = list(layout.out_names)
    dims = list(layout.out_dims)
    renamed = layout.rename_outs({n: f"_o{i}" for i, n in enumerate(names)})
    new_dims = [(f"_o{i}", s) for i, (_, s) in enumerate(dims)]
    new_dims.insert(axis, ("_new", 1))
    out = renamed.with_out_dims(new_dims)
    return out.rename_outs({n: f"dim{i}" for i, (n, _) in enumerate(new_dims)})


def remove_unit_dim(layout: LinearLayout, axis: int) -> LinearLayout:
    """Inverse of :func:`insert_unit_dim` (the dim must have size 1)."""
    assert layout.out_dims[axis][1] == 1
    return drop_dim(layout, axis)


def broadcast_layout(src: LinearLayout, shape: Sequence[int]) -> LinearLayout:
    """The layout of ``broadcast(src -> shape)`` moving no data: the bits of each widened dim are
    given to ``src``'s replicated (zero) bases — registers first, then lanes, then warps — and
    to new register bits when there are not enough."""
    rank = len(shape)
    old = [s for _, s in src.out_dims]
    assert len(old) == rank
    rows = {name: [list(src.basis(name, b).values()) for b in range(src.in_bits(name))] for name in src.in_names}
    for d in range(rank):
        if old[d] == shape[d]:
            continue
        assert old[d] == 1, (old, shape)
        need = shape[d].bit_length() - 1
        bit = 0
        for name in (REG, LANE, WARP):
            for basis in rows.get(name, []):
                if bit < need and all(c == 0 for c in basis):
                    basis[d] = 1 << bit
                    bit += 1
        while bit < need:
            extra = [0] * rank
            extra[d] = 1 << bit
            rows.setdefault(REG, []).append(extra)
            bit += 1
    return LinearLayout.from_bases({n: [tuple(b) for b in r] for n, r in rows.items()},
                                   [(f"dim{i}", s) for i, s in enumerate(shape)])


def permute_layout(layout: LinearLayout, perm: Sequence[int]) -> LinearLayout:
    names = list(layout.out_names)
    order = [names[p] for p in perm]
    out = layout.transpose_outs(order)
    return out.rename_outs({n: f"_t{i}" for i, n in enumerate(order)}).rename_outs(
        {f"_t{i}": f"dim{i}" for i in range(len(order))})


def reshape_layout(layout: LinearLayout, shape: Sequence[int]) -> LinearLayout:
    return layout.reshape_outs([(f"dim{i}", s) for i, s in enumerate(shape)])


def register_coords(layout: LinearLayout) -> list[tuple[int, ...]]:
    """For each register index, the XOR of its register bases (the coordinate offset it adds to
    the thread's base coordinate)."""
    return list(_register_coords(layout))


@functools.lru_cache(maxsize=64)
def _register_coords(layout: LinearLayout) -> tuple[tuple[int, ...], ...]:
    """:func:`register_coords`, once per layout (code generation asks for the same layouts' many
    times) and in time linear in the registers: register r's offset is that of r without its
    lowest set bit, XOR that bit's basis."""
    rbits = layout.in_bits(REG) if REG in layout.in_names else 0
    bases = [tuple(layout.basis(REG, b).values()) for b in range(rbits)]
    out: list[tuple[int, ...]] = [tuple(0 for _ in layout.out_dims)]
    for r in range(1, 1 << rbits):
        low = (r & -r).bit_length() - 1
        out.append(tuple(x ^ y for x, y in zip(out[r & (r - 1)], bases[low], strict=True)))
    return tuple(out)


def distinct_registers(layout: LinearLayout) -> list[int]:
    """The register indices holding distinct elements: the first register of each offset in
    :func:`register_coords` (a broadcast register basis repeats elements), in register order."""
    first: dict[tuple[int, ...], int] = {}
    for r, off in enumerate(register_coords(layout)):
        first.setdefault(off, r)
    return list(first.values())


def packed_basis(basis: tuple[int, ...]) -> int:
    """A basis as one bit vector, each coordinate in its own 32-bit field: the XOR of bases is the
    XOR of their packed ints (for GF(2) rank checks, :class:`~.layouts.GF2Span`)."""
    return sum(c << (32 * d) for d, c in enumerate(basis))


def replicated_thread_bits(layout: LinearLayout) -> tuple[int, int]:
    """``(lane mask, warp mask)``: the lane and warp bits whose basis repeats elements that the
    registers or earlier lane/warp bits already reach (a zero basis, a duplicate, or an XOR of
    earlier ones). Together with :func:`distinct_registers` this picks one holder of each
    element: the thread whose lane and warp have those bits zero, in its first register of that
    offset. Each element of the tile has exactly one such holder (the bases taken in the order
    registers, lanes, warps; a dependent basis is a kernel vector whose highest input bit is its
    own, so the holders with every dependent bit zero are one per element). Ops that must act
    once per element (atomics) predicate on it."""
    rank = len(layout.out_dims)
    rbits = layout.in_bits(REG) if REG in layout.in_names else 0
    span = GF2Span(packed_basis(tuple(layout.basis(REG, b).values())) for b in range(rbits))
    masks = []
    for name in (LANE, WARP):
        mask = 0
        for b, basis in enumerate(thread_bases(layout, name)):
            assert len(basis) == rank
            if not span.add(packed_basis(basis)):
                mask |= 1 << b
        masks.append(mask)
    return masks[0], masks[1]


def thread_bases(layout: LinearLayout, name: str) -> list[tuple[int, ...]]:
    if name not in layout.in_names:
        return []
    return [tuple(layout.basis(name, b).values()) for b in range(layout.in_bits(name))]


def same_thread_part(a: LinearLayout, b: LinearLayout) -> bool:
    return thread_bases(a, LANE) == thread_bases(b, LANE) and thread_bases(a, WARP) == thread_bases(b, WARP)


def short_name(layout: LinearLayout) -> str:
    """A compact printable form for ``--emit ir``: ``L[reg=..; lane=..; warp=..]``."""
    parts = []
    for name in layout.in_names:
        bs = thread_bases(layout, name) if name != REG else [tuple(layout.basis(REG, b).values())
                                                             for b in range(layout.in_bits(REG))]
        parts.append(f"{name}=" + ",".join("(" + ",".join(str(c) for c in b) + ")" if len(b) > 1 else str(b[0])
                                            for b in bs))
    return "L[" + "; ".join(parts) + "]"
