"""``.spk`` modules and ``@sparsile.jit``.

A ``.spk`` file holds decorated kernels (``@kernel`` or ``@jit``, optionally with options such as
``@kernel(num_warps=8)``), undecorated helper functions, module-level constants and
``import sparsile [as sp]`` / ``from sparsile[.ns] import name`` lines, and relative imports of
helpers and constants from other ``.spk`` files (``from .helpers import f``: driver/imports.py).
Names resolve in that module. A ``@jit`` Python function resolves names in its Python globals and closure, read as
compile-time constants when the kernel is specialized.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

from ..frontend.diagnostics import CompileError, Diagnostic, DiagnosticBag
from ..frontend.sema.builtins import NAMESPACES, ROOT
from ..frontend.sema.captures import PythonGlobals
from ..frontend.sema.core import Sema
from ..frontend.sema.jit_globals import wrap_python_value
from ..frontend.sema.member_help import import_help
from ..frontend.sema.python_api import python_import_module, python_import_name
from ..frontend.sema.values import Const, HelperFunction
from ..frontend.spans import UNKNOWN_SPAN
from ..frontend.syntax import ast as A
from .imports import import_module, is_exported, loading_stack, real_path, transitive_sources, utf8_source
from .kernel import Kernel
from .kernel_options import KERNEL_OPTIONS, check_options

_DECORATOR_NAMES = ("kernel", "jit")


class KernelModule:
    """The kernels, helpers and constants of one ``.spk`` source. ``path`` is the file the source
    stands for (None for text without a folder): relative imports resolve against its folder."""

    def __init__(self, name: str, tree: A.Module, path: str | None = None):
        self.__name__ = name
        self._tree = tree
        self._env: dict[str, Any] = {}
        self.path = path
        self.identity = real_path(path) if path is not None else name
        self.text = tree.source.text
        self.kernels: dict[str, Kernel] = {}
        self.helpers: dict[str, HelperFunction] = {}
        self._imported: list[KernelModule] = []
        self._exported: set[str] = set()
        bag = DiagnosticBag()
        stack = loading_stack()
        stack.append(self.identity)
        try:
            for stmt in tree.body:
                try:
                    self._top_level(stmt)
                except CompileError as e:
                    bag.extend(e.diagnostics)
        finally:
            stack.pop()
        bag.raise_if_errors()
        self.imported_sources = transitive_sources(self._imported)
        """(identity, text) of every module this one imports, transitively: part of its kernels'
        cache keys (``Kernel.source_key``) and of its helpers' fingerprints."""
        texts = tuple(text for _, text in self.imported_sources)
        for k in self.kernels.values():
            k.imports = texts
        for h in self.helpers.values():
            h.imports = texts

    def exports(self) -> dict[str, Any]:
        """What another module can import from this one: its helper functions and module-level
        constants, its own imports of those included."""
        return {name: v for name, v in self._env.items() if name in self._exported and is_exported(v)}

    def _resolve(self, name: str) -> Any:
        return self._env[name]

    def _top_level(self, stmt: A.Stmt) -> None:
        if isinstance(stmt, A.FunctionDef):
            opts = _kernel_decorator(stmt, self._resolve)
            if opts is None:
                h = HelperFunction(stmt, self._resolve, stmt.name)
                self.helpers[stmt.name] = h
                self._env[stmt.name] = h
                self._exported.add(stmt.name)
            else:
                k = Kernel(stmt, self._resolve, opts)
                self.kernels[stmt.name] = k
                self._env[stmt.name] = Const(k)
        elif isinstance(stmt, A.Assign | A.AnnAssign):
            sema = Sema(self._resolve)
            value_node = stmt.value
            if value_node is None:
                return
            value = sema.evaluate(value_node)
            targets = stmt.targets if isinstance(stmt, A.Assign) else [stmt.target]
            for t in targets:
                if not isinstance(t, A.Name):
                    raise CompileError([Diagnostic("SP0230", "module-level assignments bind plain names", t.span)])
                if not isinstance(value, Const | tuple):
                    raise CompileError([Diagnostic("SP0231", "module-level names must be compile-time constants",
                                                   value_node.span)])
                self._env[t.id] = value
                self._exported.add(t.id)
        elif isinstance(stmt, A.Import):
            for mod, alias in stmt.names:
                ns = _namespace_for(mod)
                if ns is None:
                    python = python_import_module(mod, stmt.span)
                    if python is not None:
                        raise CompileError([python])
                    raise CompileError([Diagnostic("SP0232", f"unknown module `{mod}` (kernels can import `sparsile` "
                                                   "and its namespaces)", stmt.span)])
                self._env[alias or mod.split(".")[0]] = ns if alias else _namespace_for(mod.split(".")[0])
        elif isinstance(stmt, A.ImportFrom) and stmt.module.startswith("."):
            module, names = import_module(stmt, self.__name__, self.path, _load_imported)
            self._imported.append(module)
            self._env.update(names)
            self._exported.update(names)
        elif isinstance(stmt, A.ImportFrom):
            ns = _namespace_for(stmt.module)
            if ns is None:
                python = python_import_module(stmt.module, stmt.span)
                if python is not None:
                    raise CompileError([python])
                raise CompileError([Diagnostic("SP0232", f"unknown module `{stmt.module}`", stmt.span)])
            for name, alias in stmt.names:
                if name == "*":
                    self._env.update({k: v for k, v in ns.members.items()})
                    continue
                if name not in ns.members:
                    python = python_import_name(stmt.module, name, stmt.span)
                    if python is not None:
                        raise CompileError([python])
                    raise CompileError([Diagnostic("SP0233", f"`{stmt.module}` has no member `{name}`", stmt.span,
                                                   help=import_help(stmt.module, name))])
                self._env[alias or name] = ns.members[name]
        elif isinstance(stmt, A.ExprStmt) and isinstance(stmt.value, A.Constant):
            pass  # docstring
        elif isinstance(stmt, A.Pass):
            pass
        else:
            raise CompileError([Diagnostic("SP0234", "only functions, constants and imports may appear at module level "
                                           "of a .spk file", stmt.span)])

    def __getattr__(self, name: str) -> Any:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        env = self.__dict__.get("_env", {})
        if name in env:
            v = env[name]
            return v.value if isinstance(v, Const) else v
        import difflib

        names = sorted(kernels)
        near = difflib.get_close_matches(name, [*names, *env], n=1) if not name.startswith("__") else []
        guess = f": did you mean `{near[0]}`?" if near else ""
        raise AttributeError(f"module `{self.__dict__.get('__name__')}` has no kernel or constant `{name}`{guess} "
                             f"(kernels: {', '.join(names) or 'none'})")

    def __repr__(self) -> str:
        return f"<sparsile module {self.__name__}: kernels {sorted(self.kernels)}>"


