"""A typed constant (``T(c)``, docs/language.md §Compile-time values) as a constexpr parameter's
default, as a constexpr argument written in Python (``sp.u8(250)``), and its ``.shape``, in both
frontends (a ``.spk`` kernel and a ``@sparsile.jit`` one):

- ``C: constexpr = u8(250)`` was the untyped integer 250 (``C + C`` was 500): it is the typed
  constant, so ``C + C`` wraps as ``u8`` (interpreter and LLVM IR), as ``u8(250) + u8(250)`` in the
  body; in a ``@jit`` kernel ``u8(250)`` was a Python TypeError at the ``def``;
- a typed constant has ``.shape`` as a scalar value does (``()``).
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile import constexpr, i32, ptr, u8
from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.support import signature

SPK = """
@kernel
def k(X: ptr[u8], O: ptr[i32], C: constexpr = u8(250)):
    static_assert(C.dtype == u8 and C.shape == () and (C + 1).shape == ())
    store(O, C + C)
    store(O + 1, load(X) + C)
"""


@sp.jit
def jit_k(X: ptr[u8], O: ptr[i32], C: constexpr = u8(250)):  # noqa: B008 (the point: a typed default)
    sp.static_assert(C.dtype == u8 and C.shape == () and (C + 1).shape == ())
    sp.store(O, C + C)
    sp.store(O + 1, sp.load(X) + C)


def _kernels() -> list[sp.Kernel]:
    return [sp.loads(SPK, "case.spk").kernels["k"], jit_k]


def _run(kern: sp.Kernel, x: int, **consts: object) -> list[int]:
    xs, out = np.array([x], np.uint8), np.full(2, -7, np.int32)
    kern.interpret[(1,)](xs, out, **consts)
    return out.tolist()


@pytest.mark.parametrize("frontend", ["spk", "jit"])
@pytest.mark.parametrize("seed", range(3))
def test_a_typed_default_of_a_constexpr_wraps_as_its_type(frontend: str, seed: int) -> None:
    kern = _kernels()[frontend == "jit"]
    x = int(np.random.default_rng(seed).integers(1, 256))
    assert _run(kern, x) == [(250 + 250) % 256, (x + 250) % 256]


@pytest.mark.parametrize("frontend", ["spk", "jit"])
@pytest.mark.parametrize("seed", range(3))
def test_a_typed_constexpr_argument_written_in_python_wraps_as_its_type(frontend: str, seed: int) -> None:
    kern = _kernels()[frontend == "jit"]
    c, x = (int(v) for v in np.random.default_rng(seed).integers(129, 256, 2))
    assert _run(kern, x, C=sp.u8(c)) == [(2 * c) % 256, (x + c) % 256]
    assert _run(kern, x, C=sp.u8(c + 256)) == [(2 * c) % 256, (x + c) % 256]  # converted as u8(c + 256) in a kernel


@pytest.mark.parametrize("frontend", ["spk", "jit"])
def test_a_typed_default_folds_to_the_wrapped_constant_in_llvm_ir(frontend: str) -> None:
    kern = _kernels()[frontend == "jit"]
    ll = kern.compile(signature(kern), target="sm_90a", stop_after="llvm", cache=False).llvm
    assert "i8 244" in ll and "500" not in ll


def test_a_typed_constexpr_argument_without_a_value_is_a_launch_error() -> None:
    kern = _kernels()[0]
    with pytest.raises(LaunchError) as e:
        _run(kern, 1, C=sp.u8(2**200))
    assert e.value.code == "SP0723"
    assert f"constexpr argument `C` = u8({2**200}): no integer type holds {2**200}" in str(e.value)


def test_python_typed_constant_repr() -> None:
    assert repr(sp.u8(250)) == "u8(250)" and sp.f16(0.5).dtype is sp.f16


SHAPES = """
@kernel
def k(O: ptr[i32]):
    static_assert(u8(3).shape == () and f16(0.5).shape == (3 + load(O)).shape and (u8(1) + u8(2)).shape == ())
    store(O, len(i32(7).shape) + 5)
