"""Kernel options (``num_warps=``, ``cluster=``, ``maxnreg=``, ...): their defaults, the checks of
their values (SP0242, SP0558; SP0236 for an unknown name) and the normal form of ``cluster=``."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

from ..frontend.diagnostics import CompileError, Diagnostic
from ..frontend.spans import UNKNOWN_SPAN

KERNEL_OPTIONS = {"num_warps": 4, "num_stages": 3, "target": None, "maxnreg": None, "num_ctas": 1,
                  "cluster": (1, 1, 1), "pdl": False}

SP_BAD_OPTION = "SP0242"
"""A kernel option whose value cannot work (``num_warps=0``, ``maxnreg="x"``): refused before the
compiler turns it into an LLVM attribute that LLVM cannot parse (it exits the process)."""
MAX_CLUSTER_CTAS = 8
"""The portable cluster size limit (docs/blackwell.md, SP0558): each dimension and the product."""
SP_CLUSTER_SHAPE = "SP0558"
MAXNREG_RANGE = (24, 255)
"""ptxas raises a ``.maxnreg`` below 24 to 24 and ignores one above 255 (checked with ptxas 13.0)."""


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (a NumPy one too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def cluster_problem(value: Any) -> tuple[str, str] | None:
    """(message, help) when ``value`` is no cluster shape: 1 to 3 positive ints of at most
    MAX_CLUSTER_CTAS CTAs in all (checked before sema, which computes masks from the shape)."""
    dims = (value,) if is_int(value) else value
    ok = isinstance(dims, tuple | list) and 1 <= len(dims) <= 3 and all(is_int(d) for d in dims)
    size = 1
    if ok:
        for d in dims:
            ok = ok and d >= 1
            size = size * d if ok else 0
    if ok and size <= MAX_CLUSTER_CTAS:
        return None
    return (f"a cluster is 1 to 3 positive ints of at most {MAX_CLUSTER_CTAS} CTAs in all, found cluster={value!r}",
            f"e.g. cluster=(2, 1, 1); {MAX_CLUSTER_CTAS} CTAs is the portable limit")


def option_problem(name: str, value: Any) -> tuple[str, str] | None:
    """(message, help) when kernel option ``name`` cannot take ``value``, else None (``cluster``:
    :func:`cluster_problem`, code SP0558); unknown names are SP0236."""
    if name == "num_warps" and not (is_int(value) and value >= 1):
        return (f"num_warps must be a positive integer, found {value!r}",
                "use the number of warps per CTA, e.g. num_warps=4 (one warpgroup)")
    if name == "cluster" and value is not None:
        return cluster_problem(value)
    if name == "num_stages" and not (is_int(value) and value >= 0):
        return f"num_stages must be a non-negative integer, found {value!r}", "e.g. num_stages=3"
    if name == "num_ctas" and not (is_int(value) and value >= 1):
        return (f"num_ctas must be a positive integer, found {value!r}",
                "leave it at 1; CTA clusters are asked for with cluster=(x, y, z)")
    low, high = MAXNREG_RANGE
    if name == "maxnreg" and value is not None and not (is_int(value) and low <= value <= high):
        return (f"maxnreg must be an integer from {low} to {high} registers per thread, found {value!r}",
                f"ptxas raises budgets below {low} to {low} and ignores budgets above {high}; "
                "leave maxnreg unset to let ptxas choose")
    if name == "pdl" and not isinstance(value, bool):
        return (f"pdl must be True or False, found {value!r}",
                "pdl=True launches the kernel as a programmatic dependent launch (sm_90+): it may start "
                "while the previous kernel in the stream runs and must call pdl.wait() before it reads "
                "that kernel's results (docs/language.md, \"Programmatic dependent launch\")")
    if name == "target" and value is not None and not isinstance(value, str):
        return (f"target must be a target name such as \"sm_90a\", found {value!r}",
                "pass the name as a string, or leave target unset")
    return None


def check_options(options: dict[str, Any], spans: Callable[[str], Any] | None = None) -> None:
    """Raise CompileError SP0242 for every kernel option in ``options`` whose value cannot work
    (SP0236 for a name that is no option); ``spans(name)`` gives the user's span of an option where
    there is one (a decorator)."""
    diags = []
    for name, value in options.items():
        span = (spans(name) if spans is not None else None) or UNKNOWN_SPAN
        if name not in KERNEL_OPTIONS:
            diags.append(Diagnostic("SP0236", f"unknown kernel option `{name}`", span,
                                    help=f"options: {', '.join(KERNEL_OPTIONS)}"))
            continue
        problem = option_problem(name, value)
        if problem is not None:
            code = SP_CLUSTER_SHAPE if name == "cluster" else SP_BAD_OPTION
            diags.append(Diagnostic(code, problem[0], span, help=problem[1]))
    if diags:
        raise CompileError(diags)


def cluster_option(value: Any) -> tuple[int, ...]:
    """The ``cluster=`` kernel option as a tuple of 3 ints (``2`` means ``(2, 1, 1)``); a value that
    is not 1 to 3 ints is kept as given for the legality pass to report (SP0552)."""
    if value is None:
        return (1, 1, 1)
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, tuple | list) and 1 <= len(value) <= 3 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple((*value, 1, 1)[:3])
    return tuple(value) if isinstance(value, tuple | list) else (value,)
