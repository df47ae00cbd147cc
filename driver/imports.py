"""Relative imports between ``.spk`` files: ``from .helpers import linear_epilogue, BLOCK``.

The module part names a ``.spk`` file relative to the folder of the importing file: ``.name`` is
``name.spk`` beside it, ``.sub.name`` is ``sub/name.spk``, and each further leading dot goes one
folder up (``..name`` is ``../name.spk``). The imported names are the other module's helper
functions and module-level constants (its own imports of those included), resolved when the
importing module is loaded; a helper keeps resolving its names in its own module.

An imported file is loaded once per process for each (resolved path, text): a second import of the
same unchanged file reuses its module, an edited file is loaded anew. A module that (directly or
not) imports itself is diagnostic SP0245. Text given to ``sparsile.loads`` has no folder unless
``path=`` says which file it stands for: a relative import there is SP0246.

Every compile-cache key of a kernel holds the text of each module its module imports, transitively
(``KernelModule.imported_sources``, read through ``Kernel.source_key``), so that editing an imported
helper recompiles the kernels that use it (docs/language.md, "Importing from another .spk file").
"""

from __future__ import annotations

import codecs
import os
import threading
from collections.abc import Callable
from typing import Any

from ..frontend.diagnostics import CompileError, Diagnostic
from ..frontend.sema.values import Const, HelperFunction
from ..frontend.syntax import ast as A
from .kernel import Kernel

SP_IMPORT_NO_FILE = "SP0243"
SP_IMPORT_NO_NAME = "SP0244"
SP_IMPORT_CIRCULAR = "SP0245"
SP_IMPORT_NO_FOLDER = "SP0246"
SP_IMPORT_KERNEL = "SP0247"

_LOCK = threading.RLock()
_LOADED: dict[tuple[str, str], Any] = {}
"""(real path, text) -> the KernelModule loaded from it."""
_STATE = threading.local()


def loading_stack() -> list[str]:
    """The real paths of the modules this thread is loading now, outermost first."""
    stack = getattr(_STATE, "stack", None)
    if stack is None:
        stack = _STATE.stack = []
    return stack


def real_path(path: str) -> str:
    """The identity of a module file: its absolute path with symbolic links resolved."""
    return os.path.realpath(os.path.abspath(path))


def is_exported(value: Any) -> bool:
    """Whether another module may import ``value``: a helper function or a compile-time constant
    (not a kernel, not a ``sparsile`` namespace)."""
    if isinstance(value, HelperFunction):
        return True
    if isinstance(value, Const):
        return not _is_kernel(value)
    return isinstance(value, tuple)


def _is_kernel(value: Any) -> bool:
    return isinstance(value, Const) and isinstance(value.value, Kernel)


def imported_file(stmt: A.ImportFrom, importer: str, path: str | None) -> tuple[str, str]:
    """(the path of the file ``stmt`` imports, its name as written in messages), or SP0243/SP0246."""
    dots = len(stmt.module) - len(stmt.module.lstrip("."))
    parts = stmt.module[dots:].split(".") if stmt.module[dots:] else []
    if path is None:
        raise CompileError([Diagnostic(SP_IMPORT_NO_FOLDER, f"`{importer}` has no folder to import "
                                       f"`{stmt.module}` from", stmt.span,
                                       help="load the module from its file with sparsile.load(path), or give the "
                                            "file the text stands for: sparsile.loads(text, name, path=...)")])
    if not parts:
        raise CompileError([Diagnostic(SP_IMPORT_NO_FILE, f"`from {stmt.module} import ...` names no file",
                                       stmt.span, help="name the .spk file: `from .helpers import f` reads "
                                                       "helpers.spk beside this file")])
    folder = os.path.dirname(path)
    for _ in range(dots - 1):
        folder = os.path.join(folder, os.pardir)
    shown = "/".join([*([os.pardir] * (dots - 1)), *parts]) + ".spk"
    return os.path.normpath(os.path.join(folder, *parts) + ".spk"), shown


def import_module(stmt: A.ImportFrom, importer: str, path: str | None,
                  load_text: Callable[[str, str], Any]) -> tuple[Any, dict[str, Any]]:
    """The module ``stmt`` imports and the names it binds (name -> value). ``load_text(text, path)``
    builds a module from a file's text; ``importer`` and ``path`` are the importing module's name
    and file (None for text without a folder)."""
    file, shown = imported_file(stmt, importer, path)
    key_path = real_path(file)
    stack = loading_stack()
    if key_path in stack:
        chain = [os.path.basename(p) for p in stack[stack.index(key_path):]]
        raise CompileError([Diagnostic(SP_IMPORT_CIRCULAR, f"circular import: {' -> '.join(chain)} -> "
                                       f"{os.path.basename(key_path)}", stmt.span,
                                       help="move the helpers both files need into a third .spk file that "
                                            "imports neither")])
    text = _read(file, shown, stmt)
    with _LOCK:
        module = _LOADED.get((key_path, text))
    if module is None:
        module = load_text(text, file)
        with _LOCK:
            module = _LOADED.setdefault((key_path, text), module)
    return module, _bound_names(module, stmt, shown)


def utf8_source(data: bytes) -> str:
    """The text of a ``.spk`` file's bytes: UTF-8, a leading byte-order mark dropped (``sparsile
    check`` and Python source files allow one). A UnicodeDecodeError's ``start`` counts the bytes
    of the file, the mark included."""
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnicodeDecodeError("utf-8", data, e.start + skip, e.end + skip, e.reason) from None


def _read(file: str, shown: str, stmt: A.ImportFrom) -> str:
    try:
        with open(file, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CompileError([Diagnostic(SP_IMPORT_NO_FILE, f"cannot import `{stmt.module}`: no readable file "
                                       f"`{shown}` ({e.strerror})", stmt.span,
                                       help=f"looked for {os.path.abspath(file)}; `from .name import f` reads "
                                            "name.spk in the folder of the importing file")]) from None
    try:
        return utf8_source(data)
    except UnicodeDecodeError as e:
        raise CompileError([Diagnostic(SP_IMPORT_NO_FILE, f"cannot import `{stmt.module}`: `{shown}` is not "
                                       f"UTF-8 text ({e.reason} at byte {e.start})", stmt.span)]) from None


def _bound_names(module: Any, stmt: A.ImportFrom, shown: str) -> dict[str, Any]:
    exports = module.exports()
    out: dict[str, Any] = {}
    for name, alias in stmt.names:
        if name == "*":
            out.update(exports)
            continue
        if name not in exports:
            if name in module.kernels:
                raise CompileError([Diagnostic(SP_IMPORT_KERNEL, f"`{name}` is a kernel of `{shown}`; only helper "
                                               "functions and constants can be imported", stmt.span,
                                               help="move the body into a helper function that both kernels call")])
            known = ", ".join(sorted(exports)) or "none"
            raise CompileError([Diagnostic(SP_IMPORT_NO_NAME, f"`{shown}` has no helper or constant `{name}`",
                                           stmt.span, help=f"it has: {known}")])
        out[alias or name] = exports[name]
    return out


def transitive_sources(modules: list[Any]) -> tuple[tuple[str, str], ...]:
    """(identity, text) of each of ``modules`` and of every module they import, transitively, in
    import order without repeats."""
    seen: dict[tuple[str, str], None] = {}
    for m in modules:
        seen.setdefault((m.identity, m.text), None)
        for pair in m.imported_sources:
            seen.setdefault(pair, None)
    return tuple(seen)
