"""sparsile.jax.call on the CPU: the FFI handler (the interpreter on XLA's host buffers), the
host-callback path (interpret=True), and the trace-time checks (shapes, dtypes, errors)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import sparsile as sp  # noqa: E402
from sparsile.integrations.jax import JaxCallError, call  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@sp.jit
def scale_add(x: sp.ptr[sp.f32], y: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, alpha: sp.f32,
              BLOCK: sp.constexpr = 128):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, alpha * sp.load(x + offs, mask=mask) + sp.load(y + offs, mask=mask), mask=mask)


@sp.jit
def copy_half(x, out, n: sp.i32, BLOCK: sp.constexpr = 64):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n // 2
    sp.store(out + offs, sp.load(x + offs, mask=mask), mask=mask)


@sp.jit
def two_outputs(x: sp.ptr[sp.f32], lo: sp.ptr[sp.f32], hi: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 64):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    v = sp.load(x + offs, mask=mask)
    sp.store(lo + offs, v - 1.0, mask=mask)
    sp.store(hi + offs, v + 1.0, mask=mask)


@sp.jit
def writes_x(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 64):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    v = sp.load(x + offs, mask=mask)
    sp.store(x + offs, v * 2.0, mask=mask)
    sp.store(out + offs, v, mask=mask)


@sp.jit
def unmasked(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], BLOCK: sp.constexpr = 64):
    offs = sp.arange(0, BLOCK)
    sp.store(out + offs, sp.load(x + offs))


N = 300


def _inputs(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return (rng.uniform(0.5, 2.0, n) * rng.choice([-1, 1], n)).astype(np.float32), \
        rng.uniform(0.5, 2.0, n).astype(np.float32)


def _scale_add(x: jax.Array, y: jax.Array, interpret: bool = False) -> jax.Array:
    return call(scale_add, (-(-N // 128),), x, y, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=N,
                alpha=1.5, interpret=interpret)


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_jitted_call_matches_float64(interpret: bool) -> None:
    x, y = _inputs()
    got = np.asarray(jax.jit(lambda a, b: _scale_add(a, b, interpret) * 2.0)(x, y))
    ref = (1.5 * x.astype(np.float64) + y) * 2.0
    _within_f32_rounding(got, ref, 2.0 * (1.5 * np.abs(x.astype(np.float64)) + y))


def _within_f32_rounding(got: np.ndarray, ref: np.ndarray, magnitude: np.ndarray) -> None:
    """|got - ref| within two f32 roundings of the operands' magnitude (a multiply, then an add)."""
    err = np.abs(got.astype(np.float64) - ref)
    assert (err <= np.finfo(np.float32).eps * magnitude).all(), float((err / magnitude).max())


def test_ffi_path_is_a_custom_call_and_callback_path_is_not() -> None:
    x, y = _inputs()
    ffi_text = jax.jit(lambda a, b: _scale_add(a, b)).lower(x, y).as_text()
    callback_text = jax.jit(lambda a, b: _scale_add(a, b, True)).lower(x, y).as_text()
    assert "sparsile_call" in ffi_text and "sparsile_plan" in ffi_text
    assert "sparsile_call" not in callback_text and "callback" in callback_text


def test_eager_call_without_jit() -> None:
    x, y = _inputs()
    got = np.asarray(_scale_add(jnp.asarray(x), jnp.asarray(y)))
    _within_f32_rounding(got, 1.5 * x.astype(np.float64) + y, 1.5 * np.abs(x.astype(np.float64)) + y)


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_output_forms(interpret: bool) -> None:
    x, _ = _inputs(100)
    s = jax.ShapeDtypeStruct((100,), jnp.float32)
    lo, hi = call(two_outputs, (2,), x, out_shapes=[s, s], n=100, interpret=interpret)
    named = call(two_outputs, (2,), x, out_shapes={"hi": s, "lo": s}, n=100, interpret=interpret)
    assert isinstance(named, dict) and set(named) == {"hi", "lo"}
    for got, ref in ((lo, x - 1.0), (hi, x + 1.0), (named["lo"], x - 1.0), (named["hi"], x + 1.0)):
        np.testing.assert_array_equal(np.asarray(got), ref)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "float32"])
