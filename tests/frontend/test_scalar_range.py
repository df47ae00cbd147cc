"""The float overflow rule of scalar arguments is one rule (frontend/ir/scalar_range.py), called by
both the frontend's launch check (sema/specialize.py, the interpreter's launch) and the GPU launcher's
packing (backend/runtime/scalars.py): a change of the one limit table changes both, so they cannot
drift apart (each used to hold its own: a table in specialize, struct's OverflowError and bf16 bits
in the launcher)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.backend.runtime import arguments as A
from sparsile.frontend.diagnostics import LaunchError
from sparsile.frontend.ir import scalar_range
from sparsile.frontend.ir import types as T
from sparsile.frontend.sema.specialize import ParamInfo, arg_spec


@pytest.mark.parametrize("t", ["f16", "bf16", "f32", "f64"])
def test_both_layers_apply_the_one_limit_table(t: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value = float(np.random.default_rng(len(t)).uniform(200.0, 300.0))
    p = ParamInfo("a", T.scalar_type(t))
    assert arg_spec(p, value).type == T.scalar_type(t)  # in range of every float type
    assert len(A.encode_scalar(t, value, "a")) == T.scalar_type(t).bytes
    monkeypatch.setitem(scalar_range.FLOAT_OVERFLOW, t, 100)  # as if the type's largest value were below 100
    message = f"argument `a` = {value!r} overflows {t}"
    for refuse in (lambda: arg_spec(p, value), lambda: A.encode_scalar(t, value, "a")):
        with pytest.raises(LaunchError) as e:
            refuse()
        assert (e.value.code, e.value.message) == ("SP0709", message)


def test_the_rule_itself() -> None:
    assert scalar_range.float_overflows(2**128 - 2**103 - 1, "f32")  # rounds to f64 onto the midpoint first
    assert not scalar_range.float_overflows(float(np.finfo(np.float32).max), "f32")
    assert not scalar_range.float_overflows(float("inf"), "f16") and not scalar_range.float_overflows(2**200, "i32")
    assert scalar_range.float_overflows(-2**1100, "f64")
