"""Review of "launches follow their arrays' device": bugs found in files another change owns
(stdlib/kernels/plan_device.py among them), each a strict xfail until fixed there."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sparsile.backend import runtime
from sparsile.stdlib.kernels import plan_device, plan_sparse_matmul
from sparsile.tests.stdlib.test_gemm_api import problem
from sparsile.tests.stdlib.test_gemm_tuning import _device

# device 0 (the current one) a Hopper GPU, device 1 a Blackwell one
GPUS = {0: _device("NVIDIA H200", (9, 0), 132), 1: dataclasses.replace(_device("NVIDIA B200", (10, 0), 148), ordinal=1)}


@pytest.mark.xfail(strict=True, reason="plans_on_arrays reads the device of x/b and values only: a call whose "
                   "operands are host arrays and whose out lives on another GPU is planned for the current device, "
                   "while its launch (writing out in place) runs on out's (an sm_90a cubin on the Blackwell GPU)")
def test_a_plan_whose_only_gpu_array_is_out_is_for_outs_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(runtime, "current_device", lambda ordinal=None: GPUS[0 if ordinal is None else ordinal])
    weight, b = problem("f16", 256, 128, 256, seed=1)
    out = np.empty((256, 128), np.float16)
    monkeypatch.setattr(plan_device, "device_ordinal", lambda a: 1 if a is out else None)  # out "lives" on cuda:1
    plan = plan_sparse_matmul(weight.values, weight.meta, b, out=out)
    assert plan.out is not out or type(plan).__name__ == "SparseMatmulSm100"  # written in place: planned for cuda:1
