"""Sema: from the AST of a kernel to the typed IR.

Name resolution (locals, then the kernel's globals — module constants of a ``.spk`` file or the
Python globals and closure of a ``@jit`` function — then builtins), constant evaluation,
specialization of parameters, statements, and helper functions inlined at each call. Expressions
are in :mod:`sema_expr`, structured control flow in :mod:`sema_control`.

Several errors are collected per kernel: a statement that fails poisons the names it defines, so
later uses do not report again; the same diagnostic reached twice (a helper inlined twice) is
reported once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..diagnostics import CompileError, Diagnostic, DiagnosticBag, InternalError, Severity, not_a_value
from ..ir import types as T
from ..ir.core import Block, Builder, Function, Param, Region, Value
from ..spans import Span
from ..syntax import ast as A
from .call_help import in_a_default
from .captures import MISSING, annotation_resolver, python_annotation, python_default, python_default_value
from .control import ControlFlowMixin
from .expr import ExprMixin
from .jit_globals import default_as_argument
from .keyed_values import keyed_truth
from .scope import ReturnSignal, Scope, assigned_names, ends_in_return
from .type_ctors import annotation_help
from .values import POISON, Arg, AssignedLater, Const, HelperFunction, PoisonError, UnreadableAnnotation

__all__ = ["MAX_INLINE_DEPTH", "ArgSpec", "Frame", "ReturnSignal", "Scope", "Sema", "assigned_names"]

MAX_INLINE_DEPTH = 32
MAX_STATEMENTS = 100_000
"""Statements sema may analyse for one kernel (after unrolling and inlining): a bound on the work a
pathological program (nested ``static_range``, helpers that call themselves many times) can cause."""


class SemaAborted(Exception):
    """Sema gave up on the whole kernel (not one statement): carries the diagnostic that says why."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


@dataclass(frozen=True)
class ArgSpec:
    """What the specialization key records about a run-time argument."""

    type: T.Type
    divisible_16: bool = False

    def key(self) -> tuple[Any, ...]:
        return (_type_name(self.type), self.divisible_16)

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def of(t: T.Type, divisible_16: bool = False) -> ArgSpec:
        """The (shared, immutable) ArgSpec for ``t``: the launch path asks for one per argument and call."""
        return ArgSpec(t, divisible_16)


@functools.lru_cache(maxsize=1024)
def _type_name(t: T.Type) -> str:
    """``str(t)``, kept per type: every launch builds the key of every argument."""
    return str(t)


@dataclass
class Frame:
    """One inlined function (or the kernel itself). ``scope`` is the frame's scope at its latest
    call into a helper, so that a helper nested in this function reads the names it closes over
    as they are at the call (Python's late binding)."""

    name: str
    globals: Callable[[str], Any]
    is_kernel: bool
    depth: int = 0
    scope: Scope | None = None
    returns: list[ReturnSignal] = field(default_factory=list)
    local_names: frozenset[str] = frozenset()
    """The function's parameters and every name its body assigns: its own names from its first
    statement on, as in Python (before the assignment they have no value; the module's are not read)."""


def function_locals(node: A.FunctionDef) -> frozenset[str]:
    """The names local to ``node``: its parameters and the names its body binds."""
    return frozenset([*(p.name for p in node.params), *assigned_names(node.body)])