@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_dtypes_and_undefined_outputs(dtype: str, interpret: bool) -> None:
    """Untyped pointers take the arrays' dtypes; elements the kernel skips stay poisoned (NaN, or
    0xA5 bytes for integers): outputs start undefined, as XLA's buffers do on the GPU."""
    n = 100
    x = jnp.asarray(np.arange(1, n + 1) % 100 - 50).astype(dtype)
    out = call(copy_half, (1,), x, out_shapes=jax.ShapeDtypeStruct((n,), dtype), n=n, interpret=interpret)
    assert out.dtype == jnp.dtype(dtype)
    got = np.asarray(out.astype(jnp.float32))
    np.testing.assert_array_equal(got[:50], np.asarray(x.astype(jnp.float32))[:50])
    if jnp.issubdtype(jnp.dtype(dtype), jnp.floating):
        assert np.isnan(got[50:]).all()
    else:
        assert (np.asarray(out)[50:] == np.int8(np.uint8(0xA5).view(np.int8))).all()


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_input_output_aliases(interpret: bool) -> None:
    x, y = _inputs()
    f = jax.jit(lambda a, b: call(scale_add, (3,), a, b, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=N,
                                  alpha=2.0, input_output_aliases={1: 0}, interpret=interpret))
    _within_f32_rounding(np.asarray(f(x, y)), 2.0 * x.astype(np.float64) + y, 2.0 * np.abs(x.astype(np.float64)) + y)
    text = jax.jit(lambda a, b: call(scale_add, (3,), a, b, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32),
                                     n=N, alpha=2.0, input_output_aliases={1: 0})).lower(x, y).as_text()
    assert "output_operand_alias" in text


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_a_donated_aliased_input_becomes_the_output(interpret: bool) -> None:
    """Donation (``jax.jit(donate_argnums=...)``) makes the aliased input's buffer the output's: it is
    taken, not refused, and the kernel reads the input's values from it. The same array passed for
    a second, unaliased parameter keeps its values (XLA copies the donated one for the alias)."""
    x, y = _inputs()
    s = jax.ShapeDtypeStruct((N,), jnp.float32)
    f = jax.jit(lambda a, b: call(scale_add, (3,), a, b, out_shapes=s, n=N, alpha=2.0,
                                  input_output_aliases={1: 0}, interpret=interpret), donate_argnums=(1,))
    donated = jnp.asarray(y)
    _within_f32_rounding(np.asarray(f(jnp.asarray(x), donated)), 2.0 * x.astype(np.float64) + y,
                         2.0 * np.abs(x.astype(np.float64)) + np.abs(y))
    assert donated.is_deleted()  # its buffer is the output's
    g = jax.jit(lambda a: call(scale_add, (3,), a, a, out_shapes=s, n=N, alpha=2.0, input_output_aliases={1: 0},
                               interpret=interpret), donate_argnums=(0,))
    _within_f32_rounding(np.asarray(g(jnp.asarray(x))), 3.0 * x.astype(np.float64), 3.0 * np.abs(x.astype(np.float64)))


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
@pytest.mark.parametrize("aliases", [{np.int64(1): 0}, {1: np.int32(0)}, {np.uint8(1): np.int64(0)}],
                         ids=["np-key", "np-value", "np-both"])
def test_input_output_aliases_take_numpy_integers(interpret: bool, aliases: dict) -> None:
    """NumPy integers are indices, as JAX takes them: ``{np.int64(1): 0}`` (e.g. an index computed
    with numpy) was SP0933 "names no array argument", though argument 1 is an array. The call is
    the one ``{1: 0}`` makes (the same lowered program)."""
    x, y = _inputs()
    s = jax.ShapeDtypeStruct((N,), jnp.float32)

    def f(a: jax.Array, b: jax.Array, given: dict) -> jax.Array:
        return call(scale_add, (3,), a, b, out_shapes=s, n=N, alpha=2.0, input_output_aliases=given,
                    interpret=interpret)

    _within_f32_rounding(np.asarray(jax.jit(lambda a, b: f(a, b, aliases))(x, y)), 2.0 * x.astype(np.float64) + y,
                         2.0 * np.abs(x.astype(np.float64)) + np.abs(y))
    text = jax.jit(lambda a, b: f(a, b, aliases)).lower(x, y).as_text()
    assert interpret or "output_operand_alias" in text  # (the callback's program aliases nothing)
    assert _callback_masked(text) == _callback_masked(jax.jit(lambda a, b: f(a, b, {1: 0})).lower(x, y).as_text())


