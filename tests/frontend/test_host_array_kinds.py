"""Unusual numpy arrays given to ``kernel.interpret[grid](...)`` (frontend/interp/host_arrays.py) and
to a launch's argument checks (frontend/sema/specialize.py ``arg_spec``): random inputs, poisoned
outputs, float64 references.

* ``np.matrix`` arguments failed inside the interpreter (an internal compiler error: its flat view
  stayed 2-D); a subclass is now read and written through a plain view of its memory.
* A masked array with masked elements was read and written as if unmasked; it is refused at the
  launch now (SP0708), on the GPU path's checks too; one without masked elements is its data.
* A written array whose own elements share memory (a writable zero stride, overlapping
  ``as_strided`` rows) ran on a copy whose write-back kept one value per address: SP0750 now.
* Byte-swapped arrays (``'>f4'``) in and out are converted both ways (this worked before: kept here
  with the other kinds).
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import LaunchError

SOURCE = """
@kernel
def axpy(x: ptr[f32], y: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 64):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    store(out + offs, 3.0 * load(x + offs, mask=mask) + load(y + offs, mask=mask), mask=mask)
"""
N = 150
GRID = ((N + 63) // 64,)


def kernel() -> sp.Kernel:
    return sp.loads(SOURCE, "kinds.spk").kernels["axpy"]


def operands(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, N).astype(np.float32)
    y = rng.uniform(-2, 2, N).astype(np.float32)
    return x, y, 3.0 * x.astype(np.float64) + y.astype(np.float64)


def assert_close(got: np.ndarray, ref: np.ndarray) -> None:
    got64 = np.asarray(got, dtype=np.float64).reshape(-1)
    assert not np.isnan(got64).any(), "unwritten outputs"
    assert np.allclose(got64, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_matrix_arguments_in_and_out() -> None:
    x, y, ref = operands(1)
    out = np.asmatrix(np.full(N, np.nan, np.float32))  # (1, N)
    kernel().interpret[GRID](np.asmatrix(x), y, out, N)
    assert_close(out, ref)


def test_memmap_out(tmp_path) -> None:
    x, y, ref = operands(2)
    out = np.memmap(tmp_path / "out.f32", dtype=np.float32, mode="w+", shape=(N,))
    out[:] = np.nan
    kernel().interpret[GRID](x, y, out, N)
    out.flush()
    assert_close(np.fromfile(tmp_path / "out.f32", np.float32), ref)


def test_byte_swapped_arguments_in_and_out() -> None:
    x, y, ref = operands(3)
    out = np.full(N, np.nan, ">f4")
    kernel().interpret[GRID](x.astype(">f4"), y, out, N)
    assert out.dtype == np.dtype(">f4")
    assert_close(out, ref)


def masked(a: np.ndarray, where: list[int]) -> np.ma.MaskedArray:
    mask = np.zeros(a.shape, bool)
    mask[where] = True
    return np.ma.array(a, mask=mask)


@pytest.mark.parametrize("position", ["x", "out"])
def test_masked_array_with_masked_elements_is_sp0708(position: str) -> None:
    x, y, _ = operands(4)
    out = np.full(N, np.nan, np.float32)
    args = [x, y, out]
    index = ["x", "y", "out"].index(position)
    args[index] = masked(args[index], [3, 17, 99])
    with pytest.raises(LaunchError) as info:
        kernel().interpret[GRID](*args, N)
    assert info.value.code == "SP0708"
    assert info.value.message == (f"argument `{position}` is a masked array with 3 masked elements; a kernel reads "
                                  "and writes the memory under the mask and ignores the mask")
    assert info.value.help == (f"pass `{position}.filled(value)` (e.g. 0) for the masked elements, or "
                               f"`{position}.data` to use the values under the mask")
    assert np.isnan(out).all()  # refused before anything ran
    with pytest.raises(LaunchError) as info:  # the GPU path's checks, up to the compile (no GPU needed)
        kernel()[GRID].compile_for("sm_90a", *args, N)
    assert info.value.code == "SP0708"


def test_masked_array_without_masked_elements_is_its_data() -> None:
    x, y, ref = operands(5)
    out = masked(np.full(N, np.nan, np.float32), [])
    kernel().interpret[GRID](masked(x, []), y, out, N)
    assert_close(out.data, ref)


@pytest.mark.parametrize("shape, strides", [((N,), (0,)), ((2, 75), (50 * 4, 4))])
def test_written_array_whose_elements_share_memory_is_sp0750(shape, strides) -> None:
    """A writable zero-stride (or row-overlapping ``as_strided``) out ran on a dense copy, and the
    copy back kept one of the values written to each shared address (the last), silently."""
    x, y, _ = operands(6)
    base = np.full(2 * N, np.nan, np.float32)
    out = np.lib.stride_tricks.as_strided(base, shape, strides)
    with pytest.raises(LaunchError) as info:
        kernel().interpret[GRID](x, y, out.reshape(-1) if out.ndim == 1 else out, N)
    assert info.value.code == "SP0750"
    assert info.value.message == (f"elements of argument `out` overlap in memory (shape {shape}, byte strides "
                                  f"{strides}), and the kernel writes through it; the interpreter runs on a copy, "
                                  "and copying it back would keep only one of the values written to each shared "
                                  "address")
    assert np.isnan(base).all()  # refused before anything ran
    x_zero = np.lib.stride_tricks.as_strided(x, (N,), (0,))  # read only: fine (every element is x[0])
    distinct = base[: 2 * N : 2]  # strided, elements distinct: written back
    kernel().interpret[GRID](x_zero, y, distinct, N)
    assert_close(distinct, 3.0 * np.float64(x[0]) + y.astype(np.float64))


def test_launcher_description_of_a_masked_array() -> None:
    """The GPU launcher's own description of an argument (what a prepared launch's later calls go
    through, without binding again): a masked array with masked elements is SP0708 there too (it
    was described by its data, the mask dropped); one without is its data."""
    from sparsile.backend.runtime.arrays import describe_array

    x, _, _ = operands(7)
    with pytest.raises(LaunchError) as info:
        describe_array(masked(x, [5]))
    assert info.value.code == "SP0708"
    assert info.value.message == ("a masked array with 1 masked elements: a kernel reads and writes the memory "
                                  "under the mask and ignores the mask")
    plain, unmasked = describe_array(x), describe_array(masked(x, []))
    assert (unmasked.ptr, unmasked.dtype, unmasked.shape) == (plain.ptr, plain.dtype, plain.shape)


CAST_SOURCE = """
@kernel
def scale(x: ptr[f32], out, n: i32, BLOCK: constexpr = 64):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    store(out + offs, (3.0 * load(x + offs, mask=mask)).to(out.dtype), mask=mask)
"""


@pytest.mark.parametrize("dtype, negated", [("bfloat16", False), ("float32", True), ("float16", True),
                                            ("float32", False)])
def test_written_torch_tensor_whose_elements_share_memory_is_sp0750(dtype: str, negated: bool) -> None:
    """A written torch CPU tensor with a zero stride (``expand``) that the interpreter converts
    (bfloat16, or a lazy negation ``_neg_view``) reached the kernel as a dense copy, so the check
    of the copy's strides passed: the kernel ran, then torch's ``copy_`` back into the tensor
    raised its own RuntimeError (an internal traceback, after the run). The tensor's own layout is
    checked now: SP0750 before anything runs, as for a float32 tensor read in place."""
    torch = pytest.importorskip("torch")
    x, _, _ = operands(8)
    out = torch.full((1,), float("nan"), dtype=getattr(torch, dtype)).expand(N)
    if negated:
        out = out._neg_view()
    k = sp.loads(CAST_SOURCE, "cast.spk").kernels["scale"]
    with pytest.raises(LaunchError) as info:
        k.interpret[GRID](x, out, N)
    assert info.value.code == "SP0750"
    assert info.value.message == (f"elements of argument `out` overlap in memory (shape ({N},), byte strides "
                                  "(0,)), and the kernel writes through it; the interpreter runs on a copy, and "
                                  "copying it back would keep only one of the values written to each shared "
                                  "address")
    assert torch.isnan(out).all()  # refused before anything ran
    distinct = torch.full((2 * N,), float("nan"), dtype=getattr(torch, dtype))[::2]  # strided, elements distinct
    if negated:
        distinct = distinct._neg_view()
    k.interpret[GRID](x, distinct, N)
    got = distinct.resolve_neg().float().numpy().astype(np.float64)
    assert not np.isnan(got).any()
    rtol = {"float32": 1e-6, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]  # (one rounding to out's type)
    np.testing.assert_allclose(got, 3.0 * x.astype(np.float64), rtol=rtol, atol=0)


def test_a_written_view_too_large_for_the_exact_check_may_overlap() -> None:
    """More than the exact check's 4194304 elements whose strides (8 and 12 bytes, float32) do not show
    them apart (they are distinct: even and odd multiples of 4 bytes): SP0750 says they *may* overlap
    and why it does not know, where it said they overlap."""
    from sparsile.frontend.interp.overlap import EXACT_OVERLAP_CHECK

    x, _, _ = operands(9)
    rows = EXACT_OVERLAP_CHECK // 2 + 1
    base = np.full(2 * rows + 4, np.nan, np.float32)
    out = np.lib.stride_tricks.as_strided(base, (rows, 2), (8, 12))
    k = sp.loads(CAST_SOURCE, "cast.spk").kernels["scale"]
    with pytest.raises(LaunchError) as info:
        k.interpret[GRID](x, out, N)
    assert info.value.code == "SP0750"
    assert info.value.message == (f"elements of argument `out` may overlap in memory (shape ({rows}, 2), byte "
                                  "strides (8, 12)), and the kernel writes through it: its strides do not show "
                                  "them apart, and it has more elements than the 4194304 the check compares one "
                                  "by one")
    assert np.isnan(base).all()  # refused before anything ran
