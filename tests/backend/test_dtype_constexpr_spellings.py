"""A dtype constexpr is one constant however it is spelled: ``sp.f16``, ``np.float16``,
``np.dtype("float16")`` (``ml_dtypes.bfloat16`` for ``sp.bf16``).

Specialization takes each spelling as the language type it stands for (docs/language.md,
"Parameter types": a constexpr may be a dtype; frontend/sema/specialize.py), so ``kernel[grid]``
keys and compiles them as one kernel. But the launcher's and the prepared launch's constexpr check
(``constexpr_equal``) compared the spellings themselves: ``constexpr_equal(np.float16, sp.f16)`` was
False, so ``kernel[grid](..., np.float16)`` on the GPU was refused by its own launcher (SP0718,
compiled for ``f16``, given ``np.float16``, shown as ``a <attribute 'dtype' ...> `type` array``),
and a launch prepared for ``np.float16`` refused ``sp.f16``. Now every spelling of one type is
one constexpr on every path, and the diagnostic shows a type as a type.

Fake device of tests/backend/test_prepared.py for the GPU paths (kernels compile for sm_90a for
real, launches are recorded); the numerics are the interpreter's against NumPy's conversion."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.runtime.arguments import MISSING, constexpr_equal, describe_value
from sparsile.frontend.diagnostics import LaunchError

pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from sparsile.tests.backend.test_prepared import arrays  # noqa: E402
from sparsile.tests.backend.test_prepared import gpu as gpu  # noqa: E402  (the fake device, a fixture)

N = 256

# each row: spellings of one type, the language's first
SPELLINGS = [
    (sp.f16, np.float16, np.dtype("float16")),
    (sp.bf16, ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16)),
    (sp.f32, np.float32, np.dtype("float32")),
    (sp.i8, np.int8, np.dtype("int8")),
    (sp.u32, np.uint32, np.dtype("uint32")),
    # Python's builtin types, read as NumPy reads them (np.dtype(float) is float64): not the types a
    # Python float or int *value* gets (f32, i32; docs/language.md, "Parameter types")
    (sp.f64, np.float64, np.dtype("float64"), float),
    (sp.i64, np.int64, np.dtype("int64"), int),
    (sp.bool, np.bool_, np.dtype("bool"), bool),
]


@sp.jit
def through(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], DT: sp.constexpr, BLOCK: sp.constexpr = 256):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < N
    sp.store(out + offs, sp.load(x + offs, mask=mask).to(DT).to(sp.f32), mask=mask)


@pytest.fixture(autouse=True)
def fresh_launchers():
    """Each test builds its launchers on its own fake device."""
    through.__dict__.pop("_launchers", None)
    through.__dict__.pop("_fast_launches", None)


def _ids(rows: list[tuple[Any, ...]]) -> list[str]:
    return [str(r[0]) for r in rows]


@pytest.mark.parametrize("row", SPELLINGS, ids=_ids(SPELLINGS))
def test_constexpr_equal_takes_every_spelling_of_a_dtype(row: tuple[Any, ...]) -> None:
    for a in row:
        for b in row:
            assert constexpr_equal(a, b), (a, b)
        assert constexpr_equal((a, 2), (row[0], 2)) and constexpr_equal([2, (a,)], (2, (row[-1],)))


def test_constexpr_equal_tells_dtypes_and_other_values_apart() -> None:
    for a, b in [(np.float16, sp.f32), (np.float16, np.float32), (ml_dtypes.bfloat16, sp.f16),
                 (np.float32, sp.tf32), (np.int8, sp.u8), (np.float16, "float16"), (np.float16, np.float16(0)),
                 (np.dtype("float16"), np.float16(0)), (sp.f16, 16), (np.int32, 32), (np.float16, None),
                 (np.dtype([("a", np.int8)]), sp.i8), (np.complex64, sp.f32), (float, sp.f32), (float, np.float32),
                 (int, sp.i32), (float, 1.0), (int, 3), (bool, True), (float, int), (bool, sp.u8)]:
        assert not constexpr_equal(a, b) and not constexpr_equal(b, a), (a, b)


@sp.jit
def widen(out: sp.ptr[sp.f64], a, DT: sp.constexpr):
    sp.store(out, a.to(DT).to(sp.f64))


def test_a_builtin_type_is_numpys_dtype_while_a_value_of_it_is_the_languages() -> None:
    """``DT=float`` is ``sp.f64`` (``int`` ``sp.i64``, ``bool`` ``sp.bool``), as NumPy reads the
    builtin types, while the Python float value 16777217.0 for an unannotated parameter is an f32
    (16777216.0) and the int 3 an i32: the two readings docs/language.md states, pinned."""
    cases = [(np.float64(16777217.0), float, 16777217.0), (np.float64(16777217.0), sp.f32, 16777216.0),
             (16777217.0, float, 16777216.0), (np.int64(2**40 + 1), int, float(2**40 + 1)),
             (np.int64(2**40 + 1), sp.i32, 1.0), (2.5, bool, 1.0)]
    for a, dt, want in cases:
        out = np.full(1, np.nan)
        widen.interpret[(1,)](out, a, dt)
        assert out[0] == want, (a, dt)
    x = np.zeros(N, np.float32)
    assert "f64" in str(through.ir(x, x, float)) and str(through.ir(x, x, float)) != str(through.ir(x, x, sp.f32))


def test_describe_value_shows_a_type_as_a_type() -> None:
    assert describe_value(np.float16) == "type <class 'numpy.float16'>"
    assert describe_value(np.dtype("float16")) == f"{type(np.dtype('float16')).__name__} dtype('float16')"


def _reference(x: np.ndarray, dt: Any) -> np.ndarray:
    return x.astype(np.dtype(dt)).astype(np.float32)


@pytest.mark.parametrize("row", SPELLINGS, ids=_ids(SPELLINGS))
def test_every_spelling_computes_the_same_in_the_interpreter(row: tuple[Any, ...]) -> None:
    # in the range of every type (a conversion out of range saturates in the language, wraps in NumPy)
    x = np.random.default_rng(55).uniform(-100.0, 100.0, N).astype(np.float32)
    if row[0] == sp.u32:
        x = np.abs(x)
    host = np.dtype(row[1])
    ref = _reference(x, host)
    irs = set()
    for dt in row:
        out = np.full(N, np.nan, np.float32)
        through.interpret[(1,)](x, out, dt)
        np.testing.assert_array_equal(out, ref)
        irs.add(str(through.ir(x, out, dt)))
    assert len(irs) == 1  # one typed IR


@pytest.mark.parametrize("row", SPELLINGS, ids=_ids(SPELLINGS))
def test_kernel_grid_launches_every_spelling_with_one_kernel(gpu: Any, row: tuple[Any, ...]) -> None:
    gpu.sizes = [8, 8]
    x, _, out = arrays()
    for dt in (*row[1:], row[0], *row[1:]):  # the full path, then the fast one
        through[(1,)](x, out, dt)
    assert len(gpu.built) == 1 and len(gpu.launches) == 2 * len(row) - 1
    launcher = next(iter(through.__dict__["_launchers"].values()))
    for dt in row:
        launcher((1,), [x, out, dt, MISSING])


@pytest.mark.parametrize("row", SPELLINGS, ids=_ids(SPELLINGS))
def test_a_launch_prepared_for_one_spelling_takes_the_others(gpu: Any, row: tuple[Any, ...]) -> None:
    gpu.sizes = [8, 8]
    x, _, out = arrays()
    for prepared_for in row:
        launch_ = through[(1,)].prepare(x, out, prepared_for)  # DT positional: checked per call
        for dt in row:
            launch_(x, out, dt)
    assert len(gpu.built) == 1 and len(gpu.launches) == len(row) ** 2


def test_a_launch_prepared_for_a_dtype_refuses_another(gpu: Any) -> None:
    gpu.sizes = [8, 8]
    x, _, out = arrays()
    launch_ = through[(1,)].prepare(x, out, np.float16)
    for other in (np.float32, sp.bf16, ml_dtypes.bfloat16, np.dtype("int8"), "float16"):
        with pytest.raises(LaunchError) as exc:
            launch_(x, out, other)
        assert exc.value.code == "SP0718"
        assert exc.value.message == (f"argument `DT` = {describe_value(other)}, but the launch was prepared for "
                                     "DT = type <class 'numpy.float16'>")
    assert len(gpu.launches) == 0


def test_autotune_keys_every_spelling_of_a_dtype_constexpr_as_one(tmp_path: Any, monkeypatch: Any) -> None:
    """A dtype constexpr the call gives is part of the autotuning key: ``np.float16`` failed there
    with an internal TypeError (a NumPy type has ``shape`` and ``dtype`` attributes: it was read as
    an array); now every spelling is the key of ``sp.f16``, tuned once."""
    from sparsile.driver.autotune import Autotuner

    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARSILE_AUTOTUNE", raising=False)
    monkeypatch.setattr(Autotuner, "_gpu_name", lambda self: "Fake GPU")
    timed: list[int] = []

    def bench(fn: Any, *, warmup: int, rep: int, stream: Any) -> float:
        fn()  # (the interpreter)
        timed.append(fn.config.kwargs["BLOCK"])
        return {128: 2.0, 256: 1.0}[fn.config.kwargs["BLOCK"]]

    tuner = sp.autotune([{"BLOCK": 128}, {"BLOCK": 256}], key=[], benchmarker=bench)(through)
    tuner.launch_kernel = lambda grid, args, kw, stream: tuner.kernel.interpret[grid](*args, **kw)  # type: ignore
    x = np.random.default_rng(56).uniform(-100.0, 100.0, N).astype(np.float32)
    for dt in (np.float16, sp.f16, np.dtype("float16")):
        out = np.full(N, np.nan, np.float32)
        tuner[(1,)](x, out, DT=dt)
        np.testing.assert_array_equal(out, _reference(x, np.float16))
    assert timed == [128, 256]  # tuned once
    assert len(tuner.cache) == 1


torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("dtype", "message", "help_"), [
    (np.complex64, "is the dtype np.complex64, which has no type in the language", "pass a dtype of the language"),
    (np.dtype("complex64"), "is the dtype dtype('complex64'), which has no type in the language",
     "pass a dtype of the language"),
    ((np.longdouble,), "is the dtype np.longdouble, which has no type in the language (inside a tuple or list)",
     "pass a dtype of the language"),
    (torch.float16, "is the torch dtype torch.float16: a constexpr dtype is the language's or NumPy's",
     "pass sp.f16 (or np.float16)"),
    (torch.bfloat16, "is the torch dtype torch.bfloat16: a constexpr dtype is the language's or NumPy's",
     "pass sp.bf16 (or ml_dtypes.bfloat16)"),
], ids=str)
def test_a_dtype_without_a_language_type_is_sp0723_naming_it(gpu: Any, dtype: Any, message: str, help_: str) -> None:
    """Before, these said ``must be a number, bool, string, tuple or dtype, found type`` (or ``found
    dtype``) of what is a dtype."""
    x = np.random.default_rng(57).uniform(-1.0, 1.0, N).astype(np.float32)
    out = np.full(N, np.nan, np.float32)
    fx, _, fout = arrays()
    for launch in (lambda: through.interpret[(1,)](x, out, dtype), lambda: through[(1,)](fx, fout, dtype),
                   lambda: through[(1,)].prepare(fx, fout, dtype)):
        with pytest.raises(LaunchError) as exc:
            launch()
        assert exc.value.code == "SP0723"
        assert exc.value.message == f"constexpr argument `DT` {message}"
        assert exc.value.help.startswith(help_)
    assert np.isnan(out).all() and len(gpu.launches) == 0
