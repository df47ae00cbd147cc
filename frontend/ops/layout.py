"""Layouts in the language: ``pin``, ``convert_layout`` and the ``layout`` namespace.

Layout inference gives every tile a layout by itself (``layout_inference.py``); these builtins are
for the cases where the user wants to say which:

* ``pin(x, lay)`` — ``x`` has layout ``lay`` at this point (the compiler converts into it if it
  must, and never converts the pinned value away silently: an op that *needs* another layout —
  the wgmma accumulator, a store that cannot take it — is a diagnostic ``SP0422`` with a ``help``
  line, not a hidden conversion (docs/diagnostics.md, "The legality pass": diagnose only when the user
  pinned an incompatible layout).
* ``convert_layout(x, lay)`` — the same tile redistributed into ``lay``: an explicit conversion,
  whose result is pinned.
* ``layout.blocked(...)``, ``layout.default(...)``, ``layout.wgmma_accumulator(...)`` — named
  layouts as compile-time constants (``@jit`` kernels may also pass any
  :class:`~sparsile.frontend.layout.layouts.LinearLayout` from Python).

Both builtins create a ``convert_layout`` op carrying the layout (attribute ``layout``) and
``pinned=True``; the legality pass makes the pinned layout the value's layout after inference
(:func:`~sparsile.frontend.legality.layout.resolve_pins`). The interpreter ignores layouts.

Importing this module also registers the ``meta[T]`` parameter type (:mod:`legality_meta`). The
pin checks and codes live in :mod:`legality_layout`, so that the legality pass needs no builtins.
"""

from __future__ import annotations

from ..ir import types as T
from ..layout.gf2 import LayoutError
from ..layout.layouts import LinearLayout
from ..layout.library import blocked as _blocked
from ..layout.library import wgmma_accumulator as _wgmma_accumulator
from ..layout.tile import REG, default_blocked, normalize
from ..legality.layout import SP_NOT_A_LAYOUT, SP_PIN_SHAPE, PinnedLayout, fit_to_tile
from ..legality.meta import MetaCtor
from ..sema.builtins import NAMESPACES, ROOT, builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const

ROOT.members["meta"] = Const(MetaCtor("meta"))

def _layout_arg(em: Emitter, arg: Arg) -> LinearLayout:
    v = em.unwrap(arg)
    if isinstance(v, Const) and isinstance(v.value, LinearLayout):
        return v.value
    from ..sema.emitter import describe

    em.error(SP_NOT_A_LAYOUT, f"expected a layout, found {describe(v)}", arg.span,
             help="build one with `layout.blocked(...)`, `layout.default(...)` or `layout.wgmma_accumulator(...)`")


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
    blocks (docs/hardware.md §4.2; the layout ``backend/lower_hopper.acc_layout`` anchors)."""
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
    """The wgmma accumulator layout of an ``m x n`` tile on ``num_warps`` warps (docs/hardware.md
    §4.2)."""
    mm, nn, w = (em.constexpr(a, what) for a, what in ((m, "M"), (n, "N"), (num_warps, "the number of warps")))
    return _layout_const(em, lambda: wgmma_accumulator_layout(mm, nn, w), em.span)


_REGISTERED = {"pin": pin, "convert_layout": convert_layout, "layout": NAMESPACES["layout"],
               "meta": ROOT.members["meta"]}


def install() -> None:
    """Put this module's names back into the language's root namespace if something removed them
    (tests that restore the registry); importing the module installs them the first time."""
    for name, member in _REGISTERED.items():
        ROOT.members.setdefault(name, member)
    NAMESPACES.setdefault("layout", _REGISTERED["layout"])
