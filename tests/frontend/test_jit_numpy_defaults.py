"""A ``@jit`` kernel's default that is a NumPy scalar, computed (``a: constexpr = np.int8(100)``)
or read (``a=A``, ``a=v``), is the typed constant of its NumPy type wherever the ``def`` is: the
default is Python's value, typed as the same value given at a launch (docs/language.md).

History: a module-level kernel's defaults were evaluated by sema (the call ``np.int8(100)`` the
``i8`` constant, a global ``A = np.int8(100)`` Python's number 100, as a NumPy scalar captured in
the body still is), and a kernel defined in a function or class body took Python's values as
Python's numbers (``np.int8(100)`` gave ``a * a + a`` = 10100, not 116). The same source gave other
types and numbers depending on where it was defined; now both take Python's value
(``k.fn.__defaults__``) and type it as a launch argument.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.ir.printer import print_function
from sparsile.tests.support.jit_source import import_source

ml_dtypes = pytest.importorskip("ml_dtypes")

SOURCE = '''
import ml_dtypes
import numpy as np
import sparsile as sp

A = {value}


@sp.jit
def k(x, out, a: sp.constexpr = {value}):
    i = sp.arange(0, 8)
    c = a * a + a
    sp.store(out + i, sp.load(x + i) + c)


@sp.jit
def k_named(x, out, a: sp.constexpr = A):
    i = sp.arange(0, 8)
    c = a * a + a
    sp.store(out + i, sp.load(x + i) + c)


@sp.jit
def k_global(x, out):
    i = sp.arange(0, 8)
    c = A * A + A
    sp.store(out + i, sp.load(x + i) + c)


def make():
    @sp.jit
    def k(x, out, a: sp.constexpr = {value}):
        i = sp.arange(0, 8)
        c = a * a + a
        sp.store(out + i, sp.load(x + i) + c)

    return k


def make_closure(v):
    @sp.jit
    def k_named(x, out, a: sp.constexpr = v):
        i = sp.arange(0, 8)
        c = a * a + a
        sp.store(out + i, sp.load(x + i) + c)

    @sp.jit
    def k_global(x, out):
        i = sp.arange(0, 8)
        c = v * v + v
        sp.store(out + i, sp.load(x + i) + c)

    return k_named, k_global


class K:
    @staticmethod
    @sp.jit
    def k(x, out, *, a: sp.constexpr = {value}):
        i = sp.arange(0, 8)
        c = a * a + a
        sp.store(out + i, sp.load(x + i) + c)
'''

NUMBERS = [
    "np.int8(100)", "np.int16(300)", "np.int32(70000)", "np.int64(2**40 + 3)",
    "np.uint8(200)", "np.uint16(60000)", "np.uint32(4000000000)", "np.uint64(2**63 + 5)",
    "np.float16(1.1)", "np.float32(1.1)", "np.float64(1.1)", "np.float16(-2.3)",
    "ml_dtypes.bfloat16(1.1)", "ml_dtypes.float8_e4m3fn(1.125)", "ml_dtypes.float8_e5m2(1.25)",
]
"""NumPy scalars of the language's types: ``a * a + a`` wraps (an integer) or rounds (a float) in
the scalar's own type."""


def _reference(value: object) -> float:
    """``a * a + a`` in the type of the NumPy scalar ``value``: integers wrap to its width, floats
    round after each operation (exactly, through float64 and one rounding to the type)."""
    t = type(value)
    if issubclass(t, np.integer):
        bits = np.iinfo(t).bits
        r = (int(value) * int(value) + int(value)) % (1 << bits)
        if np.iinfo(t).min < 0 and r >= 1 << (bits - 1):
            r -= 1 << bits
        return float(r)
    a = np.float64(value)
    return float(t(np.float64(t(a * a)) + a))


