"""``sparsile.NAME`` in a kernel where NAME is something the Python package has but the kernel
language does not (a submodule, a function or class of the API, another module attribute) says
what it is; "`sparsile` has no member" stays for names the package lacks. Each case is checked in a
``.spk`` kernel and in a ``@sparsile.jit`` kernel (code, message, help and the span of the name),
and for ``from sparsile import NAME`` / ``import sparsile.NAME`` lines of a ``.spk`` file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.sema.member_help import INTERPRET
from sparsile.frontend.sema.python_api import GENERAL_HELP, python_member_kind
from sparsile.tests.support.jit_source import first_compile_error, import_source

_SUB = "is a Python submodule of sparsile, not a name of the kernel language"
_ATTR = "is an attribute of the Python module `sparsile`, not a name of the kernel language"

# (the attribute read in the kernel, the message, the help)
CASES: list[tuple[str, str, str | None]] = [
    ("driver", f"`sparsile.driver` {_SUB}", GENERAL_HELP),  # imported by `import sparsile`
    ("frontend", f"`sparsile.frontend` {_SUB}", GENERAL_HELP),
    ("backend", f"`sparsile.backend` {_SUB}", GENERAL_HELP),  # not imported: found, not run
    ("stdlib", f"`sparsile.stdlib` {_SUB}", GENERAL_HELP),
    ("torch", f"`sparsile.torch` {_SUB}", GENERAL_HELP),  # the alias of integrations/torch
    ("jax", f"`sparsile.jax` {_SUB}", GENERAL_HELP),
    ("autotune", "`sparsile.autotune` is a function of sparsile's Python API, not a name of the kernel language",
     GENERAL_HELP),
    ("loads", "`sparsile.loads` is a function of sparsile's Python API, not a name of the kernel language",
     "did you mean `load`?"),
    ("Kernel", "`sparsile.Kernel` is a class of sparsile's Python API, not a name of the kernel language",
     GENERAL_HELP),
    ("jit", "`sparsile.jit` is a decorator of sparsile's Python API, not a name of the kernel language",
     "`sparsile.jit` is the decorator that makes a kernel; it has no meaning inside one"),
    ("sys", f"`sparsile.sys` {_ATTR}", GENERAL_HELP),  # a module the package imports, not its submodule
    ("__version__", f"`sparsile.__version__` {_ATTR}", GENERAL_HELP),
    ("interpret", "`sparsile` has no member `interpret`", INTERPRET),  # the package has none: kernel.interpret
    ("drivr", "`sparsile` has no member `drivr`", "did you mean `cdiv`?"),  # (the language names only)
]


def _spk_diagnostic(attr: str) -> tuple[Any, str]:
    line = f"    y = sp.{attr}"
    text = f"import sparsile as sp\n\n@kernel\ndef k(X: ptr[f32]):\n{line}\n    store(X, 1.0)\n"
    with pytest.raises(sp.CompileError) as info:
        sp.loads(text, "names.spk").kernels["k"].interpret[(1,)](np.full(1, np.nan, np.float32))
    return info.value.diagnostics[0], text


def _jit_diagnostic(attr: str, folder: Path) -> tuple[Any, str]:
    text = f"import sparsile as sp\n\n\n@sp.jit\ndef k(X: sp.ptr[sp.f32]):\n    y = sp.{attr}\n    sp.store(X, 1.0)\n"
    return first_compile_error(import_source(text, folder, "python_api_names")), text


@pytest.mark.parametrize("frontend", ["spk", "jit"])
@pytest.mark.parametrize(("attr", "message", "help_"), CASES, ids=[c[0] for c in CASES])
def test_a_python_side_name_in_a_kernel_says_what_it_is(frontend: str, attr: str, message: str,
                                                         help_: str | None, tmp_path) -> None:
    d, text = _spk_diagnostic(attr) if frontend == "spk" else _jit_diagnostic(attr, tmp_path)
    assert (d.code, d.message, d.help) == ("SP0204", message, help_)
    line = text.split("\n")[d.span.file_line - 1]
    assert line[d.span.file_col - 1:] == attr, (line, d.span)


def test_deciding_imports_nothing_heavy() -> None:
    """Naming `sparsile.backend` or `sparsile.torch` finds the module without running it (in a fresh
    interpreter, where nothing else imported them)."""
    probe = ("import sys, sparsile\n"
             "from sparsile.frontend.sema.python_api import python_member_kind\n"
             "kinds = [python_member_kind(n) for n in ('backend', 'torch', 'jax', 'stdlib')]\n"
             "heavy = [m for m in ('sparsile.backend', 'sparsile.integrations.torch', 'torch', 'jax',\n"
             "         'sparsile.stdlib') if m in sys.modules]\n"
             "print(kinds, heavy)\n")
    root = str(Path(sp.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "['submodule', 'submodule', 'submodule', 'submodule'] []", out


def test_language_names_and_namespace_members_are_not_python_names() -> None:
    """A language name is no Python-side name; a namespace's missing member stays "no member"
    (the Python object `sparsile.hopper` is that namespace, whose members are the language's)."""
    assert python_member_kind("load") is None and python_member_kind("hopper") is None
    text = "import sparsile as sp\n\n@kernel\ndef k(X: ptr[f32]):\n    y = sp.hopper.wgmma_nope\n    store(X, 1.0)\n"
    with pytest.raises(sp.CompileError) as info:
        sp.loads(text, "names.spk").kernels["k"].interpret[(1,)](np.full(1, np.nan, np.float32))
    d = info.value.diagnostics[0]
    assert (d.code, d.message) == ("SP0204", "`hopper` has no member `wgmma_nope`")
    assert text.split("\n")[d.span.file_line - 1][d.span.file_col - 1:] == "wgmma_nope"
    assert not hasattr(sp.hopper, "wgmma_nope")


_NAMESPACES = ("kernels can import `sparsile` and its namespaces: `sparsile.cluster`, `sparsile.fence`, "
               "`sparsile.hopper`, `sparsile.layout`, `sparsile.mbarrier`, `sparsile.pdl`, `sparsile.smem`, "
               "`sparsile.tcgen05`, `sparsile.tma`, `sparsile.tmem`")
IMPORT_CASES: list[tuple[str, str, str, str | None]] = [
    ("from sparsile import driver", "SP0233", f"`sparsile.driver` {_SUB}",
     "a .spk file imports the language's names from `sparsile`"),
    ("from sparsile import loads as L", "SP0233",
     "`sparsile.loads` is a function of sparsile's Python API, not a name of the kernel language",
     "did you mean `load`?"),
    ("from sparsile import kernel", "SP0233",
     "`sparsile.kernel` is a decorator of sparsile's Python API, not a name of the kernel language",
     "a .spk file marks its kernels `@kernel` or `@jit` without importing them"),
    ("from sparsile import drivr", "SP0233", "`sparsile` has no member `drivr`", None),
    ("from sparsile import interpret", "SP0233", "`sparsile` has no member `interpret`", INTERPRET),
    ("from sparsile import static_range", "SP0233", "`sparsile` has no member `static_range`",
     "`static_range` needs no import: a `for` loop names it as it is (`for i in static_range(n):`)"),
    ("from sparsile import cast", "SP0233", "`sparsile` has no member `cast`", "convert with `x.to(dtype)`"),
    ("import sparsile.driver", "SP0232",
     "`sparsile.driver` is a Python submodule of sparsile, not a namespace of the kernel language", _NAMESPACES),
    ("import sparsile.torch as t", "SP0232",
     "`sparsile.torch` is a Python submodule of sparsile, not a namespace of the kernel language", _NAMESPACES),
    ("from sparsile.frontend.sema import python_api", "SP0232",
     "`sparsile.frontend` is a Python submodule of sparsile, not a namespace of the kernel language", _NAMESPACES),
    ("import sparsile.drivr", "SP0232",
     "unknown module `sparsile.drivr` (kernels can import `sparsile` and its namespaces)", None),
    ("import sparsile.hopper.nope", "SP0232",
     "unknown module `sparsile.hopper.nope` (kernels can import `sparsile` and its namespaces)", None),
]


@pytest.mark.parametrize(("line", "code", "message", "help_"), IMPORT_CASES, ids=[c[0] for c in IMPORT_CASES])
def test_a_spk_import_of_a_python_side_name_says_what_it_is(line: str, code: str, message: str,
                                                            help_: str | None) -> None:
    text = f"\n{line}\n\n@kernel\ndef k(X: ptr[f32]):\n    store(X, 1.0)\n"
    with pytest.raises(sp.CompileError) as info:
        sp.loads(text, "imports.spk")
    d = info.value.diagnostics[0]
    assert (d.code, d.message, d.help) == (code, message, help_)
    assert (d.span.file_line, d.span.file_col, d.span.end_col) == (2, 1, len(line) + 1)


_FIELD = ("`sparsile.{ns}.{attr}` is an attribute of the Python object `sparsile.{ns}`, not a member of the kernel "
          "language's namespace `{ns}`")
_ATOMICS = ("the language's atomics are `atomic_add`, `atomic_max`, `atomic_min`, `atomic_xchg` and `atomic_cas`; "
            "bitwise atomics are not in the language")
_MATH = ("the math functions are top-level builtins: `exp`, `exp2`, `log`, `log2`, `sqrt`, `rsqrt`, `sin`, `cos`, "
         "`floor`, `ceil`, `abs`, `sigmoid`, `tanh`, `erf` (`sp.exp(x)`)")
# (the expression read in the kernel, the member whose span is reported, the message, the help)
MEMBER_CASES: list[tuple[str, str, str, str | None]] = [
    # a field of the Python object that stands for a namespace: Python has it, the namespace does not
    ("sp.hopper.name", "name", _FIELD.format(ns="hopper", attr="name"),
     "the members of `hopper` are `wgmma`, `wgmma_wait`"),
    ("sp.tma.members", "members", _FIELD.format(ns="tma", attr="members"),
     "the members of `tma` are `load`, `store`, `store_wait`"),
    ("sp.pdl.__class__", "__class__", _FIELD.format(ns="pdl", attr="__class__"),
     "the members of `pdl` are `launch_dependents`, `wait`"),
    ("sp.hopper.wgmma_nope", "wgmma_nope", "`hopper` has no member `wgmma_nope`", "did you mean `wgmma`?"),
    # names users reach for (Triton's spellings; the interpreter) with what sparsile has instead
    ("sp.static_range", "static_range", "`sparsile` has no member `static_range`",
     "`static_range` can only be used as the iterable of a `for` loop"),  # (was "did you mean `static_print`?")
    ("sp.range", "range", "`sparsile` has no member `range`",
     "`range` can only be used as the iterable of a `for` loop"),
    ("sp.atomic_or", "atomic_or", "`sparsile` has no member `atomic_or`",
     _ATOMICS),  # (was "did you mean `atomic_min`?")
    ("sp.extra.cuda.libdevice.exp", "extra", "`sparsile` has no member `extra`", _MATH),
    ("sp.load_tensor_descriptor", "load_tensor_descriptor", "`sparsile` has no member `load_tensor_descriptor`",
     "declare the parameter as `tensor[T, rank]` and read or write boxes with `t.load_tile(offsets, shape)` / "
     "`t.store_tile(offsets, tile)` (zero outside the tensor); offsets are plain integers"),
    ("sp.float8e4b15", "float8e4b15", "`sparsile` has no member `float8e4b15`",
     "sparsile's 8-bit floats are `e4m3` (Triton's `float8e4nv`) and `e5m2` (Triton's `float8e5`); this fp8 variant "
     "is not in the language"),  # (was "did you mean `float8e5`?", another format)
    ("sp.broadcast", "broadcast", "`sparsile` has no member `broadcast`",
     "operands of an operator broadcast by themselves; for one shape write `broadcast_to(x, shape)` for each"),
    ("sp.softmax", "softmax", "`sparsile` has no member `softmax`",
     "write it out: `e = exp(x - max(x, axis=a, keep_dims=True))`, then `e / sum(e, axis=a, keep_dims=True)`"),
]


@pytest.mark.parametrize("frontend", ["spk", "jit"])
@pytest.mark.parametrize(("expr", "member", "message", "help_"), MEMBER_CASES, ids=[c[0] for c in MEMBER_CASES])
def test_a_missing_namespace_member_says_what_is_true_and_what_to_write(frontend: str, expr: str, member: str,
                                                                        message: str, help_: str | None,
                                                                        tmp_path) -> None:
    attr = expr.removeprefix("sp.")
    d, text = _spk_diagnostic(attr) if frontend == "spk" else _jit_diagnostic(attr, tmp_path)
    assert (d.code, d.message, d.help) == ("SP0204", message, help_)
    line = text.split("\n")[d.span.file_line - 1]
    assert line[d.span.file_col - 1:].startswith(member) and d.span.end_col - d.span.file_col == len(member), (
        line, d.span)


def test_what_the_field_message_says_is_true() -> None:
    """The Python object has the attribute the message says it has; the namespace has no such member."""
    from sparsile.frontend.sema.builtins import NAMESPACES

    for ns, attr in (("hopper", "name"), ("tma", "members"), ("pdl", "__class__")):
        assert hasattr(getattr(sp, ns), attr) and attr not in NAMESPACES[ns].members


def test_range_and_static_range_still_work_as_loop_iterables() -> None:
    """The help for `sp.range` read as a value is true: `for i in sp.range(...)` is a loop."""
    text = ("import sparsile as sp\n\n@kernel\ndef k(X: ptr[f32]):\n    acc = 0.0\n"
            "    for i in sp.range(0, 3):\n        acc += 1.5\n    for j in sp.static_range(2):\n        acc += 0.25\n"
            "    store(X, acc)\n")
    x = np.full(1, np.nan, np.float32)
    sp.loads(text, "loops.spk").kernels["k"].interpret[(1,)](x)
    assert x[0] == np.float32(5.0)


def test_the_softmax_help_computes_softmax() -> None:
    """The help's spelling of Triton's `tl.softmax`, run as written, against a float64 softmax."""
    text = ("@kernel\ndef k(X: ptr[f32], Y: ptr[f32]):\n"
            "    r = arange(0, 4)[:, None] * 8 + arange(0, 8)[None, :]\n    x = load(X + r)\n"
            "    e = exp(x - max(x, axis=1, keep_dims=True))\n    store(Y + r, e / sum(e, axis=1, keep_dims=True))\n")
    x = np.random.default_rng(48).standard_normal((4, 8)).astype(np.float32) * 3
    y = np.full((4, 8), np.nan, np.float32)
    sp.loads(text, "softmax.spk").kernels["k"].interpret[(1,)](x, y)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