def _callback_masked(text: str) -> str:
    """``text`` with the descriptor of its ``jax.pure_callback`` (if any) replaced by a name: some jax
    releases (0.4.36) lower each callback with its own, a host address (a constant operand and the
    custom call's backend_config), so two lowerings of the same call differ there only."""
    found = re.search(r'@xla_python_cpu_callback\(.*backend_config = "(\d+)"', text)
    return text if found is None else re.sub(rf"\b{found.group(1)}\b", "<callback>", text)


def test_kernel_may_write_an_aliased_input() -> None:
    x, _ = _inputs(64)
    out = call(writes_x, (1,), x, out_shapes=jax.ShapeDtypeStruct((64,), jnp.float32), n=64,
               input_output_aliases={0: 0})
    np.testing.assert_array_equal(np.asarray(out), x)  # the read happens before the write, element by element


# ------------------------------------------------------------------------------------------------
# errors


def _raises(code: str, fn, message: str) -> JaxCallError:
    with pytest.raises(JaxCallError) as info:
        fn()
    assert info.value.code == code
    assert info.value.message.startswith(message), info.value.message
    assert "(at test_jax_call.py:" in info.value.message
    return info.value


def test_out_shapes_errors() -> None:
    x, y = _inputs()
    s = jax.ShapeDtypeStruct((N,), jnp.float32)
    _raises("SP0931", lambda: call(scale_add, (3,), x, y, out_shapes={"nope": s}, n=N, alpha=1.0),
            "out_shapes names `nope`, which is no parameter of `scale_add`")
    _raises("SP0931", lambda: call(scale_add, (3,), x, y, out_shapes=[np.zeros(3)], n=N, alpha=1.0),
            "the output for `out` must be a jax.ShapeDtypeStruct, got ndarray")
    _raises("SP0931", lambda: call(scale_add, (3,), x, y, 1, 2.0, 4, out_shapes=[s, s]),
            "`scale_add` has 6 parameters; 5 arguments and 2 outputs do not fit")


def test_traced_scalar_is_refused() -> None:
    x, y = _inputs()
    s = jax.ShapeDtypeStruct((N,), jnp.float32)
    with pytest.raises(JaxCallError) as info:
        jax.jit(lambda a, b, n: call(scale_add, (3,), a, b, out_shapes=s, n=n, alpha=1.0))(x, y, N)
    assert info.value.code == "SP0932"
    assert info.value.message.startswith("`n` is a scalar parameter of `scale_add`, but got a traced array")
    _raises("SP0932", lambda: call(scale_add, (3,), x, y, out_shapes=s, n=N, alpha=1.0, BLOCK=jnp.int32(128)),
            "`BLOCK` is a constexpr parameter of `scale_add`, but got a jax array")  # (concrete: not "traced")
    _raises("SP0932", lambda: call(scale_add, (3,), x, y, out_shapes=s, n=N, alpha=np.asarray(1.0)),
            "`alpha` is a scalar parameter of `scale_add`, but got a numpy array")  # (was "got a array")
    _raises("SP0932", lambda: call(scale_add, (3,), [1.0] * N, y, out_shapes=s, n=N, alpha=1.0),
            "`x` got a list; a sparsile kernel takes arrays and numbers")