def _namespace_for(module: str) -> Any:
    if module == "sparsile":
        return ROOT
    if module.startswith("sparsile."):
        return NAMESPACES.get(module[len("sparsile."):])
    return None


def _kernel_decorator(fn: A.FunctionDef, resolve: Callable[[str], Any]) -> dict[str, Any] | None:
    """The options of a ``@kernel``/``@jit`` decorator, or None for an undecorated helper."""
    if not fn.decorators:
        return None
    opts: dict[str, Any] | None = None
    for d in fn.decorators:
        call = d if isinstance(d, A.Call) else None
        target = call.func if call else d
        leaf = target.attr if isinstance(target, A.Attribute) else target.id if isinstance(target, A.Name) else None
        if leaf not in _DECORATOR_NAMES:
            raise CompileError([Diagnostic("SP0235", "unknown decorator; kernels are marked `@kernel` or `@jit`",
                                           d.span)])
        opts = {}
        if call:
            if call.args:
                raise CompileError([Diagnostic("SP0235", "decorator options are keyword arguments, e.g. "
                                               "`@kernel(num_warps=8)`", call.args[0].span)])
            sema = Sema(resolve)
            for k in call.keywords:
                if k.name not in KERNEL_OPTIONS:
                    raise CompileError([Diagnostic("SP0236", f"unknown kernel option `{k.name}`", k.span,
                                                   help=f"options: {', '.join(KERNEL_OPTIONS)}")])
                opts[k.name] = sema.evaluate(k.value, f"the option `{k.name}`")
            check_options(opts, lambda name: _option_span(fn, name))
    return opts