def _in_type(t: type, v: float) -> float:
    """``v`` (an exact integer, or a float64) wrapped to integer type ``t``, or rounded once to float type ``t``."""
    if issubclass(t, np.integer):
        bits, r = np.iinfo(t).bits, int(v) % (1 << np.iinfo(t).bits)
        return float(r - (1 << bits) if np.iinfo(t).min < 0 and r >= 1 << (bits - 1) else r)
    return float(t(np.float64(v)))


def _outcome(kernel, x: np.ndarray) -> tuple:
    """("ok", IR text with the kernel named k, output) of compiling and running ``kernel`` on
    ``x``, or ("error", code, message, source text under the span) of what it raises."""
    out = np.full(8, np.nan, np.float32)
    try:
        ir = print_function(kernel.ir(x, np.empty(8, np.float32)))
        kernel.interpret[(1,)](x, out)
    except (sp.CompileError, sp.LaunchError):
        return ("error", *_diagnostic(kernel, x))
    return ("ok", re.sub(r"@\w+\(", "@k(", ir, count=1), out.tobytes())


@pytest.mark.parametrize("value", NUMBERS)
def test_a_computed_numpy_scalar_default_is_typed_as_at_module_level(tmp_path, value: str) -> None:
    module = import_source(SOURCE.format(value=value), tmp_path, "np_default")
    x = np.random.default_rng(53).uniform(-4.0, 4.0, 8).astype(np.float32)
    c = _reference(module.A)
    ref = x.astype(np.float64) + c
    eps = np.finfo(np.float32).eps
    irs = {}
    for where, kernel in {"module": module.k, "nested": module.make(), "class body": module.K.k}.items():
        irs[where] = print_function(kernel.ir(x, np.empty(8, np.float32)))
        out = np.full(8, np.nan, np.float32)
        kernel.interpret[(1,)](x, out)
        assert np.all(np.abs(out - ref) <= 2 * eps * (np.abs(x) + abs(c))), (where, out, ref)
    assert irs["nested"] == irs["module"] and irs["class body"] == irs["module"], irs


@pytest.mark.parametrize("value", NUMBERS)
def test_a_default_that_reads_a_numpy_scalar_is_typed_as_at_a_launch(tmp_path, value: str) -> None:
    # `a=A` (a module global) and `a=v` (a closure variable of the factory): the default is Python's
    # value, the NumPy scalar, typed as the same scalar given at a launch (`k(x, out, a=A)`). It was
    # Python's (untyped) number, as a NumPy scalar captured in the body still is (`A * A + A` in
    # k_global), module level or nested
    module = import_source(SOURCE.format(value=value), tmp_path, "np_read")
    x = np.random.default_rng(54).uniform(-4.0, 4.0, 8).astype(np.float32)
    nested_named, nested_global = module.make_closure(module.A)
    c = _reference(module.A)
    ref = x.astype(np.float64) + c
    for kernel in (module.k_named, nested_named):
        out = np.full(8, np.nan, np.float32)
        kernel.interpret[(1,)](x, out)
        assert np.all(np.abs(out - ref) <= 2 * np.finfo(np.float32).eps * (np.abs(x) + abs(c))), (out, ref)
        given = print_function(kernel.ir(x, np.empty(8, np.float32), a=module.A))
        assert print_function(kernel.ir(x, np.empty(8, np.float32))) == given
    found = _outcome(module.k_global, x)
    assert _outcome(nested_global, x) == found
    if found[0] == "ok":  # the body's capture: the untyped number, Python's arithmetic, then f32 (or a double add)
        a = module.A.item()
        c = float(a * a + a)
        out = np.frombuffer(found[2], np.float32)
        ref = x.astype(np.float64) + c
        assert np.all(np.abs(out - ref) <= 2 * np.finfo(np.float32).eps * (np.abs(x) + abs(c))), (out, ref)