def test_writing_an_input_is_refused_at_trace_time() -> None:
    x, _ = _inputs(64)
    _raises("SP0933", lambda: call(writes_x, (1,), x, out_shapes=jax.ShapeDtypeStruct((64,), jnp.float32), n=64),
            "`writes_x` writes `x`, which is an input of this call")
    s = jax.ShapeDtypeStruct((64,), jnp.float32)
    _raises("SP0933", lambda: call(writes_x, (1,), x, out_shapes=s, n=64, input_output_aliases={3: 0}),
            "input_output_aliases {3: 0} names no array argument or no output")
    _raises("SP0933", lambda: call(writes_x, (1,), x, out_shapes=jax.ShapeDtypeStruct((32,), jnp.float32), n=64,
                                   input_output_aliases={0: 0}),
            "input_output_aliases {0: 0}: the input is (64,) float32 but the output is (32,) float32")


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
@pytest.mark.parametrize("grid", [(0,), (0, 1), lambda meta: (sp.cdiv(0, meta["BLOCK"]),)])
def test_an_empty_grid_runs_no_program(interpret: bool, grid: object) -> None:
    """An empty batch (a grid with a 0 dimension) runs nothing: the output is as the call made it
    before the kernel would run (poisoned on the CPU paths); the next call is an ordinary one."""
    x, y = _inputs()
    out = call(scale_add, grid, x, y, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=0, alpha=1.5,
               interpret=interpret)
    assert np.isnan(np.asarray(out)).all()
    got = np.asarray(_scale_add(x, y, interpret))
    _within_f32_rounding(got, 1.5 * x.astype(np.float64) + y, 1.5 * np.abs(x.astype(np.float64)) + y)


def test_an_empty_grid_still_checks_the_arguments_at_trace_time() -> None:
    x, y = _inputs()
    with pytest.raises(sp.LaunchError) as info:
        call(scale_add, (0,), x.astype(np.float16), y, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=0,
             alpha=1.0)
    assert "error[SP0703]: argument `x` expects a pointer to f32, found an array of f16" in str(info.value)
    with pytest.raises(sp.LaunchError) as info:
        call(scale_add, (0,), x, y, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=0)
    assert "error[SP0701]: `scale_add` is missing the argument `alpha`" in str(info.value)


def test_kernel_type_errors_surface_at_trace_time() -> None:
    x, y = _inputs()
    with pytest.raises(sp.LaunchError) as info:
        call(scale_add, (3,), x.astype(np.float16), y, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=N,
             alpha=1.0)
    assert "error[SP0703]: argument `x` expects a pointer to f32, found an array of f16" in str(info.value)
    with pytest.raises(sp.LaunchError) as grid:
        call(scale_add, (-1,), x, y, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=N, alpha=1.0)
    assert "error[SP0710]: a grid dimension cannot be negative, found (-1,)" in str(grid.value)
    with pytest.raises(sp.LaunchError) as unknown:
        call(scale_add, (3,), x, y, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=N, alpha=1.0, nope=1)
    assert "error[SP0702]: `scale_add` has no parameter named `nope`" in str(unknown.value)
    with pytest.raises(sp.LaunchError) as missing:
        call(scale_add, (3,), x, y, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=N)
    assert "error[SP0701]: `scale_add` is missing the argument `alpha`" in str(missing.value)


def test_autodiff_and_vmap_are_refused() -> None:
    x, y = _inputs()
    e = _raises("SP0934", lambda: jax.grad(lambda a: _scale_add(a, y).sum())(x),
                "a sparsile kernel call cannot be differentiated")
    assert "custom_vjp" in e.help
    _raises("SP0935", lambda: jax.vmap(lambda a: _scale_add(a, y))(np.stack([x, x])),
            "jax.vmap cannot batch a sparsile kernel call")


def test_run_time_failure_becomes_an_xla_error() -> None:
    x = np.ones(16, np.float32)  # the kernel reads 64 elements without a mask
    with pytest.raises(Exception) as info:
        np.asarray(jax.jit(lambda a: call(unmasked, (1,), a, out_shapes=jax.ShapeDtypeStruct((64,), jnp.float32)))(x))
    text = str(info.value)
    assert "error[SP0936]: a sparsile kernel call failed while XLA ran it" in text
    assert "out of bounds" in text.lower() or "outside" in text.lower()


# ------------------------------------------------------------------------------------------------
# the import


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, timeout=120)


def test_import_sparsile_does_not_import_jax_and_missing_jax_is_sp0930() -> None:
    r = _python("import sys, sparsile; assert 'jax' not in sys.modules; import sparsile.jax as j; "
                "assert j.call is sparsile.jax.call; print('ok')")
    assert r.stdout.strip() == "ok", r.stderr
    r = _python("import sys; sys.modules['jax'] = None\nimport sparsile\ntry:\n import sparsile.jax\n"
                "except ModuleNotFoundError as e:\n print(e.code, e.message)\n print(str(e).splitlines()[1])")
    assert r.stdout.splitlines() == ["SP0930 sparsile.jax needs JAX, which is not installed",
                                     " = help: install jax>=0.4.36: `pip install -e '.[jax]'` in the sparsile "
                                     "checkout, or `pip install 'jax>=0.4.36'`"], r.stderr


