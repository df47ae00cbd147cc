"""frontend/sema/specialize.py: the launch path's remembered specializations give exactly what a fresh
specialization gives, and every check still runs for an argument that would fail it."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import LaunchError
from sparsile.frontend.sema.specialize import specialize

SOURCE = """
@kernel
def k(x: ptr[f32], n: i32, scale: f32, untyped, BLOCK: constexpr):
    i = program_id(0) * BLOCK + arange(0, BLOCK)
    store(x + i, load(x + i, mask=i < n) * scale, mask=i < n)
"""


@pytest.fixture()
def kernel():
    return sp.loads(SOURCE).k


def fresh(kernel, *args, **kwargs):
    bound, _, _ = kernel.bind(args, dict(kwargs))
    return specialize(kernel.name, kernel.params, bound)


def test_memo_agrees_with_a_fresh_specialization(kernel):
    x = np.zeros(64, np.float32)
    cases = [(x, 16, 1.5, 3, 64), (x, 17, 2.5, 3, 64), (x, 17, 2.5, 2**40, 64), (x, 17, 2.5, -7, 64),
             (x, 32, 0.5, 3, 128), (x[1:], 16, 1.5, 3, 64)]
    for _ in range(2):  # the second round is answered from the memo
        for args in cases:
            _, bindings, key = kernel.bind(args[:4], {"BLOCK": args[4]})
            assert (bindings, key[:-1]) == fresh(kernel, *args[:4], BLOCK=args[4])


def test_distinct_specializations_stay_distinct(kernel):
    x = np.zeros(64, np.float32)
    keys = {kernel.bind((x, n, 1.0, u), {"BLOCK": b})[2] for n, u, b in
            [(16, 1, 64), (17, 1, 64), (16, 2**40, 64), (16, 1, 128)]}
    assert len(keys) == 4


def test_run_time_floats_do_not_grow_the_memo(kernel):
    x = np.zeros(64, np.float32)
    for i in range(50):
        kernel.bind((x, 16, float(i) / 7, 1), {"BLOCK": 64})
    assert len(kernel._spec_memo) == 1


def test_an_integer_out_of_range_is_refused_after_one_in_range(kernel):
    x = np.zeros(64, np.float32)
    kernel.bind((x, 5, 1.0, 1), {"BLOCK": 64})
    with pytest.raises(LaunchError) as err:
        kernel.bind((x, 2**40, 1.0, 1), {"BLOCK": 64})
    assert err.value.code == "SP0709"


def test_a_wrong_dtype_is_refused_after_a_right_one(kernel):
    kernel.bind((np.zeros(64, np.float32), 5, 1.0, 1), {"BLOCK": 64})
    with pytest.raises(LaunchError) as err:
        kernel.bind((np.zeros(64, np.float16), 5, 1.0, 1), {"BLOCK": 64})
    assert err.value.code == "SP0703"
