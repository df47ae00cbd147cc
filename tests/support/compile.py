"""Compiling test kernels: a signature from a kernel's annotations, a kernel from source text, and
a shipped stdlib kernel (cached, since many tests read the same build)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import sparsile as sp
from sparsile.frontend.sema.core import ArgSpec

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "stdlib" / "kernels"


def signature(kern: Any, *, aligned: bool = False, **consts: Any) -> dict[str, Any]:
    """The run-time parameters of ``kern`` at their annotations (as ``ArgSpec(type, divisible_16=True)``
    when ``aligned``: every pointer 16-byte aligned, as the launch path would record it), constexpr
    parameters left to their defaults, then ``consts`` (name -> constexpr value) added."""
    sig: dict[str, Any] = {p.name: ArgSpec(p.annotation, True) if aligned else p.annotation
                           for p in kern.params if p.annotation is not sp.constexpr}
    sig.update(consts)
    return sig


def compile_src(src: str, target: str = "sm_90a", stop_after: str = "ptx", *, name: str = "k",
                aligned: bool = False, cache: bool = True, **consts: Any) -> Any:
    """Compile kernel ``name`` of the source text ``src`` (file name ``case.spk`` in diagnostics) for
    ``target`` up to ``stop_after``, with the signature of :func:`signature`. ``cache=False``: not
    through the compile cache (a test that switches a check off must neither store nor find an
    entry, whose key does not say so)."""
    kern = sp.loads(src, "case.spk").kernels[name]
    return kern.compile(signature(kern, aligned=aligned, **consts), target=target, stop_after=stop_after,
                        cache=cache)


@functools.cache
def stdlib_module(spk: str) -> Any:
    """The module of the shipped kernel file ``stdlib/kernels/<spk>``, loaded once per test run."""
    return sp.load(KERNELS / spk)


@functools.cache
def compile_stdlib(spk: str, kernel: str, target: str, *, stop_after: str = "cubin", **consts: Any) -> Any:
    """Kernel ``kernel`` of ``stdlib/kernels/<spk>`` compiled for ``target`` (to a cubin, or up to
    ``stop_after``) with aligned pointers and ``consts``; cached, since several tests check the
    same build."""
    kern = getattr(stdlib_module(spk), kernel)
    if stop_after == "cubin":
        return kern.compile(signature(kern, aligned=True, **consts), target=target)
    return kern.compile(signature(kern, aligned=True, **consts), target=target, stop_after=stop_after)
