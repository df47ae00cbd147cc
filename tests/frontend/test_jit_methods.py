"""``@sparsile.jit`` in a class body.

A kernel's parameters are all launch arguments, and a ``Kernel`` is no descriptor: ``K.kern`` and
``K().kern`` are the same kernel, never bound to an instance. So a kernel without ``self`` in a
class works as a static function (with or without ``@staticmethod``, stacked above or below
``@sparsile.jit``), and one that takes ``self`` (or is a classmethod, or a bound method) is SP0249
when it is decorated: before, it was SP0701 "`kern` is missing the argument `n`" at the launch,
since nothing passed ``self``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import pytest

import sparsile as sp

N = 20


def _where(test: Callable[..., object], needle: str, nth: int = 0) -> tuple[int, int]:
    """(file line, 1-based column) of the ``nth`` occurrence of ``needle`` in ``test``'s source."""
    lines, first = inspect.getsourcelines(test)
    hits = [(first + i, ln.index(needle) + 1) for i, ln in enumerate(lines) if needle in ln]
    return hits[nth]


def _method_error(define: Callable[[], object]) -> sp.CompileError:
    with pytest.raises(sp.CompileError) as info:
        define()
    assert len(info.value.diagnostics) == 1
    return info.value


def _check_add(kernel: object) -> None:
    x = np.arange(N, dtype=np.float32)
    out = np.zeros(32, np.float32)
    kernel.interpret[(1,)](x, out, N)  # type: ignore[attr-defined]
    assert np.array_equal(out[:N], x + 1) and np.all(out[N:] == 0)


# ------------------------------------------------------------------------------------ SP0249
def test_a_kernel_taking_self_is_reported_when_decorated() -> None:
    def define() -> object:
        class K:
            @sp.jit
            def add(self, x, out, n, BLOCK: sp.constexpr = 32):
                offs = sp.arange(0, BLOCK)
                sp.store(out + offs, sp.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)
        return K

    e = _method_error(define)
    d = e.diagnostics[0]
    assert d.code == "SP0249"
    assert d.message == ("`K.add` is a method: a kernel cannot take `self`, since every parameter of a kernel is "
                         "a launch argument")
    assert d.help == ("define `add` at module level, or make it a @staticmethod (above or below @sparsile.jit) "
                      "without `self`, and pass what it reads from `self` as arguments")
    line, col = _where(test_a_kernel_taking_self_is_reported_when_decorated, "self, x")
    assert (d.span.file_line, d.span.file_col, d.span.end_col - d.span.col) == (line, col, len("self"))
    assert f"test_jit_methods.py:{line}:{col}" in str(e)


def test_a_nested_class_is_named_from_its_outermost_class() -> None:
    def define() -> object:
        class Outer:
            class Inner:
                @sp.jit(num_warps=8)
                def fill(self, out):
                    sp.store(out + sp.arange(0, 16), sp.full((16,), 1.0, sp.f32))
        return Outer

    d = _method_error(define).diagnostics[0]
    assert (d.code, d.message) == ("SP0249", "`Outer.Inner.fill` is a method: a kernel cannot take `self`, since "
                                             "every parameter of a kernel is a launch argument")
    line, col = _where(test_a_nested_class_is_named_from_its_outermost_class, "self, out")
    assert (d.span.file_line, d.span.file_col) == (line, col)


@pytest.mark.parametrize("order", ["classmethod above", "classmethod below"])
def test_a_classmethod_kernel_is_reported(order: str) -> None:
    def above() -> object:
        class K:
            @classmethod
            @sp.jit
            def fill(cls, out):
                sp.store(out + sp.arange(0, 16), sp.full((16,), 1.0, sp.f32))
        return K

    def below() -> object:
        class K:
            @sp.jit
            @classmethod
            def fill(cls, out):
                sp.store(out + sp.arange(0, 16), sp.full((16,), 1.0, sp.f32))
        return K

    d = _method_error(above if order == "classmethod above" else below).diagnostics[0]
    assert d.code == "SP0249"
    assert d.message == ("`K.fill` is a classmethod: a kernel cannot take the class, since every parameter of a "
                         "kernel is a launch argument")
    assert d.help == ("define `fill` at module level, or make it a @staticmethod (above or below @sparsile.jit) "
                      "without `cls`, and pass what it reads from `cls` as arguments")
    line, col = _where(test_a_classmethod_kernel_is_reported, "cls, out", 0 if order == "classmethod above" else 1)
    assert (d.span.file_line, d.span.file_col, d.span.end_col - d.span.col) == (line, col, len("cls"))


def test_a_classmethod_without_cls_is_reported_at_its_decorator() -> None:
    """`@classmethod` over `@sparsile.jit` on a function without `cls`: Python would bind the class
    to the kernel (`K.fill[grid]` is then "'method' object is not subscriptable")."""
    def define() -> object:
        class K:
            @classmethod
            @sp.jit
            def fill(out):
                sp.store(out + sp.arange(0, 16), sp.full((16,), 1.0, sp.f32))
        return K

    d = _method_error(define).diagnostics[0]
    assert d.code == "SP0249"
    assert d.message == ("`K.fill` is a classmethod: a kernel cannot take the class, since every parameter of a "
                         "kernel is a launch argument")
    assert d.help == "define `fill` at module level, or make it a @staticmethod (above or below @sparsile.jit)"
    line, col = _where(test_a_classmethod_without_cls_is_reported_at_its_decorator, "classmethod", 2)
    assert (d.span.file_line, d.span.file_col, d.span.end_col - d.span.col) == (line, col, len("classmethod"))


