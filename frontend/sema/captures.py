"""What a ``@jit`` kernel captures from Python, and whether it has changed since the kernel compiled.

A ``@jit`` kernel reads names from its Python module and closure (``SCALE``, ``sp``, a ``@jit``
helper it inlines, ``cfg.BLOCK``) and folds their values into its IR. Every such read made while
sema builds an IR (or evaluates the parameter annotations and defaults) is recorded here: where
the name was read (the module's dict, the closure cell, the object an attribute was read from),
the object found there and a fingerprint of its value. The result is a :class:`CaptureSet`:

* :meth:`CaptureSet.still_valid` re-reads just those few places (a dict lookup, a cell read, a
  ``getattr`` each) and compares: the same object as before is unchanged (values of the kinds
  below are immutable, and a helper's own reads are recorded too); another object is compared by
  fingerprint. Every cache of a kernel (its IR per specialization, its GPU launchers) calls it
  before it reuses an entry, so the check is on the launch path and stays a few hundred ns. A fold
  that ran the code of a user's class (:func:`note_fold`: ``if cfg:`` with a ``__bool__``) is
  checked by folding again, a Python call.
* :meth:`CaptureSet.disk_key` is a process-independent text of every fingerprint: part of the
  disk cache key, so that another process with other values compiles anew.

Fingerprints: frontend/sema/fingerprints.py says what each kind of value is keyed on.

``.spk`` modules need none of this: their constants cannot change after loading and the whole
module text is already part of every key.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from .annotation_scope import AnnotationNames, keeps_annotations_as_text
from .fingerprints import MISSING, compared_by_value, fields_may_change, fingerprint
from .values import EmptyClosureCell

_state = threading.local()


class _Recorder:
    """The reads of one sema run, one entry per place read."""

    def __init__(self) -> None:
        self.reads: dict[tuple[Any, ...], _Read] = {}


class _Read:
    """One place a kernel read: ``fetch()`` gives what is there now."""

    __slots__ = ("by_value", "cell", "fetch", "fp", "globs", "ident", "obj", "where")

    def __init__(self, fetch: Callable[[], Any], where: tuple[Any, ...], obj: Any,
                 globs: dict[str, Any] | None = None, cell: Any = None, by_value: bool = False):
        self.ident: tuple[Any, ...] = ()
        self.globs = globs  # the dict read (a module's, or a function's annotations): checked inline by name
        self.cell = cell  # the closure cell read: checked inline too
        self.fetch = fetch
        self.where = where
        self.obj = obj
        self.fp = fingerprint(obj)
        self.by_value = by_value or compared_by_value(obj)

    def unchanged(self) -> bool:
        now = self.fetch()
        if now is self.obj and not self.by_value:
            return True
        if type(now) is not type(self.obj) or fingerprint(now) != self.fp or not _same_identity_kind(now, self.obj):
            return False
        self.obj = now  # an equal value in another object: later checks take the identity path again
        return True


class _Fold(_Read):
    """A fold that ran the code of a user's class (``if cfg:`` with a ``__bool__``): ``fetch()`` runs
    it again, and its result is compared by fingerprint (note_fold); only :meth:`unchanged` calls it
    (``by_value``), and an exception there is a change."""

    __slots__ = ()

    def unchanged(self) -> bool:
        try:
            now = self.fetch()
        except Exception:  # the code fails now: a change (the new compile reports it)
            return False
        return now is self.obj or (type(now) is type(self.obj) and fingerprint(now) == self.fp)


def _same_identity_kind(a: Any, b: Any) -> bool:
    """Objects compared by identity (kernels, helpers, arbitrary objects) must be the same one,
    in tuples and lists too, and the elements of one class (a class defined again under its name,
    an enum's members of equal fingerprints, may fold through other code: sema/class_code.py)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same_identity_kind(x, y) for x, y in zip(a, b, strict=True))
    return not _by_identity(a)


def _by_identity(obj: Any) -> bool:
    return fingerprint(obj)[0] in ("kernel", "helper", "object", "module", "class", "function")


class CaptureSet:
    """The captured reads of one IR (and of the parameter annotations it was specialized with)."""

    __slots__ = ("_cells", "_globals", "_rest", "reads")

    def __init__(self, reads: tuple[_Read, ...] = ()):
        self.reads = reads
        self._regroup()

    def _regroup(self) -> None:
        """Globals and closure cells are checked inline (a dict lookup or a cell read and an
        identity test each, no call through a ``_Read``); attributes and values compared by value
        through their read."""
        fast: list[tuple[dict[str, Any], str, Any]] = []
        cells: list[tuple[Any, Any]] = []
        rest: list[_Read] = []
        for r in self.reads:
            if r.globs is not None and not r.by_value:
                fast.append((r.globs, r.where[2], r.obj))
            elif r.cell is not None and not r.by_value:
                cells.append((r.cell, r.obj))
            else:
                rest.append(r)
        self._globals = tuple(fast)
        self._cells = tuple(cells)
        self._rest = tuple(rest)

    def __bool__(self) -> bool:
        return bool(self.reads)

    def __len__(self) -> int:
        return len(self.reads)

    def still_valid(self) -> bool:
        """Whether every captured place still holds what the kernel compiled with."""
        for globs, name, obj in self._globals:
            if globs.get(name, MISSING) is not obj:
                return self._check_each()
        for cell, obj in self._cells:
            try:
                now = cell.cell_contents
            except ValueError:  # an emptied cell (`del` of the variable)
                now = MISSING
            if now is not obj:
                return self._check_each()
        for r in self._rest:  # a C call and an identity test per read
            if (r.by_value or r.fetch() is not r.obj) and not r.unchanged():
                return False
        return True

    def _check_each(self) -> bool:
        """Every read compared by value (some global is another object now)."""
        for r in self.reads:
            if (r.by_value or r.fetch() is not r.obj) and not r.unchanged():
                return False
        self._regroup()  # equal values in new objects: the inline identity test holds again
        return True

    def changed(self) -> list[str]:
        """The places whose value changed, described for messages and tests."""
        return [_describe(r.where) for r in self.reads if not r.unchanged()]

    def disk_key(self) -> str:
        """A text of every captured place and value fingerprint, the same in every process."""
        return repr(sorted(repr((r.where, r.fp)) for r in self.reads))

    def __add__(self, other: CaptureSet) -> CaptureSet:
        if not other.reads:
            return self
        if not self.reads:
            return other
        seen = {r.ident for r in self.reads}
        return CaptureSet(self.reads + tuple(r for r in other.reads if r.ident not in seen))


EMPTY = CaptureSet()


def _describe(where: tuple[Any, ...]) -> str:
    kind = where[0]
    if kind == "global":
        return f"global `{where[2]}` of module `{where[1]}`"
    if kind == "closure":
        return f"closure variable `{where[2]}` of `{where[1]}`"
    if kind == "default":
        return f"the default of parameter `{where[2]}` of `{where[1]}`"
    if kind == "defaults":
        return f"the parameter defaults of `{where[1]}`"
    if kind == "kwdefaults":
        return f"the keyword-only parameter defaults of `{where[1]}`"
    if kind == "annotation":
        return f"the annotation of parameter `{where[2]}` of `{where[1]}`"
    if kind == "folded":
        return f"the fields of a {where[1][1]} the kernel compared"
    if kind == "fold":
        return f"what {where[1]} gave at line {where[2][0]} of the kernel (its class's own code ran)"
    return f"attribute `{where[2]}` of {where[1][0]} {where[1][1]}"


def recording() -> _Recording:
    """``with recording() as r:`` collects the captured reads of the code inside; ``r.captures``
    is then the :class:`CaptureSet`."""
    return _Recording()


class _Recording:
    def __init__(self) -> None:
        self.captures = EMPTY
        self._recorder = _Recorder()

    def __enter__(self) -> _Recording:
        stack = getattr(_state, "stack", None)
        if stack is None:
            stack = _state.stack = []
        stack.append(self._recorder)
        return self

    def __exit__(self, *exc: object) -> None:
        _state.stack.pop()
        self.captures = CaptureSet(tuple(self._recorder.reads.values()))


def _note(ident: tuple[Any, ...], make: Callable[[], _Read]) -> None:
    stack = getattr(_state, "stack", None)
    if not stack:
        return
    read = None
    for rec in stack:  # a read inside a nested recording counts for the outer ones too
        if ident not in rec.reads:
            if read is None:
                read = make()
                read.ident = ident
            rec.reads[ident] = read


def note_attribute(base: Any, attr: str, value: Any) -> None:
    """Record that a kernel read ``base.attr`` (and found ``value``)."""
    if getattr(_state, "stack", None):
        _note(("attr", id(base), attr), lambda: _Read(_attr_fetch(base, attr), ("attr", fingerprint(base)[:2], attr),
                                                      value))


def note_folded(obj: Any) -> None:
    """Record that a kernel folded the value of ``obj``, a ``SimpleNamespace`` or dataclass instance
    whose fields may change in place (``cfg == FAST``): its fields are compared at every check, not
    its identity (a kernel that only reads ``cfg.block`` keeps the identity test of its reads)."""
    if getattr(_state, "stack", None) and fields_may_change(obj):
        _note(("folded", id(obj)), lambda: _Read(lambda: obj, ("folded", fingerprint(obj)[:2], ""), obj,
                                                 by_value=True))


def note_fold(use: str, operands: tuple[Any, ...], position: tuple[int, int], recompute: Callable[[], Any],
              result: Any) -> None:
    """Record that a kernel folded ``use`` (`` `==` ``, ``the condition``) of the Python values
    ``operands`` at ``position`` (line and column in its source) to ``result``, running the code of a
    user's class (frontend/sema/class_code.py): the result is part of the disk key, and every check
    calls ``recompute`` (which folds them again) and compares what it gives (an exception is a change)."""
    if getattr(_state, "stack", None):
        where = ("fold", use, position, tuple(fingerprint(x) for x in operands))
        _note(("fold", use, position, tuple(map(id, operands))),
              lambda: _Fold(recompute, where, result, by_value=True))


def _attr_fetch(base: Any, attr: str) -> Callable[[], Any]:
    def fetch() -> Any:
        try:
            return getattr(base, attr)
        except Exception:  # the attribute went away: a change
            return MISSING

    return fetch


class PythonGlobals:
    """How a ``@jit`` function's names resolve: its closure, then its module's globals (then the
    language's builtins, which sema looks up when this raises KeyError). Every lookup made while a
    :func:`recording` is active is recorded, misses included (a global defined later would shadow
    the builtin)."""

    def __init__(self, f: Callable[..., Any], wrap: Callable[[Any], Any]):
        code = f.__code__  # type: ignore[attr-defined]
        self.closure = dict(zip(code.co_freevars, f.__closure__ or (), strict=False))  # type: ignore[attr-defined]
        self.globs: dict[str, Any] = f.__globals__  # type: ignore[attr-defined]
        self.where = str(f.__qualname__)  # type: ignore[attr-defined]
        self.module = str(self.globs.get("__name__", "?"))
        self._wrap = wrap
        self._function = f
        self.nested = "." in self.where
        """Whether the function is defined in another function or a class body: Python evaluated its
        parameter annotations there, in a scope no kernel can read again (:meth:`python_annotation`)."""
        self._annotation_names: AnnotationNames | None = None
        if self.nested and keeps_annotations_as_text(f) and any(k != "return" for k in _python_annotations(f)):
            # the enclosing scopes are read now, with the kernel's source (annotation_scope.py)
            self._annotation_names = AnnotationNames(self, f, self.closure)

    @property
    def function(self) -> Callable[..., Any]:
        """The ``@jit`` function whose names this resolves."""
        return self._function

    def python_default(self, name: str) -> Any:
        """The default of parameter ``name`` as Python evaluated it when the ``def`` ran, wrapped
        (and recorded as a read, which a changed ``__defaults__`` / ``__kwdefaults__``
        invalidates), module level or nested: what ``inspect.signature`` shows and a Python call
        passes (docs/language.md, "What a kernel captures"); MISSING when it has none."""
        f = self._function
        value = _python_defaults(f).get(name, MISSING)
        if value is MISSING:
            return MISSING
        if getattr(_state, "stack", None):
            # Checked at every launch, so each read is a C call and an identity test: the tuple of
            # positional defaults as a whole, a keyword-only default in its dict (as a global).
            kwdefaults = f.__kwdefaults__
            if kwdefaults is not None and name in kwdefaults:
                _note(("default", id(f), name), lambda: _Read(functools.partial(kwdefaults.get, name, MISSING),
                                                              ("default", self.where, name), value, kwdefaults))
                # and the dict itself, by identity: `f.__kwdefaults__ = {...}` replaces it
                _note(("kwdefaults", id(f)), lambda: _Read(functools.partial(getattr, f, "__kwdefaults__"),
                                                           ("kwdefaults", self.where, ""), kwdefaults))
            else:
                _note(("defaults", id(f)), lambda: _Read(functools.partial(getattr, f, "__defaults__"),
                                                         ("defaults", self.where, ""), f.__defaults__))
        return self._wrap(value)

    def python_annotation(self, name: str) -> Any:
        """The annotation of parameter ``name`` as Python evaluated it when the ``def`` ran,
        wrapped and recorded as :meth:`python_default` is, for a nested function. MISSING for a
        module-level function (sema evaluates its annotations in the module), when the parameter
        has none, and when Python's value is text (``from __future__ import annotations``, or a
        quoted annotation) or a Python builtin type (``int``, which the language does not take as
        a type): sema evaluates the source then, in :meth:`annotation_resolver`'s names."""
        if not self.nested:
            return MISSING
        f = self._function
        value = _python_annotations(f).get(name, MISSING)
        if value is MISSING or isinstance(value, str) or _builtin_type(value):
            return MISSING
        if getattr(_state, "stack", None):  # checked inline at every launch, as a global is
            annotations = _python_annotations(f)
            _note(("annotation", id(f), name), lambda: _Read(functools.partial(annotations.get, name, MISSING),
                                                             ("annotation", self.where, name), value, annotations))
        return self._wrap(value)

    def annotation_resolver(self) -> Callable[[str], Any]:
        """How the names of an annotation's source text resolve: as the body's (this resolver),
        except in a nested function compiled under ``from __future__ import annotations``, whose
        annotations may name what only the enclosing scope had (frontend/sema/annotation_scope.py)."""
        return self if self._annotation_names is None else self._annotation_names

    def __call__(self, name: str) -> Any:
        cell = self.closure.get(name)
        if cell is not None:
            try:
                obj = cell.cell_contents
            except ValueError:
                obj = MISSING
            if getattr(_state, "stack", None):
                _note(("closure", id(cell)), lambda: _Read(lambda: _cell_value(cell), ("closure", self.where, name),
                                                           obj, cell=cell))
            if obj is MISSING:
                return EmptyClosureCell()
            return self._wrap(obj)
        globs = self.globs
        obj = globs.get(name, MISSING)
        if getattr(_state, "stack", None):
            _note(("global", id(globs), name),
                  lambda: _Read(functools.partial(globs.get, name, MISSING), ("global", self.module, name), obj,
                                globs))
        if obj is MISSING:
            if name in ("True", "False", "None"):
                return self._wrap({"True": True, "False": False, "None": None}[name])
            raise KeyError(name)
        return self._wrap(obj)


def python_default(resolver: Any, name: str) -> Any:
    """:meth:`PythonGlobals.python_default` of a ``@jit`` function's resolver; MISSING for any
    other resolver (a ``.spk`` module's, a helper nested in a kernel)."""
    return resolver.python_default(name) if isinstance(resolver, PythonGlobals) else MISSING


def python_default_value(resolver: Any, name: str) -> Any:
    """The default of parameter ``name`` of a ``@jit`` function as Python evaluated it, unwrapped
    and not recorded (:func:`python_default` records the read); MISSING otherwise."""
    if not isinstance(resolver, PythonGlobals):
        return MISSING
    return _python_defaults(resolver.function).get(name, MISSING)


def python_annotation(resolver: Any, name: str) -> Any:
    """:meth:`PythonGlobals.python_annotation` of a ``@jit`` function's resolver; MISSING for any
    other resolver."""
    return resolver.python_annotation(name) if isinstance(resolver, PythonGlobals) else MISSING


def annotation_resolver(resolver: Any) -> Any:
    """:meth:`PythonGlobals.annotation_resolver` of a ``@jit`` function's resolver; any other
    resolver itself."""
    return resolver.annotation_resolver() if isinstance(resolver, PythonGlobals) else resolver


def _python_annotations(f: Any) -> dict[str, Any]:
    """Parameter name -> the annotation Python evaluated (text under PEP 563)."""
    annotations = getattr(f, "__annotations__", None)
    return annotations if isinstance(annotations, dict) else {}


def _builtin_type(value: Any) -> bool:
    return isinstance(value, type) and value.__module__ == "builtins"


def _python_defaults(f: Any) -> dict[str, Any]:
    """Parameter name -> the default value Python evaluated, positional and keyword-only."""
    code = f.__code__
    positional = code.co_varnames[:code.co_argcount]
    defaults = f.__defaults__ or ()
    out = dict(zip(positional[len(positional) - len(defaults):], defaults, strict=True))
    out.update(f.__kwdefaults__ or {})
    return out


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return MISSING
