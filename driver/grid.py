"""Launch grids: the ``kernel[grid]`` indexer, the error of a kernel called without its grid
(SP0710), what a grid function is given, and a grid's normal form (three dimensions, within CUDA's
limits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..frontend.diagnostics import LaunchError
from ..frontend.sema.specialize import call_grid
from ..frontend.sema.values import constant_binding_value, is_constant_binding
from .kernel_options import is_int


class GridMissing(LaunchError, RuntimeError):
    """SP0710: a kernel called without its grid (``k(...)``, ``k.interpret(...)``); a RuntimeError
    too, as ``k(...)`` raised before it had a code."""


GRID_HELP = ("index the kernel with its grid first: the number of programs along x (y, z), e.g. "
             "(sp.cdiv(n, BLOCK),) (docs/language.md, \"Specialization and launching\")")


def no_grid(name: str) -> GridMissing:
    """The error of kernel ``name`` called without a grid."""
    return GridMissing("SP0710", f"kernel `{name}` must be launched with a grid: `{name}[grid](...)`, or run on "
                                 f"the CPU with `{name}.interpret[grid](...)`", help=GRID_HELP)


class GridIndexer:
    """``launcher[grid]``: the launch of ``make(grid)``; ``name`` is the launcher as the user spells
    it (``k.interpret``), for the error of a call without the grid."""

    def __init__(self, make: Callable[[Any], Any], name: str = "kernel.interpret"):
        self._make = make
        self._name = name

    def __getitem__(self, grid: Any) -> Any:
        return self._make(grid)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise GridMissing("SP0710", f"`{self._name}` runs the kernel for a grid: `{self._name}[grid](...)`",
                          help=GRID_HELP)


GRID_LIMITS = (2**31 - 1, 65535, 65535)
"""The most CTAs along x, y, z of one launch on every CUDA GPU sparsile targets (compute capability
3.0 and later; CUDA C++ Programming Guide, "Technical Specifications per Compute Capability")."""


def constexpr_values(bindings: dict[str, Any]) -> dict[str, Any]:
    """The values of a call's constexpr arguments, by name."""
    return {k: constant_binding_value(v) for k, v in bindings.items() if is_constant_binding(v)}


def grid_meta(bound: dict[str, Any], bindings: dict[str, Any]) -> dict[str, Any]:
    """What a grid function is given, on every launch path: every argument of the call by name,
    constexprs as their values (docs/language.md, "Specialization and launching")."""
    return {**bound, **constexpr_values(bindings)}


def normalize_grid(grid: Any, meta: dict[str, Any], kernel_name: str = "kernel") -> tuple[int, int, int]:
    """A grid given as an int, a tuple or list of up to 3 ints, or a callable of ``meta`` (the
    call's arguments: :func:`grid_meta`) returning one (LaunchError SP0710 otherwise, and for a
    grid function looking up a name ``meta`` lacks: ``specialize.call_grid``). A dimension may be 0:
    such a grid has no programs, and its launch runs nothing once the arguments are checked
    (docs/language.md, "Specialization and launching"); a negative one is SP0710."""
    if isinstance(grid, type):  # callable, yet no grid function (`np.int32` called with the arguments' dict)
        raise LaunchError("SP0710", f"the grid must be an int, a tuple of up to 3 ints or a function of the call's "
                          f"arguments, found the class {grid.__name__}")
    if callable(grid):
        grid = call_grid(grid, meta, kernel_name)
    if is_int(grid):
        grid = (grid,)
    if not isinstance(grid, tuple | list):
        raise LaunchError("SP0710", f"the grid must be an int or a tuple of up to 3 ints, found {grid!r}")
    if not 1 <= len(grid) <= 3:
        raise LaunchError("SP0710", f"the grid must have 1 to 3 dimensions, found {len(grid)}")
    bad = [g for g in grid if not is_int(g)]  # (a list: None is a dimension too, `(None,)`)
    if bad:
        raise LaunchError("SP0710", f"every grid dimension must be an integer, found {bad[0]!r} in {tuple(grid)!r}",
                          help="compute grid sizes with integer arithmetic, e.g. `(n + BLOCK - 1) // BLOCK`")
    dims = tuple(int(g) for g in grid)
    if any(d < 0 for d in dims):
        raise LaunchError("SP0710", f"a grid dimension cannot be negative, found {dims}",
                          help="compute grid sizes that are 0 or more, e.g. `sp.cdiv(n, BLOCK)` with n >= 0 "
                               "(a grid with a 0 dimension launches nothing)")
    for axis, (d, most) in enumerate(zip(dims, GRID_LIMITS, strict=False)):
        if d > most:
            raise LaunchError("SP0710", f"grid {dims} has {d} programs along {'xyz'[axis]}; CUDA allows at most "
                              f"{most}", help="use a persistent kernel or move work to another grid dimension")
    return ((*dims, 1, 1))[:3]  # type: ignore[return-value]
