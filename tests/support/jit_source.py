"""@jit kernels written as Python source into a file and imported, as a user's module is: the
diagnostics tests need the kernel's real file, line and column."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

_counter = itertools.count()


def import_source(text: str, folder: Path, prefix: str) -> ModuleType:
    """``text`` written to a fresh ``<prefix>_<n>.py`` in ``folder`` and imported (not registered in
    ``sys.modules``)."""
    name = f"{prefix}_{next(_counter)}"
    path = folder / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_one_f32(module: ModuleType) -> np.ndarray:
    """``module.k(X: ptr[f32])`` run in the interpreter on one poisoned element; that element."""
    x = np.full(1, np.nan, np.float32)
    module.k.interpret[(1,)](x)
    return x


def first_compile_error(module: ModuleType) -> Any:
    """The first diagnostic of the CompileError that ``module.k(X: ptr[f32])`` raises in the
    interpreter, which must have written nothing."""
    import sparsile as sp

    x = np.full(1, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        module.k.interpret[(1,)](x)
    assert np.isnan(x).all()
    return info.value.diagnostics[0]