def test_a_bound_method_is_reported() -> None:
    class Holder:
        def add(self, x, out, n, BLOCK: sp.constexpr = 32):
            offs = sp.arange(0, BLOCK)
            sp.store(out + offs, sp.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

    d = _method_error(lambda: sp.jit(Holder().add)).diagnostics[0]
    assert d.code == "SP0249"
    assert d.message == ("`Holder.add` is a bound method: a kernel cannot take the instance it is bound to, since "
                         "every parameter of a kernel is a launch argument")
    line, col = _where(test_a_bound_method_is_reported, "self, x")
    assert (d.span.file_line, d.span.file_col) == (line, col)


def test_a_method_without_source_is_still_named_as_a_method() -> None:
    """Without a source file (the code is exec'd) the method is reported, without a span, rather
    than SP0241 "cannot read the source"."""
    env: dict[str, object] = {"sp": sp}
    with pytest.raises(sp.CompileError) as info:
        exec("class K:\n    @sp.jit\n    def kern(self, out):\n        pass\n", env)
    d = info.value.diagnostics[0]
    assert d.code == "SP0249" and d.message.startswith("`K.kern` is a method: a kernel cannot take `self`")
    assert d.span.line == 0


def test_what_is_no_python_function_is_still_sp0241() -> None:
    """The method check reads the function's code object: a builtin or a partial has none."""
    import functools

    for f in (print, functools.partial(lambda x: x, 1)):
        with pytest.raises(sp.CompileError) as info:
            sp.jit(f)
        assert info.value.diagnostics[0].code == "SP0241"


def test_the_first_parameter_of_a_module_level_kernel_may_be_called_self() -> None:
    """Only a function defined in a class body is a method: elsewhere `self` is a plain name."""
    @sp.jit
    def add(self, out, n, BLOCK: sp.constexpr = 32):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(self + offs, mask=offs < n) + 1.0, mask=offs < n)

    _check_add(add)


# ------------------------------------------------------------------------------------ what works
class Static:
    """Kernels in a class body, each a static function of the class (these two worked before)."""

    @staticmethod
    @sp.jit
    def above(x, out, n, BLOCK: sp.constexpr = 32):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

    @sp.jit
    def plain(x, out, n, BLOCK: sp.constexpr = 32):  # no @staticmethod: the kernel is not bound either
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)


def _stacked_forms() -> type:
    """The forms that were errors before: `@sparsile.jit` (and `@sparsile.autotune`) over
    `@staticmethod` (SP0241 "cannot read the source of `add`: ... got staticmethod", and SP0770
    "sparsile.autotune wraps a kernel")."""

    class Stacked:
        @sp.jit
        @staticmethod
        def below(x, out, n, BLOCK: sp.constexpr = 32):
            offs = sp.arange(0, BLOCK)
            sp.store(out + offs, sp.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

        @sp.jit(num_warps=8)
        @staticmethod
        def below_with_options(x, out, n, BLOCK: sp.constexpr = 32):
            offs = sp.arange(0, BLOCK)
            sp.store(out + offs, sp.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

        @sp.autotune([{"BLOCK": 32}], key=["n"])
        @sp.jit
        @staticmethod
        def tuned(x, out, n, BLOCK: sp.constexpr):
            offs = sp.arange(0, BLOCK)
            sp.store(out + offs, sp.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

        @sp.autotune([{"BLOCK": 32}], key=["n"])
        @staticmethod
        @sp.jit
        def tuned_static_below(x, out, n, BLOCK: sp.constexpr):
            offs = sp.arange(0, BLOCK)
            sp.store(out + offs, sp.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

    return Stacked


@pytest.mark.parametrize("name", ["above", "plain"])
def test_static_kernels_run_from_the_class_and_from_an_instance(name: str) -> None:
    from_class, from_instance = getattr(Static, name), getattr(Static(), name)
    assert from_class is from_instance  # never bound
    _check_add(from_class)
    _check_add(from_instance)


def test_jit_and_autotune_above_staticmethod_work() -> None:
    stacked = _stacked_forms()
    for name in ("below", "below_with_options", "tuned", "tuned_static_below"):
        from_class, from_instance = getattr(stacked, name), getattr(stacked(), name)
        assert from_class is from_instance, name
        _check_add(from_class)
        _check_add(from_instance)
    k = stacked.below_with_options
    assert isinstance(k, sp.Kernel) and k.name == "below_with_options"
    x = np.zeros(N, np.float32)
    assert k.ir(x, x, N).attrs["num_warps"] == 8
    line, col = _where(_stacked_forms, "def below_with_options")
    assert (k.node.span.file_line, k.node.span.file_col) == (line, col)  # the real file's positions
