"""What a name can stand for during sema.

* an :class:`~sparsile.frontend.ir.core.Value` (a run-time scalar, tile, tensor or memory reference);
* a :class:`Const` (a compile-time constant: number, bool, string, None, dtype or type);
* a Python ``tuple`` of these (tuples exist only at compile time);
* a :class:`Builtin` (a language function such as ``load``), a :class:`Namespace` (``sp``,
  ``hopper``, ``tcgen05``), or a :class:`HelperFunction` (inlined at each call);
* :data:`POISON`, bound to a name whose definition failed, so that one mistake gives one diagnostic;
* :class:`Unbound`, bound to a name that has a value on some paths only (assigned in one branch of a
  run-time ``if``, or first assigned inside a run-time loop), so that a later use says why.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..diagnostics import CompileError
from ..spans import Span
from .host_calls import builtin_on_host


@dataclass(frozen=True)
class Const:
    """A compile-time constant. ``dtype`` is None for an untyped one (a literal, a constexpr, their
    Python arithmetic: weakly typed, docs/language.md rule 1) and the scalar type of a typed number
    (``f16(0.1)`` and what folding it gives, sema/typed_fold.py), which behaves as a value of that type."""

    value: Any
    dtype: Any = None

    def __repr__(self) -> str:
        return f"Const({self.value!r})" if self.dtype is None else f"Const({self.value!r}, {self.dtype})"


def is_constant_binding(binding: Any) -> bool:
    """Whether a parameter's binding from the specialization (``specialize.specialize``) is a
    compile-time constant, not passed to the kernel: a :class:`Const`, or a tuple of bindings (a
    constexpr tuple that holds a typed constant, ``(np.int8(3), 2)``, which sema holds as a tuple of
    constants; a run-time argument's binding is an ``ArgSpec``)."""
    return isinstance(binding, Const | tuple)


def constant_binding_value(binding: Any) -> Any:
    """The Python value of a constant binding (:func:`is_constant_binding`), a tuple element by element."""
    if isinstance(binding, tuple):
        return tuple(constant_binding_value(b) for b in binding)
    return binding.value


def kernel_object_name(x: Any) -> str | None:
    """The name of a sparsile kernel object (the driver's ``Kernel``, which a kernel inlines when it
    calls it: it has ``as_helper`` and a ``name``), told by its shape since the frontend does not
    import the driver; None for any other object (and for one whose attributes raise)."""
    try:
        name = getattr(x, "name", None)
        return name if isinstance(name, str) and callable(getattr(x, "as_helper", None)) else None
    except Exception:  # a property or __getattr__ that raises: not a kernel
        return None


def autotuned_kernel_name(x: Any) -> str | None:
    """The name of an autotuned kernel (the driver's ``Autotuner``: ``configs`` and the ``kernel``
    it tunes), told by its shape as :func:`kernel_object_name`; None for any other object."""
    try:
        if not hasattr(x, "configs"):
            return None
        return kernel_object_name(getattr(x, "kernel", None))
    except Exception:  # a property or __getattr__ that raises: not an autotuned kernel
        return None


def is_untyped_number(v: Any) -> bool:
    """A literal or untyped compile-time number (``1``, ``2.5``, ``True``; not ``u8(1)``)."""
    return isinstance(v, Const) and v.dtype is None and isinstance(v.value, bool | int | float)


class _Poison:
    def __repr__(self) -> str:
        return "POISON"


POISON = _Poison()


class PoisonError(Exception):
    """Raised when a poisoned value is used: the error was already reported."""


@dataclass(frozen=True)
class Unbound:
    """A name without a value on every path: ``why`` completes "`x` ..." in the diagnostic and
    ``span`` points at the statement that made it so."""

    why: str
    span: Span
    help: str = ""


@dataclass(frozen=True)
class AssignedLater:
    """What a nested helper's closure gives for a name of the function it is defined in that the
    function has not assigned yet (Python's unbound free variable): SP0202 at the use."""

    function: str


@dataclass(frozen=True)
class EnclosingScopeName:
    """What a nested ``@jit`` function's annotation gives for a name bound in an enclosing function
    or class body that the kernel cannot read (``from __future__ import annotations`` kept the
    annotation as text: frontend/sema/annotation_scope.py): SP0202 at the name, with ``message``
    and ``help``, never the module's value of that name."""

    message: str
    help: str


class UnreadableAnnotation(CompileError):
    """The SP0202 of an :class:`EnclosingScopeName`: raised even where a failed annotation is
    otherwise ignored (a helper's, read only for its ``constexpr``)."""


@dataclass(frozen=True)
class EmptyClosureCell:
    """What a ``@jit`` function's Python closure gives for a variable of an enclosing function that
    has no value yet (assigned after the kernel was defined, or deleted; Python's NameError "cannot
    access free variable"): SP0202 at the use, never the builtin or global of that name."""


@dataclass(frozen=True)
class Arg:
    """An argument of a builtin call: its sema value and the span of its expression."""

    value: Any
    span: Span


@dataclass
class Builtin:
    """A language builtin. ``impl(em, *args: Arg, **kwargs: Arg)`` emits IR through the emitter
    and returns a sema value. ``constexpr_args`` names the parameters that must be constants."""

    name: str
    impl: Callable[..., Any]
    doc: str = ""
    signature: inspect.Signature = field(init=False)
    host: Callable[..., Any] | None = None
    """What a call from plain Python computes, for the few builtins that mean the same there
    (``cdiv`` in a grid function, as ``triton.cdiv``); None: such a call raises."""

    def __post_init__(self) -> None:
        sig = inspect.signature(self.impl)
        params = list(sig.parameters.values())[1:]  # drop the emitter
        self.signature = sig.replace(parameters=params)
        if not self.doc:
            self.doc = inspect.getdoc(self.impl) or ""

    def __repr__(self) -> str:
        return f"<builtin {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.host is not None:
            return self.host(*args, **kwargs)
        raise builtin_on_host(self.name)  # SP0253, a RuntimeError too


@dataclass
class BoundMethod:
    """``value.method`` before it is called: a builtin with ``self`` bound."""

    builtin: Builtin
    self_arg: Arg


@dataclass
class Namespace:
    """A dotted namespace of builtins and constants (``sp``, ``hopper``, ``tcgen05``, ``math``)."""

    name: str
    members: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<namespace {self.name}>"

    def __getattr__(self, name: str) -> Any:
        members = self.__dict__.get("members", {})
        if name in members:
            m = members[name]
            return m.value if isinstance(m, Const) else m
        raise AttributeError(f"`{self.__dict__.get('name', '?')}` has no member `{name}`")


@dataclass
class HelperFunction:
    """A function called from a kernel; sema inlines its body at every call. ``globals`` resolves
    names that are not local (module constants for .spk, Python globals under @jit)."""

    node: Any  # ast.FunctionDef
    globals: Callable[[str], Any]
    name: str = ""
    imports: tuple[str, ...] = ()
    """The texts of the modules its ``.spk`` module imports, transitively (part of its fingerprint)."""

    def __repr__(self) -> str:
        return f"<helper {self.name or self.node.name}>"
