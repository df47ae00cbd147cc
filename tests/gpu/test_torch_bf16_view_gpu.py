"""On a GPU: a CPU torch bfloat16 / float8 tensor and a numpy (ml_dtypes) view of the same memory,
the kernel writing one of them: ``kernel[grid]`` and the interpreter both run it in place (the
interpreter refused it, SP0750), with the interpreter's bits and a float64 reference (random
inputs). The faked-device version: tests/backend/test_launch_torch_bf16_view.py."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.tests.backend.test_launch_torch_bf16_view import TYPES, add_kernel, tensor_inputs

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

N = 300
BLOCK = 128
GRID = (-(-N // BLOCK),)


@pytest.mark.parametrize("elem", ["bf16", "e4m3"])
@pytest.mark.parametrize("step", [1, 3])
@pytest.mark.parametrize("torch_written", [False, True])
def test_a_torch_tensor_and_a_numpy_view_of_its_memory_on_the_gpu(elem: str, step: int, torch_written: bool) -> None:
    _, int_type, host_type = TYPES[elem]
    k = add_kernel(elem)
    results = []
    for run in (k, k.interpret):
        memory, t, y = tensor_inputs(17, elem, step)
        view = t.view(int_type).numpy().view(host_type)
        before = memory.view(int_type).numpy().copy()
        ref = t.to(torch.float64).numpy() + y.astype(np.float64)
        x, out = (view, t) if torch_written else (t, view)
        run[GRID](x, y, out, N, BLOCK=BLOCK)
        np.testing.assert_allclose(t.to(torch.float64).numpy(), ref, rtol=2 ** -7 if elem == "bf16" else 2 ** -3)
        between = np.ones(memory.numel(), bool)
        between[::step] = False
        assert (memory.view(int_type).numpy()[between] == before[between]).all()
        results.append(memory.view(int_type).numpy().tobytes())
    assert results[0] == results[1]


@pytest.mark.parametrize("elem", ["bf16", "e4m3"])
def test_a_dlpack_export_numpy_cannot_type_on_the_gpu(elem: str) -> None:
    """A DLPack-only export of a bf16 / e4m3 CPU tensor, read and written: both paths alike (the
    interpreter said SP0708 before). Faked-device version: tests/backend/test_launch_dlpack_special_dtypes.py."""
    from sparsile.tests.backend.test_launch_foreign_host_arrays import Exported

    dtype, int_type, _ = TYPES[elem]
    k = add_kernel(elem)
    _, x, y = tensor_inputs(21, elem, 1)
    y_t = torch.from_numpy(y.view(np.int16 if elem == "bf16" else np.int8)).view(dtype)
    ref = x.to(torch.float64).numpy() + y.astype(np.float64)
    results = []
    for run in (k, k.interpret):
        out = torch.full((N,), float("nan") if elem == "bf16" else 448.0, dtype=dtype)
        run[GRID](Exported(x), Exported(y_t), Exported(out), N, BLOCK=BLOCK)
        np.testing.assert_allclose(out.to(torch.float64).numpy(), ref, rtol=2 ** -7 if elem == "bf16" else 2 ** -3)
        results.append(out.view(int_type).numpy().tobytes())
    assert results[0] == results[1]
