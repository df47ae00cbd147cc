"""Python's defaults and annotations of a ``@sparsile.jit`` function nested in a function or class
body (frontend/sema/captures.py): their captured reads are checked at every launch as cheaply as a
module global's (no Python-level call), they still notice a changed value, and an invalid
``ptr[...]`` that Python evaluated is reported with its reason, as at module level."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support.jit_source import import_source

NESTED = '''
import sparsile as sp


def make():
    def k(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, s: sp.f32, BLOCK: sp.constexpr = 8, *,
          ADD: sp.constexpr = 1.0):
        i = sp.arange(0, BLOCK)
        m = i < n
        sp.store(out + i, sp.load(x + i, mask=m) * s + ADD, mask=m)

    return sp.jit(k), k


@sp.jit
def top(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, s: sp.f32, BLOCK: sp.constexpr = 8, *,
        ADD: sp.constexpr = 1.0):
    i = sp.arange(0, BLOCK)
    m = i < n
    sp.store(out + i, sp.load(x + i, mask=m) * s + ADD, mask=m)
'''


def _python_calls(check: Callable[[], Any]) -> list[str]:
    """The Python functions ``check()`` calls (C functions and ``check`` itself not counted)."""
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        assert check()
    finally:
        sys.setprofile(None)
    return [c for c in calls if not c.endswith("still_valid")]


def _run(kernel: Any, n: int = 16, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(n).uniform(-2.0, 2.0, n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    kernel.interpret[(1,)](x, out, n, 1.5, **kwargs)
    return x, out


@pytest.mark.parametrize("where", ["nested", "module"])
def test_the_launch_check_of_a_kernels_captures_makes_no_python_call(tmp_path, where: str) -> None:
    # A nested kernel's defaults and annotations were checked through a Python lambda each (the
    # defaults one building a dict): about 10 us per launch for this kernel, 0.5 us at module level.
    module = import_source(NESTED, tmp_path, "nested_launch_path")
    kernel = module.make()[0] if where == "nested" else module.top
    x, out = _run(kernel)
    _, bindings, key = kernel.bind((x, out, 16, 1.5), {})
    captures = kernel.captures_for(bindings, key)
    assert captures.reads  # the check below has something to check
    assert _python_calls(captures.still_valid) == []


def _expect(x: np.ndarray, out: np.ndarray, block: int, add: float) -> None:
    want = x.astype(np.float64) * 1.5 + add
    done = min(block, len(x))
    assert np.all(np.abs(out[:done] - want[:done]) <= 4 * np.finfo(np.float32).eps * (np.abs(want[:done]) + 1))
    assert np.isnan(out[done:]).all()


def test_a_changed_python_default_or_annotation_recompiles(tmp_path) -> None:
    module = import_source(NESTED, tmp_path, "nested_launch_path")
    kernel, function = module.make()
    x, out = _run(kernel)
    _expect(x, out, 8, 1.0)
    function.__defaults__ = (16,)                        # BLOCK: the tuple replaced
    x, out = _run(kernel)
    _expect(x, out, 16, 1.0)
    function.__kwdefaults__["ADD"] = 3.0                 # ADD: the dict changed in place
    x, out = _run(kernel)
    _expect(x, out, 16, 3.0)
    function.__annotations__["s"] = sp.i32               # s: now an integer parameter
    x = np.ones(16, np.float32)
    with pytest.raises(sp.LaunchError) as info:
        kernel.interpret[(1,)](x, np.full(16, np.nan, np.float32), 16, 1.5)
    assert info.value.code == "SP0703"


def test_a_changed_python_default_of_a_module_level_kernel_recompiles(tmp_path) -> None:
    # A module-level kernel's default is Python's value too (what `inspect.signature` shows): it was
    # the source's expression evaluated again in the module at each compile, blind to `__defaults__`
    module = import_source(NESTED, tmp_path, "module_launch_path")
    kernel, function = module.top, module.top.fn
    assert function is not None
    assert [(p.name, p.default) for p in inspect.signature(kernel).parameters.values()][-2:] == [("BLOCK", 8),
                                                                                                 ("ADD", 1.0)]
    x, out = _run(kernel)
    _expect(x, out, 8, 1.0)
    function.__defaults__ = (16,)                        # BLOCK: the tuple replaced
    assert inspect.signature(kernel).parameters["BLOCK"].default == 16
    x, out = _run(kernel)
    _expect(x, out, 16, 1.0)
    function.__kwdefaults__["ADD"] = 3.0                 # ADD: the dict changed in place
    x, out = _run(kernel)
    _expect(x, out, 16, 3.0)
    function.__kwdefaults__ = {"ADD": -2.5}              # ADD: the dict replaced
    x, out = _run(kernel)
    _expect(x, out, 16, -2.5)
    x, out = _run(kernel, ADD=0.5)                       # an argument still overrides it
    _expect(x, out, 16, 0.5)


INVALID = '''
import sparsile as sp


{indent}@sp.jit
{indent}def k(x: {annotation}):
{indent}    pass
'''


@pytest.mark.parametrize("annotation, message", [
    ("sp.ptr[sp.f32, 2]", "`ptr[...]` takes one scalar element type, e.g. `ptr[f32]`"),
    ("sp.ptr[str]", "`ptr[...]` takes one scalar element type, e.g. `ptr[f32]`"),  # (`ptr[int]` is `ptr[i64]`)
    ("sp.tensor[sp.f16, 9]", "a tensor's rank must be 1 to 5 (the TMA limit), found 9"),
    ("sp.tensor[sp.f16, 2.0]", "`tensor[...]` takes an element type and a rank, e.g. `tensor[f16, 2]`"),
])
@pytest.mark.parametrize("where", ["module", "function", "class"])
def test_an_invalid_type_annotation_says_why_wherever_the_kernel_is(tmp_path, annotation: str, message: str,
                                                                    where: str) -> None:
    # A nested function's Python-evaluated `ptr[...]` was "must be a type such as ..., found a
    # Python `InvalidAnnotation` object".
    indent = {"module": "", "function": "    ", "class": "    "}[where]
    text = INVALID.format(indent=indent, annotation=annotation)
    if where == "function":
        text = text.replace("\n\n\n    @sp.jit", "\n\n\ndef make():\n    @sp.jit") + "    return k\n"
    elif where == "class":
        text = text.replace("\n\n\n    @sp.jit", "\n\n\nclass K:\n    @staticmethod\n    @sp.jit")
    module = import_source(text, tmp_path, "invalid_annotation")
    kernel = {"module": lambda: module.k, "function": lambda: module.make(), "class": lambda: module.K.k}[where]()
    with pytest.raises(sp.CompileError) as info:
        kernel.params  # noqa: B018
    d = info.value.diagnostics[0]
    assert (d.code, d.message, d.help) == ("SP0302", message, None)
    line = next(n for n, s in enumerate(text.splitlines(), 1) if "def k(" in s)
    assert (d.span.file_line, d.span.file_col) == (line, text.splitlines()[line - 1].index("sp.") + 1)


CLOSURE = '''
import sparsile as sp


def make(scale):
    def k(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, s: sp.f32, BLOCK: sp.constexpr = 16, *,
          ADD: sp.constexpr = 1.0):
        i = sp.arange(0, BLOCK)
        m = i < n
        sp.store(out + i, sp.load(x + i, mask=m) * s * scale + ADD, mask=m)

    def set_scale(value):
        nonlocal scale
        scale = value

    def forget_scale():
        nonlocal scale
        del scale

    return sp.jit(k), set_scale, forget_scale
'''


def _expect_scaled(x: np.ndarray, out: np.ndarray, scale: float) -> None:
    want = x.astype(np.float64) * 1.5 * scale + 1.0
    assert np.all(np.abs(out - want) <= 4 * np.finfo(np.float32).eps * (np.abs(want) + 1))


def test_a_closure_variable_is_checked_without_a_python_call_and_still_noticed(tmp_path) -> None:
    # A closure cell was read through a Python lambda at every launch (the kernel made in a
    # function, reading that function's variable); a global is read inline.
    module = import_source(CLOSURE, tmp_path, "closure_launch_path")
    kernel, set_scale, forget_scale = module.make(2.0)
    x, out = _run(kernel)
    _expect_scaled(x, out, 2.0)
    _, bindings, key = kernel.bind((x, out, 16, 1.5), {})
    captures = kernel.captures_for(bindings, key)
    assert any(r.where[0] == "closure" for r in captures.reads)
    assert _python_calls(captures.still_valid) == []
    set_scale(2.0)  # the same value in the same object: still valid
    assert captures.still_valid()
    set_scale(4.0)  # another value: compiled anew
    assert not captures.still_valid()
    x, out = _run(kernel)
    _expect_scaled(x, out, 4.0)
    captures = kernel.captures_for(*kernel.bind((x, out, 16, 1.5), {})[1:])
    forget_scale()  # an emptied cell is a change too
    assert not captures.still_valid()