"""


@sp.jit
def jit_shapes(O: ptr[i32]):
    sp.static_assert(sp.u8(3).shape == () and sp.f16(0.5).shape == (3 + sp.load(O)).shape)
    sp.store(O, len(sp.i32(7).shape) + 5)


@pytest.mark.parametrize("frontend", ["spk", "jit"])
def test_a_typed_constant_has_a_scalars_shape(frontend: str) -> None:
    kern = sp.loads(SHAPES, "case.spk").kernels["k"] if frontend == "spk" else jit_shapes
    out = np.full(1, -7, np.int32)
    kern.interpret[(1,)](out)
    assert out.tolist() == [5]


def test_a_typed_default_is_bound_as_the_constant_of_its_type() -> None:
    (c,) = [p for p in _kernels()[0].params if p.name == "C"]
    assert (c.annotation, c.default.value, c.default.dtype) == (constexpr, 250, u8)
    assert i32 is sp.i32


@sp.jit
def _scale(X, O, C: constexpr):
    sp.store(O + sp.arange(0, 4), sp.load(X + sp.arange(0, 4)) * C)


@pytest.mark.parametrize("order", [(0.0, -0.0), (-0.0, 0.0)])
def test_typed_constexpr_arguments_of_either_zero_compile_apart(order: tuple[float, float]) -> None:
    """``sp.f32(0.0)`` and ``sp.f32(-0.0)`` are equal TypedConstants (and equal typed Consts), yet
    ``x * C`` differs: the launch fingerprint and the specialization key tell them apart (the second
    launch reused the first one's kernel: ``x * f32(-0.0)`` gave +0.0)."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0.5, 4.0, 4).astype(np.float32)
    for z in order:
        out = np.full(4, np.nan, np.float32)
        _scale.interpret[(1,)](x, out, C=sp.f32(z))
        want = x.astype(np.float64) * z
        assert [np.copysign(1.0, v) for v in out] == [np.copysign(1.0, v) for v in want], (z, out)
        assert out.tolist() == want.tolist()


SPK_TUPLE = """
@kernel
def k(X: ptr[u8], O: ptr[i32], C: constexpr = (u8(250), 3)):
    store(O, C[0] + C[0] + C[1])
    store(O + 1, load(X) + C[0])
"""


@sp.jit
def _jit_tuple(X, O, C: constexpr):
    sp.store(O, C[0] + C[0] + C[1])
    sp.store(O + 1, sp.load(X) + C[0])


@pytest.mark.parametrize("how", ["spk default", "spk argument", "jit argument"])
def test_a_tuple_holding_a_typed_constant_binds_as_a_constexpr(how: str) -> None:
    """A constexpr tuple with a typed element (a ``.spk`` default ``(u8(250), 3)``, or
    ``(sp.u8(250), 3)`` given at launch) binds as the tuple of its constants: it was an
    InternalError "parameter 'C' of k has no binding". ``C[0] + C[0]`` wraps as u8."""
    rng = np.random.default_rng(11)
    x = rng.integers(1, 200, 1).astype(np.uint8)
    out = np.full(2, -7, np.int32)
    kernel = _jit_tuple if how == "jit argument" else sp.loads(SPK_TUPLE, "tuple.spk").kernels["k"]
    kwargs = {} if how == "spk default" else {"C": (u8(250), 3)}
    kernel.interpret[(1,)](x, out, **kwargs)
    assert out.tolist() == [(250 + 250) % 256 + 3, (int(x[0]) + 250) % 256]


@pytest.mark.parametrize("frontend", ["spk", "jit"])
@pytest.mark.parametrize(("given", "c"), [("C=u8(200)", 200), ("C=(u8(250), 1)[0]", 250), ("C=u8(456)", 200)])
def test_a_typed_constant_in_an_ahead_of_time_signature_stays_typed(frontend: str, given: str, c: int) -> None:
    """``--signature "C=u8(200)"`` (Kernel.compile with a signature text) binds the typed constant, as
    the launch argument ``C=sp.u8(200)`` and the default ``C: constexpr = u8(200)`` do: the signature's
    value lost its type (``C + C`` compiled as 400, not u8's 144)."""
    kern = _kernels()[frontend == "jit"]
    ll = kern.compile(f"X=ptr[u8], O=ptr[i32], {given}", target="sm_90a", stop_after="llvm", cache=False).llvm
    assert f"i8 {2 * c % 256}" in ll and str(2 * c) not in ll, ll[-800:]


@pytest.mark.parametrize("frontend", ["spk", "jit"])
@pytest.mark.parametrize("numpy_type", [np.uint8, np.int64, np.int16, np.float32, np.float64])
def test_a_typed_constant_of_a_numpy_number_is_the_constant_of_its_value(frontend: str, numpy_type: type) -> None:
    """``sp.u8(np.int64(c))`` (a NumPy number given to a type written in Python) is ``sp.u8(c)``: it
    was a constant no kernel could use (SP0329 "`+` needs numbers or tiles, found u8(np.int64(3))")
    except where NumPy's type subclasses Python's (np.float64)."""
    kern = _kernels()[frontend == "jit"]
    rng = np.random.default_rng(57)
    c, x = (int(v) for v in rng.integers(129, 256, 2))
    assert repr(sp.u8(numpy_type(c))) == f"u8({float(c) if np.dtype(numpy_type).kind == 'f' else c!r})"
    assert _run(kern, x, C=sp.u8(numpy_type(c))) == [(2 * c) % 256, (x + c) % 256]