SHIFT = 1.0


@sp.jit
def add_shift(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 64):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, sp.load(x + offs, mask=mask) + SHIFT, mask=mask)


def test_a_changed_captured_global_is_another_plan() -> None:
    """The plan registry keeps the first plan of a number (its launcher stays what a native record
    launches), so a @jit kernel's captured global must be part of the number: a changed SHIFT is a
    new plan, and its calls see the new value."""
    global SHIFT
    from sparsile.integrations.jax import ffi

    x = np.linspace(-1.0, 1.0, 50, dtype=np.float32)
    shape = jax.ShapeDtypeStruct((50,), jnp.float32)
    before = set(ffi._plans)
    try:
        first = np.asarray(call(add_shift, (1,), jnp.asarray(x), out_shapes=shape, n=50))
        SHIFT = 3.0
        second = np.asarray(call(add_shift, (1,), jnp.asarray(x), out_shapes=shape, n=50))
    finally:
        SHIFT = 1.0
    np.testing.assert_array_equal(first, x + np.float32(1.0))
    np.testing.assert_array_equal(second, x + np.float32(3.0))
    assert len(set(ffi._plans) - before) == 2


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_a_traced_program_runs_with_the_globals_it_was_traced_with(interpret: bool) -> None:
    """A jitted program is not traced again when a global a @jit kernel captured changes; its GPU
    launcher (built at lowering, launched by the native handler without Python) keeps the traced
    value, so the CPU handler and the interpret=True callback must too (they re-ran the interpreter
    with the new value: one traced program computed two things). A new trace sees the new value."""
    global SHIFT
    x = np.linspace(-1.0, 1.0, 50, dtype=np.float32)
    shape = jax.ShapeDtypeStruct((50,), jnp.float32)

    def f(a: jax.Array) -> jax.Array:
        return call(add_shift, (1,), a, out_shapes=shape, n=50, interpret=interpret)

    jitted = jax.jit(f)
    try:
        first = np.asarray(jitted(jnp.asarray(x)))
        SHIFT = 3.0
        again = np.asarray(jitted(jnp.asarray(x)))
        retraced = np.asarray(jax.jit(lambda a: f(a))(jnp.asarray(x)))  # (jax.jit(f) shares f's trace cache)
    finally:
        SHIFT = 1.0
    np.testing.assert_array_equal(first, x + np.float32(1.0))
    np.testing.assert_array_equal(again, x + np.float32(1.0))
    np.testing.assert_array_equal(retraced, x + np.float32(3.0))


def test_a_launcher_is_not_built_for_a_plan_whose_globals_changed() -> None:
    """The GPU side of the rule above, without a GPU: a plan's launcher (built at lowering, and for each
    further device the handler meets) is refused once a captured global differs from the traced value
    (SP0735: compiling now would launch the new value under the old trace), and built again once the
    value is back."""
    global SHIFT
    from sparsile.driver import launch
    from sparsile.frontend.diagnostics import LaunchError
    from sparsile.integrations.jax import ffi

    shape = jax.ShapeDtypeStruct((40,), jnp.float32)  # (a plan of its own: no other test calls it this way)
    before = set(ffi._plans)
    call(add_shift, (1,), jnp.asarray(np.ones(40, np.float32)), out_shapes=shape, n=40)
    (number,) = set(ffi._plans) - before
    plan = ffi._plans[number]
    built: list[object] = []
    with pytest.MonkeyPatch.context() as mp:
        from sparsile.backend import runtime

        mp.setattr(launch, "_build_launcher", lambda *a, **k: built.append(a) or type("L", (), {"spec": None})())
        mp.setattr(runtime, "current_device", lambda ordinal=None: type("D", (), {"compute_capability": (9, 0)})())
        mp.setattr(importlib.import_module("sparsile.integrations.jax.plan"), "needs_info", lambda spec: set())
        try:
            SHIFT = 2.0
            with pytest.raises(LaunchError) as info:
                plan.launcher(5)
        finally:
            SHIFT = 1.0
        assert info.value.code == "SP0735"
        assert "changed after this sparsile.jax.call was traced" in info.value.message
        assert "trace the program again" in info.value.help
        assert not built
        try:
            plan.launcher(5)
            assert len(built) == 1
        finally:  # the fake launcher leaves with the fakes (another test lists every plan's launchers)
            getattr(plan, "_launchers", {}).pop(5, None)