def _option_span(fn: A.FunctionDef, name: str) -> Any:
    """The span of ``name=...`` in a decorator call of ``fn``, or None."""
    for d in fn.decorators:
        if isinstance(d, A.Call):
            for k in d.keywords:
                if k.name == name:
                    return k.span
    return None


def loads(text: str, name: str = "<string>", *, path: str | os.PathLike[str] | None = None) -> KernelModule:
    """A module of kernels from source text. ``path``: the file the text stands for (it need not
    exist), whose folder relative imports (``from .helpers import f``) read; without it the text
    has no folder and a relative import is diagnostic SP0246."""
    from ..frontend.syntax.parser import parse_module

    if isinstance(text, bytes | bytearray):
        text = _decoded(bytes(text), str(name))
    if not isinstance(text, str):
        raise CompileError([Diagnostic("SP0240", f"sparsile.loads needs the source text as a str, found "
                                       f"{type(text).__name__}",
                                       help="pass the text of a .spk module, or its path to sparsile.load")])
    if path is not None:
        try:
            path = os.fsdecode(path)
        except TypeError:
            raise CompileError([Diagnostic("SP0240", f"sparsile.loads: path= needs a file path (str or "
                                           f"os.PathLike), found {type(path).__name__}")]) from None
    return KernelModule(str(name), parse_module(text, str(name)), path)


def _load_imported(text: str, path: str) -> KernelModule:
    """The module of an imported file (named by its path, as ``load`` names it)."""
    from ..frontend.syntax.parser import parse_module

    return KernelModule(path, parse_module(text, path), path)


