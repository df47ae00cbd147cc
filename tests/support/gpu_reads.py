"""Running a GPU plan's launches in the CPU interpreter as the GPU would read their arguments.

A GPU kernel reads an array by address; a torch "neg view" (``torch._neg_view(t)``, ``z.conj().imag``)
holds in memory the values *before* its lazy negation, so a launch handed one computes with the
wrong sign. The interpreter resolves neg views (frontend/interp/host_arrays.py), which would hide
that; these helpers hand it instead what the view's memory holds (:func:`memory_of`), so that a plan
made on CPU tensors under ``host_tensors_as_device`` (as for CUDA tensors) and run here gives the
GPU's answer, wrong sign included.
"""

from __future__ import annotations

from typing import Any


def memory_of(a: Any) -> Any:
    """``a``, or for a torch tensor with its negative bit set a view of its memory as it is (what a
    kernel reading it by address sees)."""
    if type(a).__module__.split(".")[0] == "torch" and a.is_neg():
        import torch

        return torch._neg_view(a)  # (negating the view again: the memory's own values, no negative bit)
    return a


def run_launches(launches: list[tuple[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]]) -> None:
    """Run a plan's ``launches()`` in the interpreter, each argument read as :func:`memory_of` does
    (``pdl``, a launch option, is dropped)."""
    for kernel, grid, args, constexprs in launches:
        options = {k: v for k, v in constexprs.items() if k != "pdl"}
        kernel.interpret[grid](*(memory_of(a) for a in args), **options)


class GpuReadsKernel:
    """A kernel whose GPU launches (``kernel[grid](...)``) run in the interpreter with arguments read
    as :func:`memory_of` does; ``interpret`` is the kernel's own."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.interpret = kernel.interpret

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **options: Any) -> Any:
            options.pop("stream", None)
            options.pop("pdl", None)
            return self.kernel.interpret[grid](*(memory_of(a) for a in args), **options)

        return launch


class GpuReadsModule:
    """A loaded kernel module whose kernels are :class:`GpuReadsKernel`."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __getattr__(self, name: str) -> Any:
        return GpuReadsKernel(getattr(self.module, name))
