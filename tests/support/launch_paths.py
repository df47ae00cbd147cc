"""One generated program (tests/support/program_gen.py) launched through each CPU launch path that
converts arguments its own way: ``kernel.interpret`` with positional arguments (the baseline), with
keyword arguments, with numpy scalars of the parameters' types, and ``sparsile.jax.call`` through the
CPU FFI handler and through ``interpret=True`` (``jax.pure_callback``). Every array the kernel writes
starts as ``sparsile.jax.call`` leaves its outputs (NaN, or 0xA5 bytes), so that every path starts
from the same values; float inputs and float scalars get subnormals, which a path running in a
flush-to-zero environment loses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .program_check import kernel_of, ordered
from .program_gen import NP, Program

SUBNORMAL = {"f16": 2.0**-24, "bf16": 2.0**-133, "f32": 2.0**-149, "f64": 2.0**-1074}
"""The smallest positive subnormal of each float type."""


def written(program: Program) -> list[str]:
    """The arrays the kernel writes: outputs, the histogram, the atomics' buffers."""
    return list(program.outputs) + (["HIST"] if program.hist_dtype else []) + list(program.atomic_bufs)


def undefined(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` filled as ``sparsile.jax.call`` fills an output it allocates."""
    a = np.array(a, copy=True)
    if a.dtype.kind == "f" or a.dtype.name.startswith(("bfloat", "float8")):
        a[...] = np.nan
    elif a.size:
        a.view(np.uint8)[...] = 0xA5
    return a


def arguments(program: Program, seed: int) -> dict[str, Any]:
    """The program's arguments of ``seed``, with written arrays as :func:`undefined` and subnormals
    (of both signs) among float inputs and as float scalars."""
    args = program.inputs(seed)
    rng = np.random.default_rng(seed + 1)
    for i, t in enumerate(program.inputs_dt):
        if t in SUBNORMAL:
            x = np.array(args[f"X{i}"], copy=True)
            pick = rng.random(x.size) < 0.15
            tiny = np.asarray(SUBNORMAL[t] * rng.integers(-3, 4, x.size), np.float64).astype(NP[t])
            x[pick] = tiny[pick]
            args[f"X{i}"] = x
    for n, t in program.scalars.items():
        if t in SUBNORMAL and rng.random() < 0.5:
            args[n] = float(SUBNORMAL[t] * rng.choice([-3, -1, 1, 2]))
    for n in written(program):
        args[n] = undefined(args[n])
    return args


def _copy(args: dict[str, Any]) -> dict[str, Any]:
    return {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in args.items()}


def interpret_positional(program: Program, args: dict[str, Any]) -> dict[str, np.ndarray]:
    """``kernel.interpret[grid](*args)`` (the baseline)."""
    kernel, a = kernel_of(program), _copy(args)
    kernel.interpret[program.grid](*ordered(kernel, a))
    return {n: a[n] for n in written(program)}


def interpret_keywords(program: Program, args: dict[str, Any]) -> dict[str, np.ndarray]:
    """``kernel.interpret[grid](**args)``."""
    kernel, a = kernel_of(program), _copy(args)
    kernel.interpret[program.grid](**a)
    return {n: a[n] for n in written(program)}


def interpret_numpy_scalars(program: Program, args: dict[str, Any]) -> dict[str, np.ndarray]:
    """``kernel.interpret[grid](...)`` with each scalar a numpy scalar of its parameter's type."""
    kernel, a = kernel_of(program), _copy(args)
    for n, t in program.scalars.items():
        a[n] = NP[t](a[n])
    kernel.interpret[program.grid](*ordered(kernel, a))
    return {n: a[n] for n in written(program)}


def jax_call(interpret: bool) -> Callable[[Program, dict[str, Any]], dict[str, np.ndarray]]:
    """``sparsile.jax.call`` with every written array an output (JAX allocates it), everything else
    by keyword; ``interpret``: through ``jax.pure_callback`` instead of the CPU FFI handler. Needs
    ``jax_enable_x64`` for 64-bit arrays."""
    import jax

    import sparsile.jax as spj

    def launch(program: Program, args: dict[str, Any]) -> dict[str, np.ndarray]:
        outs = {n: jax.ShapeDtypeStruct(args[n].shape, args[n].dtype) for n in written(program)}
        rest = {k: v for k, v in args.items() if k not in outs}
        got = spj.call(kernel_of(program), program.grid, out_shapes=outs, interpret=interpret, **rest)
        return {n: np.asarray(got[n]) for n in outs}

    return launch


def differences(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> list[str]:
    """Outputs that differ in any bit (any NaN matches any NaN), up to four elements each."""
    out = []
    for name, w in want.items():
        g, w = np.asarray(got[name]).reshape(-1), np.asarray(w).reshape(-1)
        if g.dtype != w.dtype:
            out.append(f"{name}: dtype {g.dtype}, want {w.dtype}")
            continue
        same = g.view(f"u{g.dtype.itemsize}") == w.view(f"u{w.dtype.itemsize}") if g.dtype.kind != "b" else g == w
        if g.dtype.kind not in "iub":
            with np.errstate(invalid="ignore"):
                same |= np.isnan(g.astype(np.float64)) & np.isnan(w.astype(np.float64))
        bad = np.flatnonzero(~same)[:4]
        if bad.size:
            out.append(f"{name} ({g.dtype}): differs at {bad.tolist()}: got {g[bad].tolist()}, want {w[bad].tolist()}")
    return out
