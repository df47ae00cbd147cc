"""Running code built for an older GPU architecture on the GPU at hand (GPU tests only).

A cubin runs only on its own major architecture (an sm_80 cubin does not load on an sm_90 GPU),
but the driver JIT-compiles PTX of an older target for the GPU at hand: the lowering of sm_80 (no
wgmma, its own bf16 conversion sequences) can be checked on a Hopper by launching its PTX."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def ptx_when_foreign_arch(target: str) -> Iterator[None]:
    """Launch the PTX instead of the cubin when the GPU's major architecture differs from
    ``target``'s (the driver JIT-compiles PTX of an older target for the GPU at hand)."""
    from sparsile.backend import runtime
    from sparsile.driver import compiler
    from sparsile.target.targets import get_target

    if get_target(target).major == runtime.current_device().compute_capability[0]:
        yield
        return
    real = compiler.compile_cached

    def as_ptx(*args, **kwargs):
        ck = real(*args, **kwargs)
        return dataclasses.replace(ck, cubin=ck.ptx.encode())

    compiler.compile_cached = as_ptx
    try:
        yield
    finally:
        compiler.compile_cached = real


@pytest.fixture
def blackwell() -> Any:
    """The current device where it is a Blackwell GPU (sm_100 / 103 / 110); the test is skipped
    on any other (tcgen05 code runs nowhere else, not even through its PTX)."""
    from sparsile.backend import runtime

    major = runtime.current_device().compute_capability[0]
    if major not in (10, 11):
        pytest.skip(f"needs a Blackwell GPU (sm_100/103/110), this one is sm_{major}x")
    return runtime.current_device()