class Sema(ExprMixin, ControlFlowMixin):
    """Builds the IR of one kernel. ``globals_resolver`` resolves non-local names (raises KeyError)."""

    def __init__(self, globals_resolver: Callable[[str], Any], source_name: str = "<kernel>"):
        self.bag = DiagnosticBag()
        self.globals_resolver = globals_resolver
        self.builder = Builder(Block())
        self.current_span: Span | None = None
        self.frames: list[Frame] = []
        self.scope = Scope()
        self.source_name = source_name
        self.in_trial = False
        self.statements = 0
        self.too_deep: set[int] = set()  # helpers whose recursion was reported
        self.constant_params: dict[int, tuple[str, Const]] = {}  # id of a parameter's Const -> (name, it)
        self.constant_uses: dict[Span, str] = {}  # span of a name whose value is that Const -> the parameter
        self.constant_notes: Mapping[str, str] = {}

    # ------------------------------------------------------------------------------ entry point
    def kernel(self, node: A.FunctionDef, bindings: dict[str, Any], attrs: dict[str, Any] | None = None,
               notes: Mapping[str, str] | None = None) -> Function:
        """The IR of kernel ``node`` with its parameters bound: a :class:`Const` for each
        constexpr parameter (and pointer given None) and an :class:`ArgSpec` for each run-time one.
        ``notes``: what a diagnostic at a use of such a Const parameter's value says of it, by
        parameter name (``specialize.constant_notes``: the value it was given)."""
        self.constant_notes = notes or {}
        body = Region(Block())
        self.builder = Builder(body.block)
        params: list[Param] = []
        self.scope = Scope()
        for p in node.params:
            b = bindings.get(p.name)
            if isinstance(b, Const):
                params.append(Param(p.name, None, None, b.value, p.span))
                self.scope.names[p.name] = b
                if p.name in self.constant_notes:
                    self.constant_params[id(b)] = (p.name, b)
            elif isinstance(b, tuple):  # a constexpr tuple holding typed constants (`(u8(250), 3)`)
                params.append(Param(p.name, None, None, _tuple_values(b), p.span))
                self.scope.names[p.name] = b
            elif isinstance(b, ArgSpec):
                v = body.block.add_arg(b.type, p.name)
                params.append(Param(p.name, b.type, v, None, p.span, b.divisible_16))
                self.scope.names[p.name] = v
            elif b is POISON:  # `sparsile check` of a parameter without a type: its uses are not checked
                self.scope.names[p.name] = POISON
            else:
                raise InternalError(f"parameter {p.name!r} of {node.name} has no binding", p.span)
        func = Function(node.name, params, body, dict(attrs or {}), node.span)
        self.kernel_attrs = func.attrs  # read by builtins that depend on kernel options (cluster shape)
        self.frames = [Frame(node.name, self.globals_resolver, True, local_names=function_locals(node))]
        try:
            ret = self.block(node.body)
        except SemaAborted as e:
            self.bag.add(e.diagnostic)
            ret = None
        if isinstance(ret, ReturnSignal) and ret.value is not None and not (
                isinstance(ret.value, Const) and ret.value.value is None):
            self.bag.error("SP0207", "a kernel cannot return a value", ret.span,
                           help="store results through a pointer or tensor parameter")
        self._dedupe()
        self._note_constant_parameters()
        self.bag.raise_if_errors()
        return func

    def note_constant_use(self, span: Span, value: Const) -> None:
        """Remember that the name at ``span`` has the value of a Const parameter (read by
        :meth:`_note_constant_parameters`); the parameter's own object only, not a value equal
        to it (a local that shadows it)."""
        found = self.constant_params.get(id(value))
        if found is not None and found[1] is value:
            self.constant_uses[span] = found[0]

    def _note_constant_parameters(self) -> None:
        """Add to each diagnostic that points at a use of a Const parameter the note saying what
        the parameter was given: at the use itself (the diagnostic's span or a label's) or inside
        the one line the diagnostic points at (``(BLOCK,)``, ``BLOCK * 2``)."""
        if not self.constant_uses:
            return
        for i, d in enumerate(self.bag.items):
            spans = (d.span, *(label.span for label in d.labels))
            names = dict.fromkeys([*(self.constant_uses[s] for s in spans if s in self.constant_uses),
                                   *(name for use, name in self.constant_uses.items() if _within(use, d.span))])
            added = tuple(n for n in (self.constant_notes[name] for name in names) if n not in d.notes)
            if added:
                self.bag.items[i] = dataclasses.replace(d, notes=(*d.notes, *added))

    def _dedupe(self) -> None:
        seen: set[tuple[str, str, Span]] = set()
        unique = []
        for d in self.bag.items:
            k = (d.code, d.message, d.span)
            if k not in seen:
                seen.add(k)
                unique.append(d)
        self.bag.items[:] = unique

    # ------------------------------------------------------------------------------ outside kernels
    def evaluate(self, node: A.Expr, what: str | None = None) -> Any:
        """An expression evaluated outside a kernel body (a module constant, a decorator option, a
        parameter annotation or default, a signature item): its sema value, or with ``what`` its
        compile-time Python value. Errors inside helpers it calls are raised, not swallowed."""
        try:
            return self.expr(node) if what is None else self.const_expr(node, what)
        except SemaAborted as e:
            raise CompileError([*self.bag.items, e.diagnostic]) from None
        except PoisonError:
            if not self.bag.has_errors:
                raise InternalError("an expression failed without a diagnostic", node.span) from None
            raise CompileError(self.bag.items) from None
        except RecursionError:
            raise CompileError([*self.bag.items, Diagnostic(
                "SP0205", "the expression is nested too deeply to evaluate", node.span,
                help="split it into named constants")]) from None

    # ------------------------------------------------------------------------------ utilities
    def resolve_global(self, name: str) -> Any:
        return (self.frames[-1].globals if self.frames else self.globals_resolver)(name)

    def bind(self, name: str, value: Any) -> None:
        self.scope.names[name] = value

    def lookup_local(self, name: str) -> Any:
        return self.scope.lookup(name)

    # ------------------------------------------------------------------------------ statements
    def block(self, stmts: list[A.Stmt]) -> ReturnSignal | None:
        """Run a statement list; returns a ReturnSignal if every path through it returned."""
        i = 0
        while i < len(stmts):
            s = stmts[i]
            # `if c: ...; return` followed by more statements: the rest is the else branch.
            if isinstance(s, A.If) and not s.orelse and ends_in_return(s.body) and i + 1 < len(stmts):
                merged = A.If(test=s.test, body=s.body, orelse=list(stmts[i + 1:]), span=s.span)
                return self.statement(merged)
            ret = self.statement(s)
            if ret is not None:
                if i + 1 < len(stmts):
                    self.bag.warning("SP0208", "unreachable code after `return`", stmts[i + 1].span)
                return ret
            i += 1
        return None

    def statement(self, s: A.Stmt) -> ReturnSignal | None:
        self.current_span = s.span
        self.statements += 1
        if self.statements > MAX_STATEMENTS:
            raise SemaAborted(Diagnostic(
                "SP0239", f"the kernel grows to more than {MAX_STATEMENTS} statements once loops are unrolled and "
                "helpers inlined", s.span, help="use `range` instead of `static_range` for long loops"))
        try:
            return self._statement(s)
        except PoisonError:
            self._poison_targets(s)
        except CompileError as e:
            self.bag.extend(e.diagnostics)
            self._poison_targets(s)
        except RecursionError:
            self.bag.error("SP0205", "the program is nested too deeply to compile", s.span)
            self._poison_targets(s)
        except T.NotAValueTypeError as e:  # an operator applied to a descriptor, buffer or barrier
            self.bag.add(not_a_value(e, "this statement", s.span))
            self._poison_targets(s)
        return None

    def _poison_targets(self, s: A.Stmt) -> None:
        for name in assigned_names([s]):
            self.bind(name, POISON)

    def _statement(self, s: A.Stmt) -> ReturnSignal | None:
        if isinstance(s, A.Assign):
            value = self.expr(s.value)
            for t in s.targets:
                self.assign(t, value, s.value.span)
        elif isinstance(s, A.AnnAssign):
            self.ann_assign(s)
        elif isinstance(s, A.AugAssign):
            current = self.expr(s.target)
            value = self.binop(s.op, current, self.expr(s.value), s.target.span, s.value.span, s.span)
            self.assign(s.target, value, s.span)
        elif isinstance(s, A.ExprStmt):
            if isinstance(s.value, A.Constant) and isinstance(s.value.value, str):
                return None  # a docstring or a string statement
            self.expr(s.value)
        elif isinstance(s, A.If):
            return self.if_stmt(s)
        elif isinstance(s, A.For):
            self.for_stmt(s)
        elif isinstance(s, A.While):
            self.while_stmt(s)
        elif isinstance(s, A.Return):
            value = self.expr(s.value) if s.value is not None else None
            return ReturnSignal(value, s.span)
        elif isinstance(s, A.Pass):
            pass
        elif isinstance(s, A.Break | A.Continue):
            word = "break" if isinstance(s, A.Break) else "continue"
            raise self.error("SP0203", f"`{word}` is not supported in kernels", s.span,
                             help="express the exit in the condition of a `while` loop, or mask the work")
        elif isinstance(s, A.Assert):
            self.assert_stmt(s)
        elif isinstance(s, A.FunctionDef):
            if s.decorators:
                raise self.error("SP0206", f"a decorator on `{s.name}`, a function defined inside a kernel, has no "
                                 "effect", s.decorators[0].span,
                                 help="remove the decorator: a `def` inside a kernel is a helper inlined where it "
                                      "is called; define kernels at module level")
            self.bind(s.name, HelperFunction(s, self._closure_resolver(), s.name))
        elif isinstance(s, A.Import | A.ImportFrom):
            raise self.error("SP0209", "imports are not allowed inside a kernel", s.span,
                             help="import at module level; kernels see module names as constants")
        else:
            raise self.error("SP0210", f"`{type(s).__name__}` statements are not supported in kernels", s.span)
        return None

    def _closure_resolver(self) -> Callable[[str], Any]:
        """How a helper defined here resolves the names it does not bind: the defining function's
        names as they are at the call, then that function's globals."""
        frame = self.frames[-1]
        def_scope = self.scope
        outer = frame.globals

        def resolve(name: str) -> Any:
            live = frame.scope if frame in self.frames and frame.scope is not None else def_scope
            try:
                return live.lookup(name)
            except KeyError:
                if name in frame.local_names:  # assigned later in the defining function
                    return AssignedLater(frame.name)
                return outer(name)

        return resolve

    def assign(self, target: A.Expr, value: Any, value_span: Span) -> None:
        if isinstance(target, A.Name):
            if value is None:
                raise self.error("SP0211", "this call returns nothing; there is no value to assign", value_span)
            self.bind(target.id, value)
        elif isinstance(target, A.Tuple | A.List):
            if not isinstance(value, tuple):
                if isinstance(value, Const) and isinstance(value.value, tuple):
                    value = tuple(Const(v) for v in value.value)
                else:
                    raise self.error("SP0212", f"cannot unpack {self.describe(value)} into {len(target.elts)} names",
                                     value_span)
            if len(value) != len(target.elts):
                raise self.error("SP0212", f"expected {len(target.elts)} values to unpack, found {len(value)}",
                                 value_span)
            for t, v in zip(target.elts, value, strict=True):
                self.assign(t, v, value_span)
        elif isinstance(target, A.Subscript | A.Attribute):
            raise self.error("SP0213", "tiles and tensors are values: an element or attribute cannot be assigned",
                             target.span, help="build a new tile with `where(mask, new, old)`, or `store` to memory")
        else:
            raise self.error("SP0213", "cannot assign to this expression", target.span)

    def ann_assign(self, s: A.AnnAssign) -> None:
        ann = self.const_expr(s.annotation, "a type annotation")
        if not isinstance(ann, T.Type):
            raise self.error("SP0302", f"an annotation must be a type such as `i32` or `constexpr`, found "
                             f"{self.describe(Const(ann))}",
                             s.annotation.span, help=annotation_help(ann))
        if s.value is None:
            return
        value = self.expr(s.value)
        if isinstance(ann, T.ScalarType):
            em = self.emitter()
            v = em.tile_or_scalar(Arg(value, s.value.span), like=ann)
            if isinstance(T.element_type(v.type), T.PointerType):
                raise self.error("SP0345", f"`{_target_text(s.target)}` is declared {ann} but the value is "
                                 f"{v.type}", s.value.span)
            value = em.cast(v, ann)
        elif ann is T.CONSTEXPR:
            if not isinstance(value, Const | tuple):
                raise self.error("SP0201", "a `constexpr` variable needs a compile-time value, found "
                                 f"{self.describe(value)}", s.value.span)
        else:
            v = self.emitter().value(Arg(value, s.value.span))
            if v.type != ann:
                raise self.error("SP0345", f"`{_target_text(s.target)}` is declared {ann} but the value is {v.type}",
                                 s.value.span)
        self.assign(s.target, value, s.value.span)

    def assert_stmt(self, s: A.Assert) -> None:
        cond = self.expr(s.test)
        msg = "assertion failed"
        if s.msg is not None:
            m = self.expr(s.msg)
            if isinstance(m, Const) and isinstance(m.value, str):
                msg = m.value
        if isinstance(cond, Const | tuple):
            if not keyed_truth(cond, s.test.span):
                raise self.error("SP0320", f"static assertion failed: {msg}", s.test.span)
            return
        em = self.emitter()
        v = em.tile_or_scalar(Arg(cond, s.test.span))
        if T.element_type(v.type) != T.bool_:
            raise self.error("SP0312", f"an assert condition must be bool, found {v.type}", s.test.span,
                             help="compare explicitly, e.g. `x != 0`")
        em.create("device_assert", [v], [], {"message": msg})

    # ------------------------------------------------------------------------------ partitions
    def run_partition(self, helper: Any, args: list[Any], block: Any, span: Span) -> None:
        """Inline a ``warp_specialize`` partition's helper into its region ``block``. Tiles live in
        the registers of particular warps, so none may cross into a partition."""
        for a in args:
            if isinstance(a, Value) and isinstance(a.type, T.TileType):
                raise self.error("SP0355", "a tile cannot be passed into a warp_specialize partition: its "
                                 "registers belong to other warps", span,
                                 help="pass shared-memory buffers, barriers, tensors or scalars instead")
        saved = self.builder
        self.builder = Builder(block)
        try:
            ret = self.inline_call(helper, args, {}, span)
        finally:
            self.builder = saved
        if ret is not None:
            raise self.error("SP0356", "a warp_specialize partition cannot return a value", span,
                             help="communicate through shared memory or global memory")

    # ------------------------------------------------------------------------------ inlining
    def inline_call(self, helper: Any, args: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
        """Inline ``helper`` at a call: bind its parameters, run its body in a fresh scope and
        return its return value (None when it returns nothing)."""
        node: A.FunctionDef = helper.node
        if id(node) in self.too_deep:
            raise PoisonError()  # already reported: do not explore the recursion again
        if len(self.frames) > MAX_INLINE_DEPTH:
            self.too_deep.add(id(node))
            raise self.error("SP0205", f"helper `{node.name}` is inlined more than {MAX_INLINE_DEPTH} levels deep "
                             "(recursion is not supported)", span)
        bound = self._bind_helper_args(node, args, kwargs, span)
        caller = self.frames[-1] if self.frames else None
        saved_scope, saved_caller_scope = self.scope, caller.scope if caller else None
        if caller is not None:
            caller.scope = self.scope
        frame = Frame(node.name, helper.globals, False, len(self.frames))
        self.frames.append(frame)
        first_new = len(self.bag.items)
        try:
            # Defaults and annotations are read where the `def` is, as in Python (the module, or
            # the function it is nested in): none of the helper's own names is bound yet.
            self.scope = Scope()
            frame.globals = annotation_resolver(helper.globals)  # its annotations' names, as Python reads them
            for p in node.params:
                if p.name not in bound:
                    if p.default is None:
                        raise self.error("SP0321", f"`{node.name}` is missing the argument `{p.name}`", span,
                                         help=f"signature: {_helper_signature(node)}")
                    default = python_default(helper.globals, p.name)  # a @jit function's: Python's
                    bound[p.name] = self._default_value(p) if default is MISSING else \
                        default_as_argument(python_default_value(helper.globals, p.name), p.default, default)
                if p.annotation is not None:
                    ann = python_annotation(helper.globals, p.name)  # a nested @jit function's: Python's
                    ann = self._annotation_value(p.annotation) if ann is MISSING else getattr(ann, "value", None)
                    if ann is T.CONSTEXPR and not isinstance(bound[p.name], Const | tuple):
                        raise self.error("SP0201", f"`{p.name}` of `{node.name}` is constexpr but received "
                                         f"{self.describe(bound[p.name])}", span)
            frame.globals = helper.globals
            self.scope.names.update((p.name, bound[p.name]) for p in node.params)
            frame.local_names = function_locals(node)
            ret = self.block(node.body)
        finally:
            self.scope = saved_scope
            self.frames.pop()
            if caller is not None:
                caller.scope = saved_caller_scope
            self._note_inlined(first_new, node.name, span)
        if any(d.severity is Severity.ERROR for d in self.bag.items[first_new:]):
            raise PoisonError()
        return None if ret is None else ret.value

    def _bind_helper_args(self, node: A.FunctionDef, args: list[Any], kwargs: dict[str, Any], span: Span
                          ) -> dict[str, Any]:
        positional = [p for p in node.params if p.kind == "positional"]
        if len(args) > len(positional):
            raise self.error("SP0321", f"`{node.name}` takes {len(positional)} positional arguments but "
                             f"{len(args)} were given", span, help=f"signature: {_helper_signature(node)}")
        bound = {p.name: a for p, a in zip(positional, args, strict=False)}
        names = {p.name for p in node.params}
        for k, v in kwargs.items():
            if k not in names:
                raise self.error("SP0322", f"`{node.name}` has no parameter named `{k}`", span,
                                 help=f"signature: {_helper_signature(node)}")
            if k in bound:
                raise self.error("SP0323", f"`{node.name}` got two values for `{k}`", span)
            bound[k] = v
        return bound

    def _note_inlined(self, first: int, name: str, call_span: Span) -> None:
        """Say at which call a diagnostic inside a helper's body was found."""
        note = f"in `{name}`, inlined at {call_span}"
        for i in range(first, len(self.bag.items)):
            d = self.bag.items[i]
            if d.span.source is call_span.source and d.span.line == call_span.line:
                continue
            if note not in d.notes:
                self.bag.items[i] = dataclasses.replace(d, notes=(*d.notes, note))

    def _default_value(self, p: A.Param) -> Any:
        """A helper parameter's default, evaluated as kernel code (a call the language cannot make
        there gets the help for a default computed by Python code)."""
        assert p.default is not None
        try:
            return self.expr(p.default)
        except CompileError as e:
            raise CompileError(in_a_default(e.diagnostics, p.name)) from None

    def _annotation_value(self, node: A.Expr) -> Any:
        """A helper's annotation as a constant (None when it is none: only `constexpr` is read);
        a name the annotation cannot read (:class:`UnreadableAnnotation`) is reported."""
        try:
            v = self.expr(node)
        except UnreadableAnnotation:
            raise
        except (CompileError, PoisonError):
            return None
        return v.value if isinstance(v, Const) else None


def _within(inner: Span, outer: Span) -> bool:
    """Whether ``inner`` lies in ``outer``, a span of one line."""
    return (outer.line == outer.end_line == inner.line == inner.end_line and inner.source is outer.source
            and outer.col <= inner.col and inner.end_col <= outer.end_col)


def _target_text(t: A.Expr) -> str:
    return t.id if isinstance(t, A.Name) else "the target"


def _helper_signature(node: A.FunctionDef) -> str:
    return f"{node.name}({', '.join(p.name for p in node.params)})"


def _tuple_values(t: tuple) -> tuple:
    """The Python values of a constexpr tuple of constants (a parameter's ``constant``, as printed)."""
    return tuple(_tuple_values(x) if isinstance(x, tuple) else x.value if isinstance(x, Const) else x for x in t)
