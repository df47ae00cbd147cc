"""A CPU torch bfloat16 (or float8) tensor and a numpy (ml_dtypes) view of the same memory passed
together to a kernel that writes one of them.

The GPU path views the tensor's memory (backend/runtime/arrays.py) and gives the two one device
copy (staging.shared_host_copy: the same bytes, shape and strides, one byte order), so the kernel
runs in place; the interpreter, the reference, read the tensor through a copy and refused the pair
as two views, one written through a copy (SP0750). The interpreter now uses the tensor in place
through an ml_dtypes view of its memory (host_arrays.torch_special_view), as it uses any CPU tensor:
the two are one view on both paths, and both compute out = x + y in place.

No GPU: the faked device of tests/backend/test_launch_byte_order.py, its "kernel" a bfloat16 (or
e4m3) vector add on its memory. On a GPU: tests/gpu/test_torch_bf16_view_gpu.py (not run here).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_launch_byte_order import FakeDevice, device
from sparsile.tests.backend.test_prepared import OK

torch = pytest.importorskip("torch")

__all__ = ["device"]  # (the fixture, imported for the tests below)

N = 300
BLOCK = 128
GRID = (-(-N // BLOCK),)
TYPES = {"bf16": (torch.bfloat16, torch.int16, ml_dtypes.bfloat16),
         "e4m3": (torch.float8_e4m3fn, torch.int8, ml_dtypes.float8_e4m3fn)}


def add_kernel(elem: str) -> Any:
    """out[i] = x[i] + y[i] over ``elem`` pointers."""
    return sp.loads(f'''
@kernel
def add(x: ptr[{elem}], y: ptr[{elem}], out: ptr[{elem}], n: i32, BLOCK: constexpr = 128):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    store(out + offs, load(x + offs, mask=mask) + load(y + offs, mask=mask), mask=mask)
''', f"add_{elem}.spk").kernels["add"]


def fake_add(fake: FakeDevice, host_type: Any) -> Any:
    """The faked device's launch of :func:`add_kernel`: the sum of the two inputs in float32,
    rounded to the element type, on device memory."""
    size = np.dtype(host_type).itemsize

    def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        pointers = (ctypes.c_void_p * 4).from_address(params)
        x, y, out = (struct.unpack("<Q", ctypes.string_at(p, 8))[0] for p in pointers[:3])
        (n,) = struct.unpack("<i", ctypes.string_at(pointers[3], 4))
        (xm, xo), (ym, yo), (om, oo) = fake.find(x), fake.find(y), fake.find(out)
        a = np.frombuffer(bytes(xm[xo:xo + size * n]), host_type).astype(np.float32)
        b = np.frombuffer(bytes(ym[yo:yo + size * n]), host_type).astype(np.float32)
        om[oo:oo + size * n] = (a + b).astype(host_type).tobytes()
        fake.launches += 1
        return (OK,)

    return launch


def tensor_inputs(seed: int, elem: str, step: int) -> tuple[Any, Any, np.ndarray]:
    """(memory, the tensor over it with ``step``, y): random values, never zero."""
    dtype, _, host_type = TYPES[elem]
    rng = np.random.default_rng(seed)
    scale = 100 if elem == "bf16" else 8
    memory = torch.from_numpy(rng.uniform(0.5, 1, N * step) * rng.choice([-scale, scale], N * step)).to(dtype)
    y = (rng.uniform(0.5, 1, N) * rng.choice([-scale, scale], N)).astype(host_type)
    return memory, memory[::step], y


@pytest.mark.parametrize("elem", ["bf16", "e4m3"])
@pytest.mark.parametrize("step", [1, 3])
@pytest.mark.parametrize("torch_written", [False, True])
def test_a_torch_tensor_and_a_numpy_view_of_its_memory_are_one_view_on_both_paths(
        device: FakeDevice, elem: str, step: int, torch_written: bool) -> None:
    _, int_type, host_type = TYPES[elem]
    device.vector_add = fake_add(device, host_type)
    k = add_kernel(elem)
    results = []
    for run in (k, k.interpret):
        memory, t, y = tensor_inputs(7, elem, step)
        view = t.view(int_type).numpy().view(host_type)  # (numpy's view of the tensor's memory)
        assert view.__array_interface__["data"][0] == t.data_ptr()
        before = memory.view(int_type).numpy().copy()
        ref = t.to(torch.float64).numpy() + y.astype(np.float64)
        x, out = (view, t) if torch_written else (t, view)
        run[GRID](x, y, out, N, BLOCK=BLOCK)
        got = t.to(torch.float64).numpy()
        np.testing.assert_allclose(got, ref, rtol=2 ** -7 if elem == "bf16" else 2 ** -3)
        between = np.ones(memory.numel(), bool)
        between[::step] = False
        assert (memory.view(int_type).numpy()[between] == before[between]).all(), "memory between written"
        results.append(memory.view(int_type).numpy().tobytes())
    assert device.launches == 1
    assert results[0] == results[1]  # (the interpreter's bits)



@pytest.mark.parametrize("torch_written", [False, True])
def test_a_torch_tensor_and_a_numpy_view_sharing_part_of_its_memory_are_sp0750_on_both_paths(
        device: FakeDevice, torch_written: bool) -> None:
    """Memory shared in part, one written: refused on both paths, as before (the interpreter uses the
    tensor in place now, but overlaps it as the copy it was: the GPU path refuses it too)."""
    device.vector_add = fake_add(device, ml_dtypes.bfloat16)
    k = add_kernel("bf16")
    for run in (k, k.interpret):
        memory, _, y = tensor_inputs(8, "bf16", 1)
        t = memory[:N - 1]
        view = memory[1:].view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        before = memory.view(torch.int16).numpy().copy()
        x, out = (view, t) if torch_written else (t, view)
        with pytest.raises(LaunchError) as info:
            run[GRID](x, y, out, N - 1, BLOCK=BLOCK)
        assert info.value.code == "SP0750"
        assert (memory.view(torch.int16).numpy() == before).all()
    assert device.launches == 0