def _decoded(data: bytes, name: str) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped: :func:`utf8_source`), or
    CompileError SP0240."""
    try:
        return utf8_source(data)
    except UnicodeDecodeError as e:
        raise CompileError([Diagnostic("SP0240", f"cannot read `{name}`: it is not UTF-8 text ({e.reason} at "
                                       f"byte {e.start})", help=".spk sources are UTF-8 text files")]) from None


def installed_copy_help(path: str) -> str | None:
    """The help of SP0240 for a relative ``path`` that is not here but names a file installed with
    sparsile (README's ``examples/vector_add.spk`` read outside the checkout), else None."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    try:
        if os.path.isabs(path) or os.path.exists(path):
            return None
        here = os.getcwd()
    except (OSError, ValueError):  # a folder that was deleted, a NUL character
        return None
    copy = os.path.realpath(os.path.join(package, path))
    if os.path.commonpath([package, copy]) != package or not os.path.isfile(copy):
        return None
    return f"the path is relative to the current folder, {here}; the file of that name installed with sparsile is " \
           f"{copy}"


def load(path: str | os.PathLike[str]) -> KernelModule:
    """A module of kernels from a ``.spk`` file."""
    try:
        p = os.fsdecode(path)
    except TypeError:
        raise CompileError([Diagnostic("SP0240", f"sparsile.load needs a file path (str or os.PathLike), found "
                                       f"{type(path).__name__}",
                                       help="pass the path of a .spk file, or its text to sparsile.loads")]) from None
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CompileError([Diagnostic("SP0240", f"cannot read `{p}`: {e.strerror}", help=installed_copy_help(p))]) \
            from None
    except ValueError:  # a NUL character in the path
        raise CompileError([Diagnostic("SP0240", f"cannot read {p!r}: a file path cannot hold a NUL character")]) \
            from None
    return loads(_decoded(data, p), p, path=p)


# Inside a kernel, `sparsile.load` (reached as a Python global under @jit) is the memory builtin.
load.__sparsile_builtin__ = "load"  # type: ignore[attr-defined]


TRITON_JIT_OPTIONS = {
    "do_not_specialize": "integers are specialized on divisibility by 16 as in Triton; "
                         "`kernel[grid].prepare(..., vary=(\"n\",))` drops that for a prepared launch",
    "debug": "the interpreter (`kernel.interpret[grid]`) checks every access and `assert`",
    "noinline": "helpers are always inlined",
}
"""Options of ``@triton.jit`` that ``@sparsile.jit`` does not take -> what to do instead."""


# ------------------------------------------------------------------------------------------------
def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Decorate a Python function as a kernel: ``@sparsile.jit`` or ``@sparsile.jit(num_warps=8)``.

    The function's source is parsed by the same grammar as ``.spk`` files; names it reads from its
    module or closure are compile-time constants. A kernel is recompiled when one of them changes
    (docs/language.md, "What a kernel captures, and when it is recompiled").
    """
    for k in options:
        if k not in KERNEL_OPTIONS:
            hint = f" ({TRITON_JIT_OPTIONS[k]})" if k in TRITON_JIT_OPTIONS else ""
            raise TypeError(f"unknown kernel option `{k}`; options: {', '.join(KERNEL_OPTIONS)}{hint}")

    def wrap(f: Callable[..., Any]) -> Kernel:
        from ..frontend.syntax.parser import parse_function_source

        # A kernel is no descriptor (`K.kern` and `K().kern` are the same kernel): a @staticmethod
        # under @sparsile.jit is unwrapped, and a function that Python would bind is SP0249.
        static = isinstance(f, staticmethod)
        bound = "classmethod" if isinstance(f, classmethod) else "bound method" if inspect.ismethod(f) else None
        if static or bound:
            f = f.__func__
        # A decorator below @sparsile.jit that wraps the function (functools.wraps sets
        # __wrapped__) stands for it: the kernel is compiled from the wrapped function's source,
        # so its file, first line, globals and closure are the ones that source reads.
        f = _unwrapped(f)
        if isinstance(f, Kernel) or type(f).__name__ == "Autotuner":
            what = "an autotuned kernel" if isinstance(getattr(f, "kernel", None), Kernel) else "a kernel already"
            raise CompileError([Diagnostic("SP0241", f"@sparsile.jit wraps a Python function; `{f.name}` is {what}",
                                           help="put @sparsile.autotune(...) above @sparsile.jit, and apply "
                                                "@sparsile.jit once")])
        if isinstance(f, functools.partial):
            raise CompileError([_partial_diagnostic(f)])
        if isinstance(f, type):  # (its source can be read: a class has no code to compile)
            raise CompileError([Diagnostic("SP0241", f"@sparsile.jit wraps a Python function; `{f.__qualname__}` is "
                                           "a class", help="decorate a `def` with @sparsile.jit: a kernel is a "
                                                           "function, launched as `kernel[grid](...)`")])
        try:
            src = inspect.getsource(f)
            filename = inspect.getsourcefile(f) or "<unknown>"
        except (OSError, TypeError, ValueError) as e:  # (ValueError: a __wrapped__ loop)
            _check_not_a_method(f, None, static, bound)
            raise CompileError([Diagnostic("SP0241", f"cannot read the source of `{getattr(f, '__name__', f)}`: {e}",
                                           help="define kernels in a file, or use sparsile.loads(text)")]) from None
        first_line = f.__code__.co_firstlineno
        node = parse_function_source(src, filename, first_line)
        _check_not_a_method(f, node, static, bound)
        check_options(options, lambda name: _option_span(node, name))
        return Kernel(node, _python_resolver(f), dict(options))

    return wrap(fn) if fn is not None else wrap


def _partial_diagnostic(f: functools.partial) -> Diagnostic:
    """SP0241 for ``sparsile.jit(functools.partial(fn, ...))``: a kernel is compiled from a function's
    source, and its parameters are all launch arguments; the bound ones are given at the launch."""
    inner = f.func
    kernel = isinstance(inner, Kernel)
    name = inner.name if kernel else getattr(inner, "__name__", type(inner).__name__)
    bound = [*(repr(a) for a in f.args), *(f"{k}={v!r}" for k, v in f.keywords.items())]
    call = ", ".join([*bound[:len(f.args)], "...", *bound[len(f.args):]])
    first = f"launch `{name}` itself" if kernel else f"decorate `{name}` itself with @sparsile.jit and launch it"
    return Diagnostic("SP0241", f"@sparsile.jit wraps a Python function; a `functools.partial` of `{name}` cannot be "
                      "jitted", help=f"{first} with the bound arguments (`{name}[grid]({call})`; a `constexpr` "
                      f"parameter is bound there), or write a kernel that calls `{name}` with them")


def _unwrapped(f: Any) -> Any:
    """``f`` without the wrappers of decorators that set ``__wrapped__`` (``functools.wraps``), as
    :func:`inspect.getsource` reads it; ``f`` itself when the chain is broken (a cycle)."""
    try:
        return inspect.unwrap(f)
    except ValueError:
        return f


def _python_resolver(f: Callable[..., Any]) -> Callable[[str], Any]:
    """How ``f``'s names resolve: closure, then module globals; each read is recorded while a kernel
    compiles, so that its caches know what it captured (frontend/sema/captures.py)."""
    return PythonGlobals(f, wrap_python_value)


_SELF_NAMES = ("self", "cls")


def _check_not_a_method(f: Callable[..., Any], node: A.FunctionDef | None, static: bool, bound: str | None) -> None:
    """SP0249 for a kernel that Python would bind to an instance or a class: a bound method or a
    classmethod (``bound``; or ``@classmethod`` above ``@sparsile.jit`` in ``node``), or a function
    of a class body whose first parameter is ``self`` or ``cls`` without ``@staticmethod``.

    A kernel's parameters are all launch arguments and a kernel is no descriptor, so nothing would
    pass the instance (the launch was SP0701, a missing argument). A function of a class body with
    another first parameter is a static function of the class, as with ``@staticmethod``. ``node``
    is None when the source cannot be read: the code object tells the parameters, without spans."""
    decorators = {d.id: d for d in node.decorators if isinstance(d, A.Name)} if node is not None else {}
    static = static or "staticmethod" in decorators
    if bound is None and "classmethod" in decorators:
        bound = "classmethod"
    code = getattr(f, "__code__", None)
    if code is None:  # not a Python function (its source could not be read either: SP0241)
        return
    first = code.co_varnames[0] if code.co_argcount else None
    qualname = getattr(f, "__qualname__", f.__name__)
    path = qualname.rsplit("<locals>.", 1)[-1]  # the classes around the function, then its name
    if bound is None:
        if static or "." not in path or first not in _SELF_NAMES:
            return
        bound = "method"
    takes = {"method": f"`{first}`", "classmethod": "the class", "bound method": "the instance it is bound to"}[bound]
    named = first is not None and (first in _SELF_NAMES or bound == "bound method")
    fix = f"define `{f.__name__}` at module level, or make it a @staticmethod (above or below @sparsile.jit)"
    if named:
        fix += f" without `{first}`, and pass what it reads from `{first}` as arguments"
    span = UNKNOWN_SPAN
    if node is not None:
        if named and node.params:
            span = node.params[0].span
        elif "classmethod" in decorators:
            span = decorators["classmethod"].span
        else:
            span = node.name_span
    raise CompileError([Diagnostic("SP0249", f"`{path}` is a {bound}: a kernel cannot take {takes}, since every "
                                             "parameter of a kernel is a launch argument", span, help=fix)])
