"""Host memory exported through DLPack only, of an element type numpy cannot read (bfloat16,
float8 e4m3 / e5m2 from torch), at ``kernel[grid](...)`` and ``kernel.interpret[grid](...)``.

The GPU path reads such an export with its own DLPack reader (backend/runtime/arrays.py) and stages
it; the interpreter, the reference, tried ``np.from_dlpack`` (which refuses the dtype), fell back
to ``np.array`` (a 0-d object array) and said SP0708 "expects an array". It now reads the export
with the same reader (frontend/dlpack.py, through frontend/interp/dlpack_host.py), dtype kept, in
place: both paths read and write it alike.

No GPU: the faked device of tests/backend/test_launch_byte_order.py, its "kernel" the add of
tests/backend/test_launch_torch_bf16_view.py. On a GPU: tests/gpu/test_torch_bf16_view_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.interp.dlpack_host import dlpack_host_view
from sparsile.tests.backend.test_launch_byte_order import FakeDevice, device
from sparsile.tests.backend.test_launch_foreign_host_arrays import Exported
from sparsile.tests.backend.test_launch_torch_bf16_view import BLOCK, GRID, TYPES, N, add_kernel, fake_add

torch = pytest.importorskip("torch")

__all__ = ["device"]  # (the fixture, imported for the tests below)

ELEMS = ["bf16", "e4m3"]


def _tensor(seed: int, elem: str, length: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    scale = 100 if elem == "bf16" else 8
    return torch.from_numpy(rng.uniform(0.5, 1, length) * rng.choice([-scale, scale], length)).to(TYPES[elem][0])


@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("step", [1, 3])
def test_a_dlpack_export_numpy_cannot_type_is_read_on_both_paths(device: FakeDevice, elem: str, step: int) -> None:
    _, int_type, host_type = TYPES[elem]
    device.vector_add = fake_add(device, host_type)
    k = add_kernel(elem)
    x = _tensor(1, elem, N * step)[::step]
    y = _tensor(2, elem, N)
    ref = x.to(torch.float64).numpy() + y.to(torch.float64).numpy()
    results = []
    for run in (k, k.interpret):
        out = torch.full((N,), float("nan"), dtype=TYPES[elem][0])
        run[GRID](Exported(x), Exported(y), out, N, BLOCK=BLOCK)
        got = out.to(torch.float64).numpy()
        assert not np.isnan(got).any(), "unwritten outputs"
        np.testing.assert_allclose(got, ref, rtol=2 ** -7 if elem == "bf16" else 2 ** -3)
        results.append(out.view(int_type).numpy().tobytes())
    assert device.launches == 1
    assert results[0] == results[1]


@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("step", [1, 2])
def test_a_dlpack_export_numpy_cannot_type_is_written_on_both_paths(device: FakeDevice, elem: str,
                                                                   step: int) -> None:
    """out is a DLPack-only export of a strided bf16 (e4m3) tensor: written in its elements on both
    paths, the memory between them left alone."""
    _, int_type, host_type = TYPES[elem]
    device.vector_add = fake_add(device, host_type)
    k = add_kernel(elem)
    x, y = _tensor(3, elem, N), _tensor(4, elem, N)
    ref = x.to(torch.float64).numpy() + y.to(torch.float64).numpy()
    results = []
    for run in (k, k.interpret):
        memory = _tensor(5, elem, N * step)
        before = memory.view(int_type).numpy().copy()
        out = memory[::step]
        out.fill_(float("nan") if elem == "bf16" else 448.0)
        run[GRID](x, y, Exported(out), N, BLOCK=BLOCK)
        got = out.to(torch.float64).numpy()
        assert not np.isnan(got).any() and not (got == 448.0).all(), "unwritten outputs"
        np.testing.assert_allclose(got, ref, rtol=2 ** -7 if elem == "bf16" else 2 ** -3)
        between = np.ones(N * step, bool)
        between[::step] = False
        assert (memory.view(int_type).numpy()[between] == before[between]).all()
        results.append(memory.view(int_type).numpy().tobytes())
    assert device.launches == 1
    assert results[0] == results[1]


@pytest.mark.parametrize("elem", ["bf16", "e4m3", "e5m2"])
def test_the_interpreter_views_the_export_in_place_with_its_dtype(elem: str) -> None:
    dtype = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[elem]
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dtype).t()  # (a transpose: strides (1, 4))
    view = dlpack_host_view(Exported(t))
    assert view is not None and view.dtype.name == {"bf16": "bfloat16", "e4m3": "float8_e4m3fn",
                                                    "e5m2": "float8_e5m2"}[elem]
    assert view.shape == (4, 3) and view.__array_interface__["data"][0] == t.data_ptr()
    np.testing.assert_array_equal(view.astype(np.float64), t.to(torch.float64).numpy())
    view[1, 2] = 3  # (in place: the tensor sees it)
    assert float(t[1, 2]) == 3.0


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_the_launcher_views_a_strided_cpu_tensor_of_an_8_bit_float(dtype_name: str) -> None:
    """backend/runtime/arrays.py viewed a strided float8_e5m2 CPU tensor through numpy's as_strided,
    which loses the ml_dtypes type ('<f1' not understood: an internal TypeError at kernel[grid]); it
    shares the interpreter's view now (frontend/interp/dlpack_host.py ``memory_view``)."""
    from sparsile.backend.runtime.arrays import describe_array

    t = (torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5.5).to(getattr(torch, dtype_name)).t()
    info = describe_array(t)
    assert info is not None and info.host is not None
    assert info.host.dtype.name == dtype_name and info.host.shape == (4, 3)
    assert info.host.__array_interface__["data"][0] == t.data_ptr()
    np.testing.assert_array_equal(info.host.astype(np.float64), t.to(torch.float64).numpy())
