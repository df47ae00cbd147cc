"""The GPU a sparse kernel plan is for: the device its arrays live on.

``plan_sparse_matmul``, ``plan_sparse_linear`` and ``plan_sparse_decode`` plan for the device of
their arrays (x or b, else values: :func:`~.arrays.device_ordinal`), whose launches run there
(``kernel[grid]`` follows its arrays' device: driver/array_devices.py); with host arrays only, for
the current device. What planning reads of the GPU (its Blackwell target, its SM count, its
tuned tables) is read from that device through :func:`plan_gpu` (docs/torch.md, "Several GPUs").
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from .arrays import device_ordinal

PLAN_ORDINAL: contextvars.ContextVar[int | None] = contextvars.ContextVar("sparsile_plan_ordinal", default=None)
"""The device of the plan being made (None: the current device)."""

F = TypeVar("F", bound=Callable[..., Any])


def plan_ordinal() -> int | None:
    """The device the plan being made is for (None: the current device)."""
    return PLAN_ORDINAL.get()


def plan_gpu() -> Any:
    """The ``DeviceInfo`` of the GPU the plan being made is for (read only: the thread's current
    context is left as it is)."""
    from ...backend import runtime

    return runtime.current_device(PLAN_ORDINAL.get())


def arrays_ordinal(*arrays: Any) -> int | None:
    """The CUDA device of the first of ``arrays`` that lives on one, else None."""
    for a in arrays:
        ordinal = device_ordinal(a)
        if ordinal is not None:
            return ordinal
    return None


def plans_on_arrays(fn: F) -> F:
    """Decorate a planner ``fn(values, meta, x_or_b, ...)``: it plans for the device of x or b, else
    of values, else of any other array argument (``out``, ``bias``, a scale: where the launch,
    which follows its arrays, runs when the operands are host arrays) (:data:`PLAN_ORDINAL` set while
    it runs)."""

    @functools.wraps(fn)
    def planner(*args: Any, **kwargs: Any) -> Any:
        x = args[2] if len(args) > 2 else kwargs.get("x", kwargs.get("b"))
        values = args[0] if args else kwargs.get("values")
        token = PLAN_ORDINAL.set(arrays_ordinal(x, values, *args, *kwargs.values()))
        try:
            return fn(*args, **kwargs)
        finally:
            PLAN_ORDINAL.reset(token)

    return planner  # type: ignore[return-value]