def _diagnostic(kernel, x: np.ndarray) -> tuple[str, str, str]:
    """(code, message, source text under the span) of what compiling ``kernel`` raises."""
    with pytest.raises((sp.CompileError, sp.LaunchError)) as info:
        kernel.ir(x, np.empty(8, np.float32))
    if isinstance(info.value, sp.LaunchError):
        return info.value.code, info.value.message, ""
    d = info.value.diagnostics[0]
    span = d.span
    if span is None or span.line <= 0 or span.end_line != span.line:
        return d.code, d.message, ""
    return d.code, d.message, span.source.text.splitlines()[span.line - 1][span.col - 1:span.end_col - 1]


REFUSED = [
    "np.bool_(True)", "np.complex64(3)", "np.longdouble(2.5)", "np.str_('ab')",
    "np.datetime64('2020-01-01')", "np.timedelta64(3, 's')",
]
"""A NumPy bool used as a number, NumPy scalars the language has no type for, an 8-bit float in
arithmetic: refused with the same diagnostic at module level and nested."""


@pytest.mark.parametrize("value", REFUSED)
def test_a_refused_numpy_scalar_default_is_refused_alike(tmp_path, value: str) -> None:
    module = import_source(SOURCE.format(value=value), tmp_path, "np_refused")
    x = np.ones(8, np.float32)
    found = {where: _diagnostic(kernel, x) for where, kernel in
             {"module": module.k, "nested": module.make(), "class body": module.K.k}.items()}
    assert found["nested"] == found["module"] and found["class body"] == found["module"], found
    if value.startswith("np.bool_"):  # a bool, used as a number: as Python's True would be
        assert found["module"] == ("SP0723", "constexpr argument `a` is the bool True, used as a number here "
                                   "(an operand of `*`)", "a")
    else:  # a NumPy type the language has none for, at the default (was: a nested kernel took
        # Python's value, then SP0723 at the launch or an untyped number; SP0332 'not callable')
        name = value.split("(")[0].removeprefix("np.")
        assert found["module"] == ("SP0302", f"NumPy's `{name}` has no type in the language", value)
    nested_named = module.make_closure(module.A)[0]
    # read (`a=A`, `a=v`): Python's value in both, refused as the computed one, at the name read
    computed, found = found["module"], {"module": _outcome(module.k_named, x), "nested": _outcome(nested_named, x)}
    if value.startswith("np.bool_"):  # the flag True, used as a number at the parameter's use
        assert found["nested"] == found["module"] == ("error", *computed), found
    else:
        assert found == {"module": ("error", "SP0302", f"NumPy's `{name}` has no type in the language", "A"),
                         "nested": ("error", "SP0302", f"NumPy's `{name}` has no type in the language", "v")}

HELPER_SOURCE = '''
import ml_dtypes
import numpy as np
import sparsile as sp


@sp.jit
def h(v, a: sp.constexpr = {value}):
    return v + (a * a + a)


@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    sp.store(out + i, h(sp.load(x + i)))


def make():
    @sp.jit
    def h(v, a: sp.constexpr = {value}):
        return v + (a * a + a)

    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, h(sp.load(x + i)))

    return k
'''


@pytest.mark.parametrize("value", NUMBERS)
def test_a_helpers_numpy_scalar_default_is_typed_as_at_module_level(tmp_path, value: str) -> None:
    # an inlined helper's default: the same typed constant, module level or nested
    module = import_source(HELPER_SOURCE.format(value=value), tmp_path, "np_helper")
    x = np.random.default_rng(55).uniform(-4.0, 4.0, 8).astype(np.float32)
    c = _reference(eval(value, {"np": np, "ml_dtypes": ml_dtypes}))
    ref = x.astype(np.float64) + c
    eps = np.finfo(np.float32).eps
    irs = []
    for kernel in (module.k, module.make()):
        out = np.full(8, np.nan, np.float32)
        kernel.interpret[(1,)](x, out)
        assert np.all(np.abs(out - ref) <= 2 * eps * (np.abs(x) + abs(c))), (out, ref)
        irs.append(print_function(kernel.ir(x, np.empty(8, np.float32))))
    assert irs[0] == irs[1]


