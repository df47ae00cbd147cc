"""The ``sparsile_call`` JAX primitive that ``sparsile.jax.call`` binds: its abstract evaluation, its
eager implementation, its lowerings (the ``sparsile_call`` FFI custom call on CUDA and on the CPU;
``jax.pure_callback`` to the interpreter with ``interpret=True``) and the rules refusing
differentiation (SP0934) and ``jax.vmap`` (SP0935). A lowering finds its :class:`~.plan.CallPlan`
by number in the FFI's registry (:mod:`.ffi`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import ffi
from .errors import SP_JAX_NO_AUTODIFF, SP_JAX_NO_VMAP, JaxCallError

sparsile_call_p = Primitive("sparsile_call")
sparsile_call_p.multiple_results = True


def _abstract_eval(*avals: Any, plan: int, out_avals: tuple[Any, ...], interpret: bool,
                   aliases: tuple[tuple[int, int], ...]) -> list[Any]:
    return list(out_avals)


sparsile_call_p.def_abstract_eval(_abstract_eval)


_eager: dict[tuple, Callable[..., Any]] = {}


def _impl(*args: Any, **params: Any) -> Any:
    """A call outside ``jax.jit``: the primitive alone, compiled once per plan. Compiled under
    ``jax.disable_jit()`` too (the primitive has no other implementation: the jitted function,
    called as plain Python there, bound the primitive again, a RecursionError). With
    ``jax_debug_nans`` / ``jax_debug_infs`` the outputs are checked here, as jax checks an eager
    primitive's, so that a NaN names ``sparsile_call``: the jitted function's own check re-ran it
    "de-optimized", which is this function again, without end."""
    key = tuple(sorted(params.items()))
    fn = _eager.get(key)
    if fn is None:
        fn = _eager[key] = jax.jit(lambda *a: sparsile_call_p.bind(*a, **params))
    with contextlib.ExitStack() as scope:
        scope.enter_context(jax.disable_jit(False))
        for switch in (getattr(jax, "debug_nans", None), getattr(jax, "debug_infs", None)):
            if switch is not None:
                scope.enter_context(switch(False))
        outs = fn(*args)
    check_special(outs)
    return outs


def check_special(outs: Any, name: str = sparsile_call_p.name) -> None:
    """With ``jax_debug_nans`` (``jax_debug_infs``) on, FloatingPointError for a NaN (an infinity)
    in a floating-point output among ``outs`` (concrete arrays), worded as jax words it for its own
    primitives, naming ``name``."""
    nans, infs = bool(jax.config.jax_debug_nans), bool(jax.config.jax_debug_infs)
    if not (nans or infs):
        return
    for out in outs:
        if not jax.numpy.issubdtype(out.dtype, jax.numpy.inexact):
            continue
        host = np.asarray(out)
        for on, test, what in ((nans, np.isnan, "nan"), (infs, np.isinf, "inf")):
            if on and test(host).any():
                raise FloatingPointError(f"invalid value ({what}) encountered in {name}")


sparsile_call_p.def_impl(_impl)


def _ffi_rule(platform: str) -> Callable[..., Any]:
    def rule(ctx: Any, *operands: Any, plan: int, out_avals: tuple[Any, ...], interpret: bool,
             aliases: tuple[tuple[int, int], ...]) -> Any:
        if interpret:
            return _callback_rule(ctx, *operands, plan=plan, out_avals=out_avals, aliases=aliases)
        ffi.register(platform)
        if platform == "cuda":  # compile and load now, where XLA will run it: the first execution only launches
            for ordinal in _lowered_ordinals(ctx):
                _PLANS[plan].launcher(ordinal)
        lowering = ffi.jax_ffi().ffi_lowering(ffi.TARGET, operand_output_aliases=dict(aliases) or None)
        return lowering(ctx, *operands, **{ffi.PLAN_ATTRIBUTE: np.int64(plan)})

    return rule


def _lowered_ordinals(ctx: Any) -> list[int]:
    """The CUDA ordinals of this process's devices that XLA lowers the computation for (its device
    assignment, each once), or sparsile's current device where XLA does not say: a launcher is
    loaded on each, and on no other GPU (a jit on cuda:1 loads nothing on cuda:0)."""
    assignment = getattr(getattr(ctx.module_context, "axis_context", None), "device_assignment", None)
    if assignment:
        here = jax.process_index()
        ordinals = [getattr(d, "local_hardware_id", None) for d in assignment
                    if getattr(d, "process_index", here) == here]
        if ordinals and all(isinstance(o, int) for o in ordinals):
            return list(dict.fromkeys(ordinals))
    from ...backend import runtime

    return [runtime.current_device().ordinal]


def _callback_rule(ctx: Any, *operands: Any, plan: int, out_avals: tuple[Any, ...],
                   aliases: tuple[tuple[int, int], ...]) -> Any:
    the_plan = _PLANS[plan]
    alias_of = {o: i for i, o in aliases}

    def host(*arrays: Any) -> tuple[np.ndarray, ...]:
        ins = [np.asarray(a) for a in arrays]
        outs = [np.array(ins[alias_of[k]]) if k in alias_of else np.empty(a.shape, a.dtype)
                for k, a in enumerate(out_avals)]
        for o, i in alias_of.items():  # XLA gives an aliased pair one buffer: so does the interpreter
            ins[i] = outs[o]
        the_plan.interpret(ins, outs)
        return tuple(outs)

    def body(*args: Any) -> Any:
        shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals]
        return jax.pure_callback(host, shapes, *args)

    return mlir.lower_fun(body, multiple_results=True)(ctx, *operands)


mlir.register_lowering(sparsile_call_p, _ffi_rule("cpu"), platform="cpu")
mlir.register_lowering(sparsile_call_p, _ffi_rule("cuda"), platform="cuda")


def _no_autodiff(primals: Any, tangents: Any, **params: Any) -> Any:
    raise JaxCallError(SP_JAX_NO_AUTODIFF, "a sparsile kernel call cannot be differentiated",
                       help="wrap the call's array inputs in jax.lax.stop_gradient (a stop_gradient of its result "
                            "comes too late: jax differentiates the call itself first), or write the backward "
                            "pass as another kernel inside a jax.custom_vjp")


def _no_vmap(args: Any, dims: Any, **params: Any) -> Any:
    raise JaxCallError(SP_JAX_NO_VMAP, "jax.vmap cannot batch a sparsile kernel call",
                       help="fold the batch into the kernel's grid and arrays (reshape, then one call), or loop "
                            "with jax.lax.map; sparsile.jax.sparse_linear batches by itself")


ad.primitive_jvps[sparsile_call_p] = _no_autodiff
batching.primitive_batchers[sparsile_call_p] = _no_vmap

_PLANS = ffi._plans
