"""``sparsile.NAME`` in a kernel where NAME is something the Python package has but the kernel
language does not (a submodule, a function or class of the API, another module attribute) says
what it is; "`sparsile` has no member" stays for names the package lacks. Each case is checked in a
``.spk`` kernel and in a ``@sparsile.jit`` kernel (code, message, help and the span of the name),
and for ``from sparsile import NAME`` / ``import sparsile.NAME`` lines of a ``.spk`` file."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.sema.python_api import GENERAL_HELP, python_member_kind

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
    ("interpret", "`sparsile` has no member `interpret`", None),  # the package has none
    ("drivr", "`sparsile` has no member `drivr`", "did you mean `cdiv`?"),  # (the language names only)
]


def _spk_diagnostic(attr: str) -> tuple[Any, str]:
    line = f"    y = sp.{attr}"
    text = f"import sparsile as sp\n\n@kernel\ndef k(X: ptr[f32]):\n{line}\n    store(X, 1.0)\n"
    with pytest.raises(sp.CompileError) as info:
        sp.loads(text, "names.spk").kernels["k"].interpret[(1,)](np.full(1, np.nan, np.float32))
    return info.value.diagnostics[0], text


_counter = itertools.count()


def _jit_diagnostic(attr: str, folder: Path) -> tuple[Any, str]:
    name = f"python_api_names_{next(_counter)}"
    text = f"import sparsile as sp\n\n\n@sp.jit\ndef k(X: sp.ptr[sp.f32]):\n    y = sp.{attr}\n    sp.store(X, 1.0)\n"
    path = folder / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = np.full(1, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        module.k.interpret[(1,)](x)
    assert np.isnan(x).all()
    return info.value.diagnostics[0], text


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