@pytest.mark.parametrize("value", REFUSED[1:])
def test_a_helpers_refused_numpy_scalar_default_is_refused_alike(tmp_path, value: str) -> None:
    module = import_source(HELPER_SOURCE.format(value=value), tmp_path, "np_helper_refused")
    x = np.ones(8, np.float32)
    name = value.split("(")[0].removeprefix("np.")
    for kernel in (module.k, module.make()):
        assert _diagnostic(kernel, x) == ("SP0302", f"NumPy's `{name}` has no type in the language", value)


RUN_TIME_SOURCE = '''
import numpy as np
import sparsile as sp


@sp.jit
def k(x, out, {param}):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * a)


def make():
    @sp.jit
    def k(x, out, {param}):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * a)

    return k
'''


@pytest.mark.parametrize(("param", "typed"), [("a=sp.u8(7)", "u8(7)"), ("a: sp.f32 = sp.f16(1.5)", "f16(1.5)")])
def test_a_typed_default_of_a_run_time_parameter_is_refused_alike(tmp_path, param: str, typed: str) -> None:
    # a typed constant is no run-time argument (`k(x, out, sp.u8(7))` is SP0708 too): it was SP0708 at
    # the launch, "found Const" (sema's class) at module level, and a nested kernel took it as an
    # untyped f32 / i32 argument
    module = import_source(RUN_TIME_SOURCE.format(param=param), tmp_path, "np_run_time")
    x = np.ones(8, np.float32)
    default = param.split("=", 1)[1].strip()
    for kernel in (module.k, module.make()):
        code, message, at = _diagnostic(kernel, x)
        assert (code, message, at) == ("SP0708", f"the default of run-time parameter `a` is the typed constant {typed}",
                                       default)
        with pytest.raises(sp.CompileError) as info:
            kernel.interpret[(1,)](x, np.full(8, np.nan, np.float32))
        assert "sp.constexpr" in info.value.diagnostics[0].help


@pytest.mark.parametrize(("param", "value"), [("a=np.float16(1.5)", np.float16(1.5)),
                                              ("a: sp.f32 = np.int8(3)", np.int8(3)),
                                              ("a=np.int8(-7) // 2", np.int8(-4)),
                                              ("a=np.float64(0.1)", np.float64(0.1))])
def test_a_numpy_scalar_default_of_a_run_time_parameter_is_the_launch_argument(tmp_path, param: str,
                                                                              value: np.generic) -> None:
    # the default is what the same scalar given at a launch is: a scalar of its own type (f16, f64,
    # i8) or the annotation's (f32). It was SP0708 "the default of run-time parameter `a` is the
    # typed constant f16(1.5)" (np.int8(-7) // 2 only at module level: nested, Python's number)
    module = import_source(RUN_TIME_SOURCE.format(param=param), tmp_path, "np_run_time_scalar")
    x = np.random.default_rng(62).uniform(-4.0, 4.0, 8).astype(np.float32)
    for kernel in (module.k, module.make()):
        outs, irs = [], []
        for args in ((), (value,)):
            out = np.full(8, np.nan, np.float32)
            kernel.interpret[(1,)](x, out, *args)
            outs.append(out)
            irs.append(print_function(kernel.ir(x, out, *args)))
        np.testing.assert_array_equal(outs[0], outs[1])
        assert irs[0] == irs[1]
        # f32 * f16 / i8 is f32, f32 * f64 is f64 (stored to f32), as NumPy promotes; annotated: f32
        dtype = np.dtype(np.float32) if "sp.f32" in param else np.result_type(np.float32, value)
        ref = (x.astype(dtype) * np.asarray(value, dtype)).astype(np.float32)
        np.testing.assert_array_equal(outs[0], ref)


