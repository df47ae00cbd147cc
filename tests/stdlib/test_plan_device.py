"""Sparse kernel plans are made for the GPU their arrays live on (stdlib/kernels/plan_device.py): on a
faked host whose device 0 (the current one) is a B200 and device 1 an H200, a plan for arrays on
device 1 is the Hopper plan with the H200's SM count, one for host arrays (the current device) the
Blackwell plan. The arrays are numpy ones; which device b or x "lives on" is what
``plan_device.device_ordinal`` is made to say. On two real GPUs: tests/gpu/test_multi_gpu.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sparsile.backend import runtime
from sparsile.stdlib.kernels import plan_device, plan_sparse_linear, plan_sparse_matmul
from sparsile.stdlib.kernels.gemm import gpu_sm_count, plan_target
from sparsile.stdlib.kernels.gemm_sm100 import device_sm_count
from sparsile.tests.stdlib.test_gemm_api import problem
from sparsile.tests.stdlib.test_gemm_tuning import _device

GPUS = {0: _device("NVIDIA B200", (10, 0), 148), 1: dataclasses.replace(_device("NVIDIA H200", (9, 0), 132), ordinal=1)}


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(runtime, "current_device", lambda ordinal=None: GPUS[0 if ordinal is None else ordinal])


def _living_on(monkeypatch: pytest.MonkeyPatch, array: object, ordinal: int | None, *more: object) -> None:
    monkeypatch.setattr(plan_device, "device_ordinal",
                        lambda a: ordinal if any(a is m for m in (array, *more)) else None)


@pytest.mark.parametrize("ordinal", [None, 0, 1])
def test_a_plan_is_for_the_device_of_its_arrays(two_gpus: None, monkeypatch: pytest.MonkeyPatch,
                                                 ordinal: int | None) -> None:
    weight, b = problem("bf16", 256, 128, 256, seed=1)
    x4 = b[:4]
    _living_on(monkeypatch, b, ordinal, x4)
    hopper = ordinal == 1
    matmul = plan_sparse_matmul(weight.values, weight.meta, b, kernel="gemm")
    assert type(matmul).__name__ == ("SparseMatmul" if hopper else "SparseMatmulSm100")
    assert hopper or matmul.num_sms == 148
    linear = plan_sparse_linear(weight.values, weight.meta, b)
    assert type(linear).__name__ == ("SparseLinearPlan" if hopper else "SparseLinearPlanSm100")
    decode = plan_sparse_linear(weight.values, weight.meta, x4)  # 4 tokens: Hopper's decode kernel
    assert type(decode).__name__ == ("SparseDecodePlan" if hopper else "SparseLinearPlanSm100")


def test_what_planning_reads_of_the_gpu(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    x = object()
    probe = plan_device.plans_on_arrays(lambda values, meta, x: (plan_target(None, False), gpu_sm_count(False),
                                                                 device_sm_count(False), plan_device.plan_ordinal()))
    assert probe(None, None, x) == ("sm_100a", 148, 148, None)  # host arrays: the current device
    _living_on(monkeypatch, x, 1)
    assert probe(None, None, x) == ("sm_90a", 132, 132, 1)
    assert plan_device.plan_ordinal() is None  # reset after the plan
    values = object()
    _living_on(monkeypatch, values, 1)  # x on the host, values on device 1
    assert probe(values, None, x)[3] == 1
    assert probe(values=values, meta=None, x=x)[3] == 1  # by keyword too
    weight, b = problem("bf16", 256, 128, 256, seed=1)
    _living_on(monkeypatch, b, 1)
    plan = plan_sparse_matmul(values=weight.values, meta=weight.meta, b=b, kernel="gemm")
    assert type(plan).__name__ == "SparseMatmul"  # b by keyword: planned for its device, the H200


def test_a_plan_whose_only_gpu_array_is_out_is_for_outs_device(two_gpus: None, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """Host operands and out on device 1: the launch (writing out in place) runs on out's device, so
    the plan is for it too. It was for the current device (the B200's sm_100a plan), as only x / b
    and values were looked at."""
    weight, b = problem("f16", 256, 128, 256, seed=1)
    out = np.empty((256, 128), np.float16)
    _living_on(monkeypatch, out, 1)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, out=out, kernel="gemm")
    assert type(plan).__name__ == "SparseMatmul"  # the H200's Hopper plan
    bias = np.zeros(256, np.float32)
    _living_on(monkeypatch, bias, 1)
    assert type(plan_sparse_linear(weight.values, weight.meta, b, bias=bias)).__name__ == "SparseLinearPlan"