@pytest.mark.parametrize("dtype", [np.longdouble, object, "U3"])
def test_a_numpy_array_of_a_type_jax_has_no_buffer_for_is_a_diagnostic(dtype) -> None:
    """numpy arrays are handed to JAX as the buffer it makes of them (float64 as float32 without x64);
    one of a type JAX holds no buffer of (long double, objects, strings) stopped at JAX's TypeError
    ("Error interpreting argument to stage as a JAX value") instead of sparsile's diagnostic."""

    @sp.jit
    def copy(x, out, BLOCK: sp.constexpr = 8):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(x + offs))

    a = np.arange(8).astype(dtype)
    with pytest.raises(Exception, match=r"error\[SP07\d\d\]") as info:
        call(copy, (1,), a, out_shapes=jax.ShapeDtypeStruct((8,), jnp.float32))
    assert not isinstance(info.value, TypeError)


def _plain_scale_add(x, y, out, n, alpha):  # (not decorated: what a call forgetting @sparsile.jit passes)
    pass


@pytest.mark.parametrize(("kernel", "what"), [
    (_plain_scale_add, "the function `_plain_scale_add`"),
    (sp.autotune(configs=[sp.Config({"BLOCK": 64})], key=["n"])(scale_add), "an autotuned kernel (`scale_add`)"),
    ("scale_add", "a str"),
])
def test_a_kernel_argument_that_is_no_kernel_is_sp0932(kernel: object, what: str) -> None:
    # a function without @sparsile.jit was AttributeError: 'function' object has no attribute 'params'
    x = jnp.ones(8, jnp.float32)
    with pytest.raises(JaxCallError) as info:
        call(kernel, (1,), x, x, n=8, alpha=1.0, out_shapes=jax.ShapeDtypeStruct((8,), jnp.float32))
    assert info.value.code == "SP0932"
    assert info.value.message.startswith(f"call takes a sparsile kernel (@sparsile.jit, or one of a .spk module), "
                                         f"got {what}")


def test_the_call_s_own_arguments_of_the_wrong_kind_are_diagnostics() -> None:
    """call's own keywords of the wrong kind were Python's or jax's errors from inside call:
    out_shapes=None a TypeError ('NoneType' object is not iterable), input_output_aliases as pairs an
    AttributeError, constexprs as a list a TypeError, a traced interpret jax's
    TracerBoolConversionError; interpret="no" turned the interpreter on (as sparse_linear's did)."""
    from sparsile.stdlib.sparsity import SparsityError

    x, y = _inputs()
    s = jax.ShapeDtypeStruct((N,), jnp.float32)
    _raises("SP0931", lambda: call(scale_add, (3,), x, y, out_shapes=None, n=N, alpha=1.0),
            "out_shapes must be a jax.ShapeDtypeStruct, a sequence of them or a mapping {parameter name: struct}, "
            "got NoneType")
    _raises("SP0933", lambda: call(scale_add, (3,), x, y, out_shapes=s, n=N, alpha=1.0, input_output_aliases=[(0, 0)]),
            "input_output_aliases must be a mapping {input index: output index}, got list")
    _raises("SP0932", lambda: call(scale_add, (3,), x, y, out_shapes=s, n=N, alpha=1.0, constexprs=[("BLOCK", 128)]),
            "constexprs must be a mapping {parameter name: value}, got list")
    _raises("SP0932", lambda: jax.jit(lambda a, i: call(scale_add, (3,), a, y, out_shapes=s, n=N, alpha=1.0,
                                                        interpret=i))(x, True),
            "interpret of call is static, but got a traced value")
    with pytest.raises(SparsityError) as info:
        call(scale_add, (3,), x, y, out_shapes=s, n=N, alpha=1.0, interpret="no")
    assert (info.value.code, info.value.message) == ("SP0804", "interpret must be True or False, got 'no'")
    np.testing.assert_array_equal(np.asarray(call(scale_add, (3,), x, y, out_shapes=s, n=N, alpha=1.5,
                                                  interpret=np.bool_(True))),
                                  np.asarray(_scale_add(x, y)))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_shape_struct_given_as_an_input_is_refused_while_tracing(jit: bool) -> None:
    """A jax.ShapeDtypeStruct passed for an input parameter (for out_shapes' sake) was taken as a
    static value: the call traced, and XLA's run failed in the interpreter with a Python traceback
    inside SP0936 (float() argument must be ... not 'ShapeDtypeStruct'); on a GPU the launcher got it
    for a pointer. It is SP0932 while tracing, as any array-like that is neither a jax nor a numpy array."""
    _, y = _inputs()
    s = jax.ShapeDtypeStruct((N,), jnp.float32)

    def run() -> jax.Array:
        return call(scale_add, (3,), s, y, out_shapes=s, n=N, alpha=1.0)

    err = _raises("SP0932", jax.jit(run) if jit else run,
                  "`x` got a jax.ShapeDtypeStruct, which describes an array but holds no data")
    assert "out_shapes" in err.help


