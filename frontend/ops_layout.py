"""Layouts in the language: ``pin``, ``convert_layout`` and the ``layout`` namespace.

Layout inference gives every tile a layout by itself (``layout_inference.py``); these builtins are
for the cases where the user wants to say which:

* ``pin(x, lay)`` — ``x`` has layout ``lay`` at this point (the compiler converts into it if it
  must, and never converts the pinned value away silently: an op that *needs* another layout —
  the wgmma accumulator, a store that cannot take it — is a diagnostic ``SP0422`` with a ``help``
  line, not a hidden conversion; DESIGN.md §Legality, "diagnose only when the user pinned an
  incompatible layout").
* ``convert_layout(x, lay)`` — the same tile redistributed into ``lay``: an explicit conversion,
  whose result is pinned.
* ``layout.blocked(...)``, ``layout.default(...)``, ``layout.wgmma_accumulator(...)`` — named
  layouts as compile-time constants (``@jit`` kernels may also pass any
  :class:`~sparsile.frontend.layouts.LinearLayout` from Python).

Both builtins create a ``convert_layout`` op carrying the layout (attribute ``layout``) and
``pinned=True``; the legality pass makes the pinned layout the value's layout after inference
(:func:`~sparsile.frontend.legality_layout.resolve_pins`). The interpreter ignores layouts.

Importing this module also registers the ``meta[T]`` parameter type (:mod:`legality_meta`).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import legality_meta  # noqa: F401  (registers `meta[...]`)
from . import types as T
from .builtins import builtin
from .emitter import Emitter
from .layout_library import blocked as _blocked
from .layout_library import wgmma_accumulator as _wgmma_accumulator
from .layouts import LayoutError, LinearLayout
from .tile_layouts import LANE, REG, WARP, default_blocked, dim_names, normalize, short_name
from .values import Arg, Const

SP_PIN_SHAPE = "SP0420"
"""A layout that does not describe the pinned tile (other logical dims, or elements nobody owns)."""
SP_PIN_WARPS = "SP0421"
"""A pinned layout over more lanes or warps than run the code."""
SP_PIN_CONFLICT = "SP0422"
"""A pinned layout meets an op that needs another one."""
SP_NOT_A_LAYOUT = "SP0423"
"""A layout argument that is not a layout."""


@dataclass(frozen=True)
class PinnedLayout:
    """The ``layout`` attribute of a pin (printed compactly in ``--emit ir``)."""

    layout: LinearLayout
    explicit: bool = False

    def short_name(self) -> str:
        return short_name(self.layout)


def _layout_arg(em: Emitter, arg: Arg) -> LinearLayout:
    v = em.unwrap(arg)
    if isinstance(v, Const) and isinstance(v.value, LinearLayout):
        return v.value
    from .emitter import describe

    em.error(SP_NOT_A_LAYOUT, f"expected a layout, found {describe(v)}", arg.span,
             help="build one with `layout.blocked(...)`, `layout.default(...)` or `layout.wgmma_accumulator(...)`")


def fit_to_tile(lay: LinearLayout, shape: tuple[int, ...]) -> LinearLayout | str:
    """``lay`` with its logical dims renamed ``dim0, dim1, ...`` and input dims ``reg, lane,
    warp`` (at most 32 lanes), or why it cannot describe a tile of ``shape``."""
    outs = lay.out_dims
    if len(outs) != len(shape) or any(s != t for (_, s), t in zip(outs, shape, strict=False)):
        have = "x".join(str(s) for _, s in outs) or "nothing"
        return f"the layout describes a {have} tile, the value is {'x'.join(map(str, shape))}"
    extra = [n for n in lay.in_names if n not in (REG, LANE, WARP)]
    if extra:
        return f"a register layout maps `reg`, `lane` and `warp`; this one also has {', '.join(extra)}"
    lay = lay.rename_outs({name: new for (name, _), new in zip(outs, dim_names(len(shape)), strict=True)})
    if not lay.is_surjective():
        return "the layout leaves some elements of the tile without an owner"
    return lay


def check_pin_warps(lay: LinearLayout, num_warps: int) -> LinearLayout | str:
    """``lay`` normalized to ``reg, lane(32), warp(num_warps)``, or why it uses more threads."""
    for name, size in ((LANE, 32), (WARP, num_warps)):
        if name in lay.in_names and lay.in_size(name) > size:
            return f"the layout spreads the tile over {lay.in_size(name)} {name}s, only {size} run this code"
    return normalize(lay, num_warps)


def _pin(em: Emitter, x: Arg, lay: Arg, explicit: bool) -> object:
    v = em.value(x)
    if not isinstance(v.type, T.TileType):
        em.error(SP_PIN_SHAPE, f"only tiles have layouts, found a value of type {v.type}", x.span)
    layout = _layout_arg(em, lay)
    fitted = fit_to_tile(layout, v.type.shape)
    if isinstance(fitted, str):
        em.error(SP_PIN_SHAPE, f"cannot pin this layout: {fitted}", lay.span,
                 help=f"build the layout for shape {v.type.shape}")
    return em.op1("convert_layout", [v], v.type, layout=PinnedLayout(fitted, explicit), pinned=True)


@builtin("pin")
def pin(em: Emitter, x: Arg, layout: Arg) -> object:
    """``x`` with its layout fixed to ``layout`` from here on: ops that need another layout report
    a diagnostic (SP0422) instead of converting silently."""
    return _pin(em, x, layout, explicit=False)


@builtin("convert_layout")
def convert_layout(em: Emitter, x: Arg, layout: Arg) -> object:
    """``x`` redistributed over the threads as ``layout`` (an explicit, pinned conversion)."""
    return _pin(em, x, layout, explicit=True)


def _ints(em: Emitter, arg: Arg, what: str) -> tuple[int, ...]:
    return em.int_tuple(arg, what)


def _layout_const(em: Emitter, build: object, span: object) -> Const:
    try:
        return Const(build())  # type: ignore[operator]
    except LayoutError as e:
        em.error(e.code, e.message, span, help=e.help)  # type: ignore[arg-type]
    except ValueError as e:
        em.error(SP_NOT_A_LAYOUT, str(e), span)  # type: ignore[arg-type]


@builtin("blocked", ns="layout")
def layout_blocked(em: Emitter, shape: Arg, size_per_thread: Arg, threads_per_warp: Arg, warps_per_cta: Arg,
                   order: Arg | None = None) -> Const:
    """Triton's blocked layout: each thread holds a ``size_per_thread`` block, ``threads_per_warp``
    (product 32) and ``warps_per_cta`` tile the blocks, ``order[0]`` the fastest dim (default:
    the last dim fastest)."""
    dims = _ints(em, shape, "the shape")
    spt, tpw, wpc = (_ints(em, a, w) for a, w in ((size_per_thread, "size_per_thread"),
                                                   (threads_per_warp, "threads_per_warp"),
                                                   (warps_per_cta, "warps_per_cta")))
    ordr = tuple(reversed(range(len(dims)))) if order is None else _ints(em, order, "the order")
    warps = 1
    for w in wpc:
        warps *= w

    def build() -> LinearLayout:
        return normalize(_blocked(dims, spt, tpw, wpc, ordr), max(1, warps))

    return _layout_const(em, build, em.span)


@builtin("default", ns="layout")
def layout_default(em: Emitter, shape: Arg, num_warps: Arg) -> Const:
    """The layout inference gives a tile nobody constrains: coalesced along the last dim."""
    dims = _ints(em, shape, "the shape")
    w = em.constexpr(num_warps, "the number of warps")
    return _layout_const(em, lambda: default_blocked(dims, w), em.span)


def wgmma_accumulator_layout(m: int, n: int, num_warps: int) -> LinearLayout:
    """The ``m x n`` wgmma accumulator over ``num_warps`` warps: each warpgroup owns m64 row
    blocks (hardware-facts §4.2; the layout ``backend/lower_hopper.acc_layout`` anchors)."""
    if num_warps % 4:
        raise LayoutError("SP0401", f"wgmma accumulators live on whole warpgroups, not {num_warps} warps")
    g = num_warps // 4
    if m % (64 * g) or (m // (64 * g)) & (m // (64 * g) - 1):
        raise LayoutError("SP0401", f"M = {m} is not 64 x {g} warpgroups x a power of two")
    base = _wgmma_accumulator(n, warpgroups=g).rename_outs({"m": "dim0", "n": "dim1"})
    r = m // (64 * g)
    if r > 1:
        base = base * LinearLayout.identity(REG, r, "dim0")
    return normalize(base, num_warps)


@builtin("wgmma_accumulator", ns="layout")
def layout_wgmma_accumulator(em: Emitter, m: Arg, n: Arg, num_warps: Arg) -> Const:
    """The wgmma accumulator layout of an ``m x n`` tile on ``num_warps`` warps (hardware-facts
    §4.2)."""
    mm, nn, w = (em.constexpr(a, what) for a, what in ((m, "M"), (n, "N"), (num_warps, "the number of warps")))
    return _layout_const(em, lambda: wgmma_accumulator_layout(mm, nn, w), em.span)
