"""On the GPU: a prepared launch agrees with ``kernel[grid]`` on NumPy scalars and dtype constexprs
(tests/backend/test_prepared_scalar_types.py and test_dtype_constexpr_spellings.py check the same on
a fake device, with the interpreter's numerics). A launch prepared for ``a=3`` (``i32``) refuses
``np.int8(100)`` (SP0736), which ``kernel[grid]`` runs in ``i8``; one of the prepared type computes
what ``kernel[grid]`` computes; ``kernel[grid]`` and a prepared launch take ``np.float16`` for
``sp.f16`` as a dtype constexpr."""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import LaunchError

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from sparsile.tests.backend.test_dtype_constexpr_spellings import through  # noqa: E402
from sparsile.tests.backend.test_prepared_scalar_types import N, poly  # noqa: E402


def _reference(x: np.ndarray, a: Any) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        c = float(a * a + a) if isinstance(a, np.generic) else float(np.float32(a) * np.float32(a) + np.float32(a))
    return x.astype(np.float64) + c


@pytest.mark.parametrize(("prepared_for", "same", "other"), [
    (3, np.int32(-7), np.int8(100)), (np.int8(3), np.int8(100), 100), (1.0, np.float32(2.5), np.float16(300.0)),
    (np.float16(1.5), np.float16(300.0), 300.0), (ml_dtypes.bfloat16(1.5), ml_dtypes.bfloat16(1.0078125), 1.0078125),
], ids=repr)
def test_a_prepared_launch_computes_what_kernel_grid_computes_or_refuses(prepared_for: Any, same: Any,
                                                                         other: Any) -> None:
    x = torch.from_numpy(np.random.default_rng(62).uniform(-4.0, 4.0, N).astype(np.float32)).cuda()
    out = torch.full((N,), float("nan"), device="cuda")
    launch = poly[(1,)].prepare(x, out, prepared_for)
    out.fill_(float("nan"))
    launch(x, out, same)
    np.testing.assert_allclose(out.cpu().numpy(), _reference(x.cpu().numpy(), same), rtol=2 * np.finfo(np.float32).eps)
    out.fill_(float("nan"))
    with pytest.raises(LaunchError) as exc:
        launch(x, out, other)
    assert exc.value.code == "SP0736"
    torch.cuda.synchronize()
    assert torch.isnan(out).all()  # nothing ran
    poly[(1,)](x, out, other)
    np.testing.assert_allclose(out.cpu().numpy(), _reference(x.cpu().numpy(), other), rtol=2 * np.finfo(np.float32).eps)


@pytest.mark.parametrize("row", [(sp.f16, np.float16, np.dtype("float16")),
                                 (sp.bf16, ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16))], ids=repr)
def test_every_spelling_of_a_dtype_constexpr_launches_on_the_gpu(row: tuple[Any, ...]) -> None:
    xs = np.random.default_rng(63).uniform(-100.0, 100.0, N).astype(np.float32)
    ref = xs.astype(np.dtype(row[1])).astype(np.float32)
    x = torch.from_numpy(xs).cuda()
    out = torch.full((N,), float("nan"), device="cuda")
    for dt in row:
        out.fill_(float("nan"))
        through[(1,)](x, out, dt)
        np.testing.assert_array_equal(out.cpu().numpy(), ref)
        launch = through[(1,)].prepare(x, out, dt)
        for other in row:
            out.fill_(float("nan"))
            launch(x, out, other)
            np.testing.assert_array_equal(out.cpu().numpy(), ref)
