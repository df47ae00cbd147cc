"""kernel[grid]'s fast launches (driver/fast_launch.py) fingerprint a call by which parameters are
constexprs and which are annotated integers. A ``@jit`` kernel whose annotations read a Python
global gets new parameters when that global changes: the fingerprints must follow, or one
specialization of a new constexpr is launched for every value of it. Fake device of
tests/backend/test_prepared.py (compiles for sm_90a, records launches)."""

from __future__ import annotations

import sys

import pytest

import sparsile as sp
from sparsile.driver import fast_launch
from sparsile.frontend.diagnostics import LaunchError

pytest.importorskip("torch")

from sparsile.tests.backend.test_prepared import arrays, gpu  # noqa: F401  (gpu: a fixture)

N_TYPE = sp.i32
THIS = sys.modules[__name__]


@sp.jit
def fill(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: N_TYPE, BLOCK: sp.constexpr = 256):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    sp.store(out + offs, sp.load(x + offs, mask=offs < n) + n, mask=offs < n)


def no_prepared(*args, **kwargs):
    """What a fast entry meets for host arrays: no prepared launch, the launcher's own path (which
    is given no constexpr to check: the fingerprint is the check)."""
    raise LaunchError("SP0733", "host arrays")


@pytest.mark.parametrize("prepared", [True, False])
def test_a_parameter_that_became_a_constexpr_is_fingerprinted_by_value(gpu, monkeypatch, prepared):  # noqa: F811
    if not prepared:
        monkeypatch.setattr(fast_launch, "PreparedLaunch", no_prepared)
    fill.__dict__.pop("_launchers", None)
    fill.__dict__.pop("_fast_launches", None)
    x, _, out = arrays()
    gpu.sizes = [8, 8, 4]  # x, out, n
    fill[(4,)](x, out, 1024)
    fill[(4,)](x, out, 2048)  # the fast entry: n is an annotated i32, fingerprinted by divisibility
    assert len(gpu.built) == 1
    monkeypatch.setattr(THIS, "N_TYPE", sp.constexpr)
    gpu.sizes = [8, 8]  # x, out: n is compiled in
    fill[(4,)](x, out, 16)
    fill[(4,)](x, out, 32)  # another constexpr value: another kernel, never the one for 16
    fill[(4,)](x, out, 16)
    assert [[c.value for c in spec.params if c.kind == "constexpr" and c.name == "n"] for spec in gpu.built] == \
        [[], [16], [32]]
    assert len(gpu.launches) == 5
