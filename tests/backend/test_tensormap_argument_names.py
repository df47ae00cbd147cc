"""A tensor map the launcher cannot encode for a ``tensor[...]`` argument (a base address that is not
16-byte aligned, a 0 dimension: backend/runtime/tensormap.py's checks) is SP0714 naming the
argument, as a prepared launch words it ("the tensor map of argument `X` is invalid: ..."), on
``kernel[grid]``'s full path and its fast path. It said "tensor map is invalid" without the
argument. On the fake device of test_prepared.py, with a fake encoder that validates as
``make_tensor_map`` does."""

from __future__ import annotations

from typing import Any

import pytest

import sparsile as sp
from sparsile.backend import runtime
from sparsile.backend.runtime import launcher as launcher_module
from sparsile.backend.runtime.tensormap import TensorMap
from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_prepared import FakeCudaTensor
from sparsile.tests.backend.test_prepared import gpu as gpu  # (the fake device, a fixture)

torch = pytest.importorskip("torch")

SOURCE = """
@kernel(num_warps=4)
def k(X: tensor[f16, 2], M: i32):
    s = smem.alloc(f16, (64, 64), swizzle=128)
    bars = mbarrier.alloc(1)
    mbarrier.expect(bars[0], 8192)
    tma.load(X, (program_id(0) * 64, 0), s, bars[0])
    mbarrier.wait(bars[0], 0)
"""


@pytest.fixture
def encoder(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    encoded: list[int] = []

    def make(spec: Any, ptr: int, owner: Any = None, device: Any = None, validated: bool = False) -> TensorMap:
        if not validated:
            spec.validate(ptr)  # as runtime.make_tensor_map
        encoded.append(ptr)
        return TensorMap(spec, ptr, bytes(128))

    monkeypatch.setattr(launcher_module, "make_tensor_map", make)
    monkeypatch.setattr(runtime, "make_tensor_map", make)
    return encoded


def _x(ptr: int = 0x7A00_0000_0000, shape: tuple[int, int] = (256, 512)) -> FakeCudaTensor:
    return FakeCudaTensor(ptr, shape, dtype=torch.float16)


@pytest.mark.parametrize("bad, problem", [(_x(ptr=0x7A00_0000_0008), "global address 0x7a0000000008 is not "
                                                                     "16-byte aligned"),
                                          (_x(shape=(0, 512)), "global dimension 0 = 0 is outside 1..2^32")])
@pytest.mark.parametrize("fast", [False, True])
def test_an_invalid_tensor_map_names_its_argument(gpu: Any, encoder: list[int], bad: Any, problem: str,
                                                  fast: bool) -> None:
    k = sp.loads(SOURCE, "case.spk").k
    if fast:
        k[(4,)](_x(), 256)  # a fast entry for these kinds of arguments
    with pytest.raises(LaunchError) as exc:
        k[(4,)](bad, 256)
    assert exc.value.code == "SP0714"
    assert str(exc.value).splitlines()[0] == f"error[SP0714]: the tensor map of argument `X` is invalid: {problem}"
    assert len(gpu.launches) == int(fast)
