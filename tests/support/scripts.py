"""Scripts that are not importable packages (benchmarks/*.py, run from a checkout): loaded as
modules by file, in this one place, so that tests can call their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from sparsile.tests.support.compile import ROOT


def load_script(path: str | Path, module_name: str | None = None, *, register: bool = False) -> ModuleType:
    """Execute the script at ``path`` (relative to the repository root, or absolute) as a module
    named ``module_name`` (default: its stem) and return it; ``register`` also puts it in
    ``sys.modules`` (what dataclasses and pickling of its classes need)."""
    path = Path(path) if Path(path).is_absolute() else ROOT / path
    name = module_name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
