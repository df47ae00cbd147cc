"""Help lines of ``@sparsile.jit`` diagnostics that had none, or one that did not fit the case: a
default computed by Python code, ``is`` / ``in`` on run-time values, a dict global indexed,
``jit(functools.partial(...))``, Triton's ``flip`` and NumPy's ``keepdims``, the no-GPU launch.
Each asserts the code, message, span and help."""

from __future__ import annotations

import functools
import textwrap

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support.jit_source import import_source


def _at(lines: list[str], needle: str) -> tuple[int, int]:
    """The (line, column) of the first ``needle`` in ``lines``, both 1-based."""
    n = next(n for n, s in enumerate(lines, 1) if needle in s)
    return n, lines[n - 1].index(needle) + 1


def _error(tmp_path, text: str, *args: object) -> tuple[sp.Diagnostic, list[str]]:
    """The first diagnostic of ``module.k`` launched in the interpreter on poisoned arrays (which
    must stay poisoned), and the module's lines."""
    module = import_source(text, tmp_path, "help_texts")
    x = np.random.default_rng(21).uniform(-2.0, 2.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        module.k.interpret[(1,)](x, out, *args)
    assert np.isnan(out).all()
    return info.value.diagnostics[0], text.splitlines()


def _kernel(signature: str, body: str, prelude: str = "") -> str:
    return (f"import os\n\nimport sparsile as sp\n{prelude}\n\n@sp.jit\ndef k({signature}):\n"
            + textwrap.indent(textwrap.dedent(body), "    "))


@pytest.mark.parametrize("where", ["kernel", "helper"])
@pytest.mark.parametrize("env", [None, "5"])
def test_a_default_computed_by_python_code_is_pythons_value(tmp_path, monkeypatch, where: str,
                                                            env: str | None) -> None:
    # A default is the value Python evaluated when the `def` ran (docs/language.md, "What a kernel
    # captures"): `int(os.environ.get(...))` is Python's 8 (or the variable's value). It was SP0332
    # "the Python method `Mapping.get` is not callable in a kernel" at module level, with a help to
    # compute the value outside (the default was evaluated again as kernel code)
    if env is None:
        monkeypatch.delenv("SPARSILE_TEST_N", raising=False)
    else:
        monkeypatch.setenv("SPARSILE_TEST_N", env)
    default = 'int(os.environ.get("SPARSILE_TEST_N", "8"))'
    if where == "kernel":
        text = _kernel(f"x, out, n: sp.constexpr = {default}", "i = sp.arange(0, 8)\n"
                       "sp.store(out + i, sp.load(x + i) + n)\n")
    else:
        helper = f"\n\n@sp.jit\ndef add(v, n: sp.constexpr = {default}):\n    return v + n\n"
        text = _kernel("x, out", "i = sp.arange(0, 8)\nsp.store(out + i, add(sp.load(x + i)))\n", helper)
    module = import_source(text, tmp_path, "help_texts_default")
    monkeypatch.setenv("SPARSILE_TEST_N", "100")  # after the `def`: not read again
    x = np.random.default_rng(22).uniform(-2.0, 2.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    module.k.interpret[(1,)](x, out)
    np.testing.assert_array_equal(out, x + np.float32(8 if env is None else int(env)))  # (exact: small sums)


def test_a_library_objects_method_in_a_kernel_body_is_not_told_to_become_a_staticmethod(tmp_path) -> None:
    text = _kernel("x, out", 'i = sp.arange(0, 8)\nsp.store(out + i, sp.load(x + i) + int(os.environ.get("N", "2")))\n')
    d, lines = _error(tmp_path, text)
    assert d.code == "SP0332" and d.message == "the Python method `Mapping.get` is not callable in a kernel"
    assert (d.span.file_line, d.span.file_col) == _at(lines, "os.environ.get")
    assert d.help == ("`Mapping.get` is a method of a Python standard library object, which does not run in a "
                      "kernel: call it in Python outside the kernel and pass the result as an argument (a `constexpr` "
                      "one for a compile-time value)")


@pytest.mark.parametrize("test, needle, message, help_", [
    ("m in (1, 2, 3, 4)", "m in", "`in` works on compile-time values only, found a run-time value of type i32",
     "`in` is evaluated when the kernel compiles: test a run-time value against each element with `==` "
     "(`(m == 1) | (m == 2) | (m == 3) | ...`), or make `m` a `constexpr` parameter"),
    ("m not in (5,)", "m not in", "`not in` works on compile-time values only, found a run-time value of type i32",
     "`not in` is evaluated when the kernel compiles: test a run-time value against each element with `==` "
     "(`(m != 5)`), or make `m` a `constexpr` parameter"),
    ("m is True", "m is", "`is` works on compile-time values only, found a run-time value of type i32",
     "`is` compares compile-time values (and `m is None` whether an argument was passed as None): compare "
     "run-time values with `==`"),
    ("m + 1 is not False", "m + 1", "`is not` works on compile-time values only, found a run-time value of type i32",
     "`is not` compares compile-time values (and `x is not None` whether an argument was passed as None): "
     "compare run-time values with `!=`"),
])
def test_is_and_in_on_run_time_values_say_what_to_write(tmp_path, test: str, needle: str, message: str,
                                                        help_: str) -> None:
    text = _kernel("x, out, m", f"i = sp.arange(0, 8)\nif {test}:\n    sp.store(out + i, sp.load(x + i))\n")
    d, lines = _error(tmp_path, text, 7)
    assert d.code == "SP0331" and d.message == message
    assert (d.span.file_line, d.span.file_col) == _at(lines, needle)
    assert d.help == help_


def test_indexing_a_dict_global_says_what_a_kernel_reads(tmp_path) -> None:
    text = _kernel("x, out", 'i = sp.arange(0, 8)\nsp.store(out + i, sp.load(x + i) * CFG["scale"])\n',
                   'CFG = {"scale": 2.0}')
    d, lines = _error(tmp_path, text)
    assert d.code == "SP0333" and d.message == "{'scale': 2.0} cannot be indexed"
    assert (d.span.file_line, d.span.file_col) == _at(lines, 'CFG["scale"]')
    assert d.help == ("a kernel cannot index a dict (it reads numbers, strings, tuples, lists, dtypes and the "
                      "attributes of Python objects): bind the entry to a module constant (`VALUE = CFG['scale']`) "
                      "and read that, or make the dict an object whose attributes the kernel reads "
                      "(`types.SimpleNamespace(**CFG)`)")


def _plain(x, out, n):  # (a function sp.jit is given a partial of)
    return None


def test_jit_of_a_functools_partial_says_it_cannot_be_jitted() -> None:
    # SP0241 said "cannot read the source of `functools.partial(<function ...>)`: module, class,
    # method, function, traceback, frame, or code object was expected, got partial"
    with pytest.raises(sp.CompileError) as info:
        sp.jit(functools.partial(_plain, n=3))
    d = info.value.diagnostics[0]
    assert d.code == "SP0241"
    assert d.message == "@sparsile.jit wraps a Python function; a `functools.partial` of `_plain` cannot be jitted"
    assert d.span.line == 0   # no source of its own to point at
    assert d.help == ("decorate `_plain` itself with @sparsile.jit and launch it with the bound arguments "
                      "(`_plain[grid](..., n=3)`; a `constexpr` parameter is bound there), or write a kernel that "
                      "calls `_plain` with them")


@pytest.mark.parametrize("call, needle, code, message, help_", [
    ("sp.flip(v, 0)", "flip", "SP0204", "`sparsile` has no member `flip`",
     "the language has no `flip`: reverse the offsets instead, where the tile is loaded or stored "
     "(`load(p + (N - 1 - arange(0, N)))`)"),
    ("sp.sum(v, 0, keepdims=True)", "keepdims", "SP0321",
     "wrong arguments to `sum`: got an unexpected keyword argument `keepdims`",
     "did you mean `keep_dims`? (sparsile and Triton spell NumPy's `keepdims` `keep_dims=True`)"),
    ("v.max(axis=0, keepdims=True)", "keepdims", "SP0321",
     "wrong arguments to `max`: got an unexpected keyword argument `keepdims`",
     "did you mean `keep_dims`? (sparsile and Triton spell NumPy's `keepdims` `keep_dims=True`)"),
])
def test_triton_and_numpy_spellings_get_the_sparsile_one(tmp_path, call: str, needle: str, code: str, message: str,
                                                        help_: str) -> None:
    text = _kernel("x, out", f"i = sp.arange(0, 8)\nv = sp.load(x + i)\nsp.store(out + i, {call})\n")
    d, lines = _error(tmp_path, text)
    assert d.code == code and d.message == message
    assert (d.span.file_line, d.span.file_col) == _at(lines, needle)
    assert d.help == help_


def test_every_reduction_with_keep_dims_has_the_keepdims_hint() -> None:
    from sparsile.frontend.sema.builtins import ROOT
    from sparsile.frontend.sema.triton_names import keyword_help
    from sparsile.frontend.sema.values import Builtin

    with_keep_dims = sorted(name for name, b in ROOT.members.items()
                            if isinstance(b, Builtin) and "keep_dims" in b.signature.parameters)
    assert with_keep_dims, "no builtin takes keep_dims: the hint names nothing"
    assert all(keyword_help(name, "keepdims") is not None for name in with_keep_dims), with_keep_dims


def test_the_no_gpu_launch_help_names_the_kernel(tmp_path) -> None:
    from sparsile.backend import runtime

    if runtime.has_gpu():
        pytest.skip("a GPU is present: the launch runs")
    module = import_source(_kernel("x, out", "i = sp.arange(0, 8)\nsp.store(out + i, sp.load(x + i))\n"), tmp_path,
                           "help_texts")
    x, out = np.ones(8, np.float32), np.full(8, np.nan, np.float32)
    with pytest.raises(sp.LaunchError) as info:
        module.k[(1,)](x, out)
    assert info.value.code == "SP0731"
    assert str(info.value).split("\n")[0] == "error[SP0731]: kernel `k` cannot run: no NVIDIA GPU is available"
    assert info.value.help == ("run it on the CPU with `k.interpret[grid](...)`, or compile it ahead of time (no GPU "
                               "needed) with `k.compile(...)`")
    assert np.isnan(out).all()


class _NotAKernel:  # (a class sp.jit is given)
    pass


def _wrapping(f):  # a decorator below @sparsile.jit that wraps what it is given
    @functools.wraps(f)
    def wrapper(*args):
        return f(*args)

    return wrapper


@pytest.mark.parametrize("given", [_NotAKernel, _wrapping(_NotAKernel)], ids=["class", "wrapped class"])
def test_jit_of_a_class_says_it_wraps_a_function(given) -> None:
    # A Python AttributeError ("type object '_NotAKernel' has no attribute '__code__'"); under a
    # functools.wraps decorator it was SP0113 "`class` definitions are not supported in kernels".
    with pytest.raises(sp.CompileError) as info:
        sp.jit(given)
    d = info.value.diagnostics[0]
    assert d.code == "SP0241"
    assert d.message == "@sparsile.jit wraps a Python function; `_NotAKernel` is a class"
    assert d.span.line == 0
    assert d.help == "decorate a `def` with @sparsile.jit: a kernel is a function, launched as `kernel[grid](...)`"


def test_jit_of_a_function_whose_wrapped_chain_loops_cannot_read_its_source() -> None:
    # inspect.getsource's ValueError "wrapper loop when unwrapping ..." escaped.
    def looped(x):
        return x

    looped.__wrapped__ = looped
    with pytest.raises(sp.CompileError) as info:
        sp.jit(looped)
    d = info.value.diagnostics[0]
    assert d.code == "SP0241"
    assert d.message.startswith("cannot read the source of `looped`: wrapper loop when unwrapping")
    assert d.span.line == 0
    assert d.help == "define kernels in a file, or use sparsile.loads(text)"