def test_a_numpy_timedelta_argument_is_refused_with_a_diagnostic(tmp_path) -> None:
    # np.timedelta64 is an np.integer that int() refuses: a Python TypeError escaped the launch
    module = import_source(RUN_TIME_SOURCE.format(param="a") + CONSTEXPR_SOURCE, tmp_path, "np_timedelta")
    x = np.ones(8, np.float32)
    out = np.full(8, np.nan, np.float32)
    with pytest.raises(sp.LaunchError) as info:
        module.k.interpret[(1,)](x, out, np.timedelta64(3, "s"))
    assert (info.value.code, info.value.message) == (
        "SP0708", "argument `a` is NumPy's `timedelta64`, which has no type in the language")
    assert info.value.help.startswith("the language's NumPy scalars are np.bool_")
    with pytest.raises(sp.LaunchError) as info:
        module.kc.interpret[(1,)](x, out, a=np.timedelta64(3, "s"))
    assert (info.value.code, info.value.message) == (
        "SP0723", "constexpr argument `a` is NumPy's `timedelta64`, which has no type in the language")
    assert np.isnan(out).all()


CONSTEXPR_SOURCE = '''

@sp.jit
def kc(x, out, a: sp.constexpr):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * a)
'''


TUPLE_SOURCE = '''
import numpy as np
import sparsile as sp


@sp.jit
def k(x, out, a: sp.constexpr = {value}):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) + (a[0] * a[0] + a[0]) + a[1])


def make():
    @sp.jit
    def k(x, out, a: sp.constexpr = {value}):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) + (a[0] * a[0] + a[0]) + a[1])

    return k
'''


@pytest.mark.parametrize("value", ["(np.int8(100), 3)", "[np.uint16(60000), 3]", "(np.float16(1.1), 0.75)"])
def test_a_tuple_of_computed_numpy_scalars_is_typed_alike(tmp_path, value: str) -> None:
    # element by element, as sema evaluates the tuple at module level
    module = import_source(TUPLE_SOURCE.format(value=value), tmp_path, "np_tuple")
    x = np.random.default_rng(56).uniform(-4.0, 4.0, 8).astype(np.float32)
    first, second = eval(value, {"np": np})
    c = _in_type(type(first), _reference(first) + float(second))  # `+ a[1]` in a[0]'s type too
    ref = x.astype(np.float64) + c
    irs = []
    for kernel in (module.k, module.make()):
        out = np.full(8, np.nan, np.float32)
        kernel.interpret[(1,)](x, out)
        assert np.all(np.abs(out - ref) <= 3 * np.finfo(np.float32).eps * (np.abs(x) + abs(c))), (out, ref)
        irs.append(print_function(kernel.ir(x, np.empty(8, np.float32))))
    assert irs[0] == irs[1]


FLAG_SOURCE = '''
import numpy as np
import sparsile as sp


@sp.jit
def k(x, out, a: sp.constexpr = {value}):
    i = sp.arange(0, 8)
    v = sp.load(x + i)
    if a:
        v = v * 3.0
    sp.store(out + i, v)


def make():
    @sp.jit
    def k(x, out, a: sp.constexpr = {value}):
        i = sp.arange(0, 8)
        v = sp.load(x + i)
        if a:
            v = v * 3.0
        sp.store(out + i, v)

    return k
'''


@pytest.mark.parametrize("value", ["np.bool_(True)", "np.bool_(False)"])
def test_a_numpy_bool_default_is_the_same_flag(tmp_path, value: str) -> None:
    module = import_source(FLAG_SOURCE.format(value=value), tmp_path, "np_flag")
    x = np.random.default_rng(57).uniform(-4.0, 4.0, 8).astype(np.float32)
    ref = x.astype(np.float64) * (3.0 if "True" in value else 1.0)
    irs = []
    for kernel in (module.k, module.make()):
        out = np.full(8, np.nan, np.float32)
        kernel.interpret[(1,)](x, out)
        assert np.all(np.abs(out - ref) <= np.finfo(np.float32).eps * np.abs(ref)), (out, ref)
        irs.append(print_function(kernel.ir(x, np.empty(8, np.float32))))
    assert irs[0] == irs[1]
