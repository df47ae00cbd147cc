"""Host views of interpreter arguments (frontend/interp/host_arrays.py): which parameters a kernel writes,
and read-only arrays, refused where the kernel writes them (SP0719, as on the GPU) and left alone
where it only reads them."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import LaunchError
from sparsile.frontend.interp.host_arrays import stored_params

SOURCE = """
@kernel
def scale(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 16):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n) * 2.0, mask=offs < n)
"""


def kernel() -> sp.Kernel:
    return sp.loads(SOURCE, "case.spk").kernels["scale"]


def read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.setflags(write=False)
    return a


def test_stored_params_follow_pointer_arithmetic_to_the_store() -> None:
    k = kernel()
    func = k.ir(np.zeros(16, np.float32), np.zeros(16, np.float32), 16)
    assert stored_params(func) == {"out"}


ATOMIC_SOURCE = """
@kernel
def count(x: ptr[i32], bins: ptr[i32], tickets: ptr[i32], n: i32, BLOCK: constexpr = 16):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    atomic_add(bins + load(x + offs, mask=offs < n), 1, mask=offs < n)
    atomic_cas(tickets + 0, 0, 1)
"""


def test_an_array_only_atomics_update_is_stored() -> None:
    """The GPU launcher reads back host copies of the stored parameters only: an array updated by
    atomics alone was missed once, and a histogram of numpy arrays came back unchanged."""
    k = sp.loads(ATOMIC_SOURCE, "atomics.spk").kernels["count"]
    func = k.ir(np.zeros(16, np.int32), np.zeros(4, np.int32), np.zeros(1, np.int32), 16)
    assert stored_params(func) == {"bins", "tickets"}


def test_read_only_output_is_sp0719() -> None:
    # it used to fail inside the interpreter's store as an internal compiler error
    x = np.arange(16, dtype=np.float32)
    with pytest.raises(LaunchError) as info:
        kernel().interpret[(1,)](x, read_only(np.zeros(16, np.float32)), 16)
    assert info.value.code == "SP0719"
    assert str(info.value).splitlines() == [
        "error[SP0719]: argument `out` is a read-only array, but the kernel writes through it",
        " = help: pass a writable copy (e.g. `x.copy()`)"]


def test_read_only_inputs_are_fine_even_when_strided() -> None:
    rng = np.random.default_rng(3)
    data = rng.standard_normal(32).astype(np.float32)
    strided = read_only(data)[::2]  # copied for the interpreter; nothing may be written back to it
    out = np.zeros(16, np.float32)
    kernel().interpret[(1,)](strided, out, 16)
    np.testing.assert_array_equal(out, data[::2] * 2)
