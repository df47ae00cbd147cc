"""A diagnostic at a use of a parameter bound at compile time says what the parameter was given:
a constexpr of the wrong kind for its use (``BLOCK=256.0`` where an int is needed, ``BLOCK="256"``,
``BLOCK=None``) and None given for a pointer (the compile-time constant None, docs/language.md
"Specialization and launching") fail deep in the kernel, at the use, and the note names the
argument and its value (docs/diagnostics.md: SP0201, SP0304, SP0329). Only a use of the
parameter's own value gets the note: not a local that shadows it, nor an unrelated error."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError, Diagnostic

SRC = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 16):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n), mask=offs < n)
"""
LINE = "    offs = program_id(0) * BLOCK + arange(0, BLOCK)"

UNTYPED = """
@kernel
def k(x, out, n: i32, BLOCK: constexpr = 16):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n), mask=offs < n)
"""


def kernel(src: str = SRC) -> sp.Kernel:
    return sp.loads(src, "case.spk").kernels["k"]


def arrays() -> tuple[np.ndarray, np.ndarray]:
    return np.ones(20, np.float32), np.full(20, np.nan, np.float32)


def error_of(k: sp.Kernel, *args: object, **kwargs: object) -> Diagnostic:
    with pytest.raises(CompileError) as info:
        k.interpret[(2,)](*args, **kwargs)
    return info.value.diagnostics[0]


def at(d: Diagnostic, line: int, col: int) -> None:
    assert (d.span.file_line, d.span.file_col) == (line, col)


def test_a_float_block_names_the_argument() -> None:
    d = error_of(kernel(), *arrays(), 20, BLOCK=256.0)
    assert d.code == "SP0201"
    assert d.message == "`end` of arange must be a compile-time constant int, found `256.0`"
    at(d, 4, LINE.index("arange(0, BLOCK)") + len("arange(0, ") + 1)
    assert d.notes == ("`BLOCK` is a constexpr parameter, given 256.0 (float)",)
    assert "= note: `BLOCK` is a constexpr parameter, given 256.0 (float)" in d.render()


def test_a_string_block_names_the_argument() -> None:
    d = error_of(kernel(), *arrays(), 20, BLOCK="256")
    assert d.code == "SP0329" and d.message == "`*` needs numbers or tiles, found '256'"
    at(d, 4, LINE.index("BLOCK") + 1)
    assert d.notes == ("`BLOCK` is a constexpr parameter, given '256' (str)",)


def test_a_none_block_names_the_argument() -> None:
    d = error_of(kernel(), *arrays(), 20, BLOCK=None)
    assert d.code == "SP0329" and d.message == "`*` needs numbers or tiles, found None"
    assert d.notes == ("`BLOCK` is a constexpr parameter, given None",)


def test_the_note_follows_the_value_into_a_helper_and_an_alias() -> None:
    src = """
def span(b):
    return arange(0, b)

@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 16):
    B = BLOCK
    offs = program_id(0) * 16 + span(B)
    store(out + offs, load(x + offs, mask=offs < n), mask=offs < n)
"""
    d = error_of(kernel(src), *arrays(), 20, BLOCK=16.5)
    assert d.code == "SP0201" and d.message == "`end` of arange must be a compile-time constant int, found `16.5`"
    at(d, 3, len("    return arange(0, ") + 1)
    assert "`BLOCK` is a constexpr parameter, given 16.5 (float)" in d.notes


@pytest.mark.parametrize(("body", "message"), [
    ("    acc = zeros((BLOCK,), f32)\n    store(out + arange(0, 16), acc)",
     "each dimension of the shape must be a compile-time constant int, found `4.0`"),
    ("    store(out + arange(0, BLOCK * 2), load(x + arange(0, 32)))",
     "`end` of arange must be a compile-time constant int, found `8.0`"),
])
def test_a_use_inside_the_expression_that_fails_names_the_argument(body: str, message: str) -> None:
    src = f"@kernel\ndef k(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 16):\n{body}\n"
    d = error_of(kernel(src), *arrays(), 20, BLOCK=4.0)
    assert d.code == "SP0201" and d.message == message
    assert d.notes == ("`BLOCK` is a constexpr parameter, given 4.0 (float)",)


def test_a_local_that_shadows_the_parameter_gets_no_note() -> None:
    src = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 16):
    BLOCK = 2.5
    offs = program_id(0) * 16 + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n), mask=offs < n)
"""
    d = error_of(kernel(src), *arrays(), 20, BLOCK=16)
    assert d.code == "SP0201" and d.message == "`end` of arange must be a compile-time constant int, found `2.5`"
    assert d.notes == ()


def test_an_error_elsewhere_gets_no_note() -> None:
    src = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 16):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n) + "a", mask=offs < n)
"""
    d = error_of(kernel(src), *arrays(), 20, BLOCK=16)
    assert d.code == "SP0329" and d.notes == ()


def test_none_for_a_pointer_names_the_parameter() -> None:
    d = error_of(kernel(UNTYPED), None, arrays()[1], 20)
    assert d.code == "SP0329" and d.message == "`+` needs numbers or tiles, found None"
    at(d, 5, len("    store(out + offs, load(") + 1)
    assert d.notes == ("`x` was given None, so it is the compile-time constant None here (an optional pointer is "
                       "used under `if x is not None:`; docs/language.md, \"Specialization and launching\")",)


@sp.jit
def needs_bias(x, out, bias_ptr: sp.ptr[sp.f32]):
    sp.store(out, sp.load(x) + sp.load(bias_ptr))


def test_none_for_an_annotated_pointer_names_the_parameter() -> None:
    x = np.ones(1, np.float32)
    with pytest.raises(CompileError) as info:
        needs_bias.interpret[(1,)](x, x, None)
    (d,) = info.value.diagnostics
    assert d.code == "SP0304" and d.message == "expected a value as the pointer, found None"
    assert d.notes == ("`bias_ptr` was given None, so it is the compile-time constant None here (an optional "
                       "pointer is used under `if bias_ptr is not None:`; docs/language.md, \"Specialization and "
                       "launching\")",)


def test_an_ahead_of_time_signature_names_the_argument_too() -> None:
    f32 = sp.ptr[sp.f32]
    with pytest.raises(CompileError) as info:
        kernel().compile({"x": f32, "out": f32, "n": sp.i32, "BLOCK": "256"}, target="sm_90a")
    d = info.value.diagnostics[0]
    assert d.code == "SP0329" and d.notes == ("`BLOCK` is a constexpr parameter, given '256' (str)",)
