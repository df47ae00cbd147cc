"""A Python method called in a @jit kernel is named a method, and its help is advice that works: the
help "decorate it with @sparsile.jit" (a function's) gave SP0249 when followed on a method, since a
kernel cannot take ``self`` or ``cls``; a @staticmethod decorated with @sparsile.jit is what runs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparsile.tests.support.jit_source import first_compile_error, import_source, run_one_f32

PRELUDE = '''import sparsile as sp


class C:
    def m(self, x):
        return x * 2

    @classmethod
    def c(cls, x):
        return x * 2


OBJ = C()
'''

HELP = ("a method cannot be inlined, since a kernel cannot take `self` or `cls`: make `{name}` a `@staticmethod` "
        "decorated with `@sparsile.jit` (or a function at module level), and pass what it reads from `self` as "
        "arguments")


@pytest.mark.parametrize(("call", "named", "name"), [
    ("OBJ.m(1.0)", "the Python method `C.m`", "m"),
    ("C.c(1.0)", "the Python method `C.c`", "c"),
    ("C.m(OBJ, 1.0)", "the Python method `C.m`", "m"),
])
def test_a_method_is_named_a_method_with_advice_that_works(call: str, named: str, name: str, tmp_path: Any) -> None:
    text = PRELUDE + f"\n\n@sp.jit\ndef k(X: sp.ptr[sp.f32]):\n    sp.store(X, {call})\n"
    d = first_compile_error(import_source(text, tmp_path, "method_help"))
    assert (d.code, d.message, d.help) == ("SP0332", f"{named} is not callable in a kernel", HELP.format(name=name))
    line = text.split("\n")[d.span.file_line - 1]
    assert line[d.span.file_col - 1:].startswith(call.partition("(")[0]), (line, d.span)


def test_the_methods_help_works(tmp_path: Any) -> None:
    """What the help advises: a @staticmethod decorated with @sparsile.jit, called on the class."""
    text = ("import sparsile as sp\n\n\nclass C:\n    @staticmethod\n    @sp.jit\n    def m(x):\n        return x * 2\n"
            "\n\n@sp.jit\ndef k(X: sp.ptr[sp.f32]):\n    sp.store(X, C.m(1.5))\n")
    assert run_one_f32(import_source(text, tmp_path, "method_help"))[0] == np.float32(3.0)


def test_a_module_function_keeps_the_functions_help(tmp_path: Any) -> None:
    text = ("import sparsile as sp\n\n\ndef f(x):\n    return x * 2\n"
            "\n\n@sp.jit\ndef k(X: sp.ptr[sp.f32]):\n    sp.store(X, f(1.0))\n")
    d = first_compile_error(import_source(text, tmp_path, "method_help"))
    assert (d.message, d.help) == ("the Python function `f` is not callable in a kernel",
                                   "a Python function called from a kernel must be decorated with `@sparsile.jit` "
                                   "(it is inlined)")