@pytest.mark.parametrize("dtype", ["complex64", "int4"])
def test_an_array_of_a_type_sparsile_has_no_element_type_for_names_the_type(dtype: str) -> None:
    """A jax array of an element type sparsile has no type for (complex64, int4) was SP0708 "found
    _Stand": the name of call's internal stand-in, not what was passed."""

    @sp.jit
    def copy(x, out, BLOCK: sp.constexpr = 8):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(x + offs))

    from sparsile.frontend.diagnostics import LaunchError

    a = jnp.zeros(8, dtype)
    with pytest.raises(LaunchError) as info:
        jax.jit(lambda a: call(copy, (1,), a, out_shapes=jax.ShapeDtypeStruct((8,), jnp.float32)))(a)
    assert str(info.value).splitlines()[0] == (f"error[SP0708]: argument `x` expects an array (pointer), found an "
                                               f"array of {dtype}, which has no sparsile element type")


def test_a_grid_function_looking_up_a_missing_name_is_sp0710() -> None:
    x, y = _inputs()
    with pytest.raises(sp.LaunchError) as info:
        call(scale_add, lambda meta: (sp.cdiv(N, meta["BLOCK_SIZE"]),), x, y,
             out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=N, alpha=1.0)
    assert info.value.code == "SP0710"
    assert info.value.message == ("the grid function of `scale_add` looks up `BLOCK_SIZE`, which is not an argument "
                                  "of the call")
    assert info.value.help.startswith("the grid function is given ")
    assert "`n`" in info.value.help and "`alpha`" in info.value.help and info.value.help.endswith(
        "did you mean `BLOCK`?")
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_a_grid_function_is_given_every_argument(interpret: bool) -> None:
    """As on the other launch paths (docs/language.md): scalars by value, arrays with their shape; it
    was given the constexprs only (meta["n"] was SP0710 here)."""
    x, y = _inputs()
    seen = {}

    def grid(meta):
        seen.update(meta)
        return (sp.cdiv(meta["n"], meta["BLOCK"]),)

    got = np.asarray(call(scale_add, grid, x, y, out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=N, alpha=1.5,
                          interpret=interpret), np.float64)
    assert seen["n"] == N and seen["alpha"] == 1.5 and seen["BLOCK"] == 128 and tuple(seen["x"].shape) == (N,)
    _within_f32_rounding(got, 1.5 * x.astype(np.float64) + y, 1.5 * np.abs(x.astype(np.float64)) + y)


def test_a_tensor_of_a_type_sparsile_has_no_element_type_for_names_the_type() -> None:
    """The tensor branch of SP0708 said "found _Stand" (call's internal stand-in) for such an array."""

    @sp.jit
    def copy_t(t: sp.tensor[sp.f32, 1], out, BLOCK: sp.constexpr = 8):
        sp.store(out + sp.arange(0, BLOCK), t.load_tile((0,), (BLOCK,)))

    with pytest.raises(sp.LaunchError) as info:
        call(copy_t, (1,), jnp.zeros(8, "complex64"), out_shapes=jax.ShapeDtypeStruct((8,), jnp.float32))
    assert str(info.value).splitlines()[0] == ("error[SP0708]: argument `t` expects a tensor, found an array of "
                                               "complex64, which has no sparsile element type")


@sp.jit
def copy_wide(x: sp.ptr[sp.f64], out: sp.ptr[sp.f64], ix: sp.ptr[sp.i64], iout: sp.ptr[sp.i64],
              BLOCK: sp.constexpr = 8):
    offs = sp.arange(0, BLOCK)
    sp.store(out + offs, sp.load(x + offs) * 3.0)
    sp.store(iout + offs, sp.load(ix + offs) * 3)


def _wide_call(x: object, ix: object) -> object:
    return call(copy_wide, (1,), x, out_shapes={"out": jax.ShapeDtypeStruct((8,), jnp.float64),
                                                "iout": jax.ShapeDtypeStruct((8,), jnp.int64)}, ix=ix)


def _enable_x64():  # (jax.enable_x64 since 0.7; jax.experimental.enable_x64 before)
    enable = getattr(jax, "enable_x64", None)
    if enable is not None:
        return enable(True)
    from jax.experimental import enable_x64

    return enable_x64()


X64_HELP = ("JAX holds 64-bit arrays as 32-bit ones unless x64 is enabled: jax.config.update(\"jax_enable_x64\", "
            "True) before creating the arrays (docs/jax.md)")


@pytest.mark.parametrize("make", [np.asarray, jnp.asarray], ids=["numpy", "jax"])
def test_a_64_bit_array_without_x64_says_to_enable_it(make) -> None:
    """Without x64, JAX makes a numpy f64 array f32 (and i64 i32): the kernel's f64 parameter then
    reported SP0703 "found an array of f32" without saying why."""
    assert not jax.config.jax_enable_x64
    x, ix = np.linspace(-1.0, 1.0, 8), np.arange(-4, 4, dtype=np.int64)
    with warnings.catch_warnings():  # (jnp.asarray warns that it truncates, once)
        warnings.simplefilter("ignore")
        arrays = make(x), make(ix)
    with pytest.raises(sp.LaunchError) as info:
        _wide_call(*arrays)
    assert info.value.code == "SP0703"
    assert info.value.message == "argument `x` expects a pointer to f64, found an array of f32"
    assert info.value.help == f"convert the array to f64 before the call; {X64_HELP}"
    with pytest.raises(sp.LaunchError) as info:  # an f32 array itself: converting it needs x64 as well
        _wide_call(jnp.ones(8, jnp.float32), ix)
    assert info.value.message == "argument `x` expects a pointer to f64, found an array of f32"
    assert info.value.help == f"convert the array to f64 before the call; {X64_HELP}"


def test_an_integer_64_bit_array_without_x64_says_to_enable_it() -> None:
    with _enable_x64():
        x = jnp.asarray(np.linspace(-1.0, 1.0, 8))
    with pytest.raises(sp.LaunchError) as info:
        _wide_call(x, np.arange(-4, 4, dtype=np.int64))
    assert info.value.message == "argument `ix` expects a pointer to i64, found an array of i32"
    assert info.value.help == f"convert the array to i64 before the call; {X64_HELP}"


def test_a_32_bit_array_for_a_32_bit_mismatch_gets_no_x64_help() -> None:
    with pytest.raises(sp.LaunchError) as info:
        call(scale_add, (1,), np.zeros(N, np.int32), np.zeros(N, np.float32),
             out_shapes=jax.ShapeDtypeStruct((N,), jnp.float32), n=N, alpha=1.0)
    assert info.value.message == "argument `x` expects a pointer to f32, found an array of i32"
    assert info.value.help == "convert the array to f32 before the call"


def test_with_x64_a_64_bit_kernel_runs() -> None:
    x, ix = np.linspace(-1.0, 1.0, 8), np.arange(-4, 4, dtype=np.int64) * 2**40
    with _enable_x64():
        got = _wide_call(x, ix)
        out, iout = np.asarray(got["out"]), np.asarray(got["iout"])
    assert out.dtype == np.float64 and iout.dtype == np.int64
    np.testing.assert_array_equal(out, x * 3.0)  # exact in f64: x * 3.0 is one rounding, as numpy's
    np.testing.assert_array_equal(iout, ix * 3)
