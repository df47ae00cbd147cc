"""Sema: from the AST of a kernel to the typed IR.

Name resolution (locals, then the kernel's globals — module constants of a ``.spk`` file or the
Python globals of a ``@jit`` function — then builtins), constant evaluation, specialization of
parameters, structured control flow in SSA form (``scf.for``/``scf.if``/``scf.while`` with
loop-carried values found by scanning the body), ``static_range`` unrolling, ``if`` on constants
pruned, and helper functions inlined at each call. Expressions are in :mod:`sema_expr`.

Several errors are collected per kernel: a statement that fails poisons the names it defines, so
later uses do not report again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import ast as A
from . import types as T
from .diagnostics import CompileError, Diagnostic, DiagnosticBag, InternalError
from .ir import Block, Builder, Function, Param, Region, Value
from .sema_expr import ExprMixin
from .spans import Span
from .values import POISON, Const, PoisonError


@dataclass(frozen=True)
class ArgSpec:
    """What the specialization key records about a run-time argument."""

    type: T.Type
    divisible_16: bool = False

    def key(self) -> tuple[Any, ...]:
        return (str(self.type), self.divisible_16)


class Scope:
    def __init__(self, parent: Scope | None = None):
        self.parent = parent
        self.names: dict[str, Any] = {}

    def lookup(self, name: str) -> Any:
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return s.names[name]
            s = s.parent
        raise KeyError(name)

    def has(self, name: str) -> bool:
        try:
            self.lookup(name)
            return True
        except KeyError:
            return False

    def all_names(self) -> set[str]:
        out: set[str] = set()
        s: Scope | None = self
        while s is not None:
            out |= set(s.names)
            s = s.parent
        return out


@dataclass
class ReturnSignal:
    """A ``return`` was executed on this path, with this value (None for a bare return)."""

    value: Any
    span: Span


@dataclass
class Frame:
    """One inlined function (or the kernel itself)."""

    name: str
    globals: Callable[[str], Any]
    is_kernel: bool
    depth: int = 0
    returns: list[ReturnSignal] = field(default_factory=list)


MAX_INLINE_DEPTH = 32


def assigned_names(stmts: list[A.Stmt]) -> list[str]:
    """Names a block of statements may (re)bind, in first-assignment order (nested blocks too)."""
    out: list[str] = []

    def add_target(t: A.Expr) -> None:
        if isinstance(t, A.Name):
            if t.id not in out:
                out.append(t.id)
        elif isinstance(t, A.Tuple | A.List):
            for e in t.elts:
                add_target(e)

    def visit(body: list[A.Stmt]) -> None:
        for s in body:
            if isinstance(s, A.Assign):
                for t in s.targets:
                    add_target(t)
            elif isinstance(s, A.AnnAssign | A.AugAssign):
                add_target(s.target)
            elif isinstance(s, A.For):
                add_target(s.target)
                visit(s.body)
            elif isinstance(s, A.While):
                visit(s.body)
            elif isinstance(s, A.If):
                visit(s.body)
                visit(s.orelse)

    visit(stmts)
    return out


class Sema(ExprMixin):
    """Builds the IR of one kernel. ``globals`` resolves non-local names (raises KeyError)."""

    def __init__(self, globals_resolver: Callable[[str], Any], source_name: str = "<kernel>"):
        self.bag = DiagnosticBag()
        self.globals_resolver = globals_resolver
        self.builder = Builder(Block())
        self.current_span: Span | None = None
        self.frames: list[Frame] = []
        self.scope = Scope()
        self.source_name = source_name

    # ------------------------------------------------------------------------------ entry point
    def kernel(self, node: A.FunctionDef, bindings: dict[str, Any], attrs: dict[str, Any] | None = None) -> Function:
        """The IR of kernel ``node`` with its parameters bound: a :class:`Const` for each
        constexpr parameter and an :class:`ArgSpec` for each run-time one."""
        body = Region(Block())
        self.builder = Builder(body.block)
        params: list[Param] = []
        self.scope = Scope()
        for p in node.params:
            b = bindings.get(p.name)
            if isinstance(b, Const):
                params.append(Param(p.name, None, None, b.value, p.span))
                self.scope.names[p.name] = b
            elif isinstance(b, ArgSpec):
                v = body.block.add_arg(b.type, p.name)
                params.append(Param(p.name, b.type, v, None, p.span, b.divisible_16))
                self.scope.names[p.name] = v
            else:
                raise InternalError(f"parameter {p.name!r} of {node.name} has no binding", p.span)
        func = Function(node.name, params, body, dict(attrs or {}), node.span)
        self.frames = [Frame(node.name, self.globals_resolver, True)]
        ret = self.block(node.body)
        if isinstance(ret, ReturnSignal) and ret.value is not None and not (
                isinstance(ret.value, Const) and ret.value.value is None):
            self.bag.error("SP0207", "a kernel cannot return a value", ret.span,
                           help="store results through a pointer or tensor parameter")
        self.bag.raise_if_errors()
        return func

    # ------------------------------------------------------------------------------ utilities
    def resolve_global(self, name: str) -> Any:
        return (self.frames[-1].globals if self.frames else self.globals_resolver)(name)

    def error(self, code: str, message: str, span: Span, help: str | None = None) -> CompileError:
        return CompileError([Diagnostic(code, message, span, help=help)])

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
            if isinstance(s, A.If) and not s.orelse and _ends_in_return(s.body) and i + 1 < len(stmts):
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
        try:
            return self._statement(s)
        except PoisonError:
            self._poison_targets(s)
        except CompileError as e:
            self.bag.extend(e.diagnostics)
            self._poison_targets(s)
        except RecursionError:
            self.bag.error("SP0205", "the program is nested too deeply to compile", s.span)
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
                             help="express the exit in the loop condition of a `while` loop, or mask the work")
        elif isinstance(s, A.Assert):
            self.assert_stmt(s)
        elif isinstance(s, A.FunctionDef):
            from .values import HelperFunction

            self.bind(s.name, HelperFunction(s, self.resolve_global, s.name))
        elif isinstance(s, A.Import | A.ImportFrom):
            raise self.error("SP0209", "imports are not allowed inside a kernel", s.span,
                             help="import at module level; kernels see module names as constants")
        else:
            raise self.error("SP0210", f"`{type(s).__name__}` statements are not supported in kernels", s.span)
        return None

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
        if s.value is None:
            return
        value = self.expr(s.value)
        if isinstance(ann, T.ScalarType):
            from .values import Arg

            em = self.emitter()
            v = em.value(Arg(value, s.value.span), like=ann)
            value = em.cast(v, ann)
        elif ann is T.CONSTEXPR:
            if not isinstance(value, Const | tuple):
                raise self.error("SP0201", "a `constexpr` variable needs a compile-time value", s.value.span)
        self.assign(s.target, value, s.value.span)

    def assert_stmt(self, s: A.Assert) -> None:
        cond = self.expr(s.test)
        msg = "assertion failed"
        if s.msg is not None:
            m = self.expr(s.msg)
            if isinstance(m, Const) and isinstance(m.value, str):
                msg = m.value
        if isinstance(cond, Const):
            if not cond.value:
                raise self.error("SP0320", f"static assertion failed: {msg}", s.test.span)
            return
        from .values import Arg

        em = self.emitter()
        v = em.value(Arg(cond, s.test.span))
        if T.element_type(v.type) != T.bool_:
            raise self.error("SP0312", f"an assert condition must be bool, found {v.type}", s.test.span)
        em.create("device_assert", [v], [], {"message": msg})

    # ------------------------------------------------------------------------------ control flow
    def _snapshot(self) -> dict[str, Any]:
        return {n: self.scope.lookup(n) for n in self.scope.all_names()}

    def if_stmt(self, s: A.If) -> ReturnSignal | None:
        cond = self.expr(s.test)
        if isinstance(cond, Const):
            return self.block(s.body if cond.value else s.orelse)
        if isinstance(cond, tuple):
            return self.block(s.body if cond else s.orelse)
        from .values import Arg

        em = self.emitter()
        c = em.value(Arg(cond, s.test.span))
        if c.type != T.bool_:
            if isinstance(c.type, T.ScalarType) and not c.type.is_bool:
                zero = em.constant(0, c.type)
                c = em.op1("arith.cmp", [c, zero], T.bool_, pred="ne")
            else:
                raise self.error("SP0214", f"an `if` condition must be a scalar, found {c.type}", s.test.span,
                                 help="use `where(mask, a, b)` for elementwise choices")
        return self.runtime_if(c, s)

    def _run_branch(self, stmts: list[A.Stmt], block: Block) -> tuple[dict[str, Any], ReturnSignal | None]:
        saved_builder, saved_scope = self.builder, self.scope
        self.builder = Builder(block)
        self.scope = Scope(saved_scope)
        try:
            ret = self.block(stmts)
            return self.scope.names, ret
        finally:
            self.builder, self.scope = saved_builder, saved_scope

    def runtime_if(self, cond: Value, s: A.If) -> ReturnSignal | None:
        em = self.emitter()
        op = em.create("scf.if", [cond], [], regions=2)
        then_env, then_ret = self._run_branch(s.body, op.regions[0].block)
        else_env, else_ret = self._run_branch(s.orelse, op.regions[1].block)
        if (then_ret is None) != (else_ret is None):
            # One branch returned and the other fell off the end of the function: only legal when
            # nothing follows (the kernel ends, or a helper without a value).
            ret = then_ret or else_ret
            assert ret is not None
            if ret.value is not None:
                raise self.error("SP0215", "every path of a helper must return a value when one does", s.span,
                                 help="add a `return` to the other branch, or return once at the end")
        # Values to merge: names bound in a branch that exist after the if.
        names = []
        for n in list(then_env) + [n for n in else_env if n not in then_env]:
            if n in names:
                continue
            in_both = n in then_env and n in else_env
            if in_both or self.scope.has(n):
                names.append(n)
        merged_types: list[T.Type] = []
        then_vals, else_vals, kept = [], [], []
        for n in names:
            tv = then_env.get(n, self.scope.lookup(n) if self.scope.has(n) else None)
            ev = else_env.get(n, self.scope.lookup(n) if self.scope.has(n) else None)
            if tv is POISON or ev is POISON:
                self.bind(n, POISON)
                continue
            if isinstance(tv, Const) and isinstance(ev, Const) and tv == ev:
                self.bind(n, tv)
                continue
            if not (isinstance(tv, Value | Const) and isinstance(ev, Value | Const)):
                if tv is ev:
                    continue
                self.bind(n, POISON)
                self.bag.error("SP0216", f"`{n}` is bound to different compile-time objects in the two branches "
                               "of a run-time `if`", s.span)
                continue
            kept.append(n)
            then_vals.append(tv)
            else_vals.append(ev)
        # Return values merge too.
        ret_then = then_ret.value if then_ret is not None else None
        ret_else = else_ret.value if else_ret is not None else None
        has_ret_value = ret_then is not None and ret_else is not None
        then_y = self._materialize_pair(then_vals, else_vals, op.regions[0].block, op.regions[1].block, kept, s.span)
        for t in then_y:
            merged_types.append(t)
        ret_types: list[T.Type] = []
        if has_ret_value:
            ret_types = self._materialize_returns(ret_then, ret_else, op, s.span)
        op.results = [Value(t, op, i) for i, t in enumerate(merged_types + ret_types)]
        for i, n in enumerate(kept):
            self.bind(n, op.results[i])
        if then_ret is not None and else_ret is not None:
            if has_ret_value:
                vals = op.results[len(kept):]
                return ReturnSignal(_unflatten(ret_then, list(vals)), s.span)
            return ReturnSignal(None, s.span)
        return None

    def _materialize_pair(self, a_vals: list[Any], b_vals: list[Any], a_block: Block, b_block: Block,
                          names: list[str], span: Span) -> list[T.Type]:
        """Yield the merged values from both branches (casting constants to the other's type)."""
        types: list[T.Type] = []
        a_out, b_out = [], []
        for n, av, bv in zip(names, a_vals, b_vals, strict=True):
            av2, bv2, t = self._unify(av, bv, a_block, b_block, n, span)
            a_out.append(av2)
            b_out.append(bv2)
            types.append(t)
        self._append_yield(a_block, a_out, span)
        self._append_yield(b_block, b_out, span)
        return types

    def _append_yield(self, block: Block, vals: list[Value], span: Span) -> None:
        b = Builder(block)
        b.create("scf.yield", vals, [], None, span)

    def _unify(self, av: Any, bv: Any, a_block: Block, b_block: Block, name: str,
               span: Span) -> tuple[Value, Value, T.Type]:
        from .values import Arg

        def mat(v: Any, like: T.Type | None, block: Block) -> Value:
            saved = self.builder
            self.builder = Builder(block)
            try:
                em = self.emitter()
                return em.value(Arg(v, span), like=like)
            finally:
                self.builder = saved

        like = av.type if isinstance(av, Value) else bv.type if isinstance(bv, Value) else None
        a = mat(av, like, a_block)
        b = mat(bv, like, b_block)
        if a.type != b.type:
            raise self.error("SP0217", f"`{name}` has type {a.type} in one branch and {b.type} in the other",
                             span, help="convert both to one type with `.to(...)`")
        return a, b, a.type

    def _materialize_returns(self, rt: Any, re: Any, op: Any, span: Span) -> list[T.Type]:
        ft, fe = _flatten(rt), _flatten(re)
        if len(ft) != len(fe):
            raise self.error("SP0215", "the branches return different numbers of values", span)
        types = []
        ya, yb = [], []
        for x, y in zip(ft, fe, strict=True):
            a, b, t = self._unify(x, y, op.regions[0].block, op.regions[1].block, "the return value", span)
            ya.append(a)
            yb.append(b)
            types.append(t)
        for blk, vals in ((op.regions[0].block, ya), (op.regions[1].block, yb)):
            y = blk.ops[-1]
            assert y.name == "scf.yield"
            y.operands.extend(vals)
        return types

    def for_stmt(self, s: A.For) -> None:
        it = s.iter
        if not (isinstance(it, A.Call) and isinstance(it.func, A.Name | A.Attribute)):
            raise self.error("SP0218", "a kernel `for` loop iterates over `range(...)` or `static_range(...)`",
                             it.span, help="write `for i in range(start, stop, step):`")
        fname = it.func.id if isinstance(it.func, A.Name) else it.func.attr
        if fname not in ("range", "static_range"):
            raise self.error("SP0218", f"a kernel `for` loop iterates over `range` or `static_range`, found `{fname}`",
                             it.span)
        if it.keywords:
            raise self.error("SP0219", f"`{fname}` takes no keyword arguments here", it.keywords[0].span)
        if not 1 <= len(it.args) <= 3:
            raise self.error("SP0219", f"`{fname}` takes 1 to 3 arguments, found {len(it.args)}", it.span)
        bounds = [self.expr(a) for a in it.args]
        if len(bounds) == 1:
            bounds = [Const(0), bounds[0], Const(1)]
        elif len(bounds) == 2:
            bounds = [*bounds, Const(1)]
        if not isinstance(s.target, A.Name):
            raise self.error("SP0220", "the loop variable must be a single name", s.target.span)
        if fname == "static_range":
            vals = []
            for b, a in zip(bounds, list(it.args) + [it.args[-1]] * 3, strict=False):
                if not (isinstance(b, Const) and isinstance(b.value, int)):
                    raise self.error("SP0201", "the bounds of `static_range` must be compile-time integers", a.span,
                                     help="use `range(...)` for a loop with run-time bounds")
                vals.append(b.value)
            if vals[2] == 0:
                raise self.error("SP0221", "the step of a loop cannot be zero", it.span)
            trips = range(*vals)
            if len(trips) > 4096:
                raise self.error("SP0222", f"`static_range` would unroll {len(trips)} iterations (limit 4096)", it.span,
                                 help="use `range(...)`")
            for i in trips:
                self.bind(s.target.id, Const(i))
                ret = self.block(s.body)
                if ret is not None:
                    raise self.error("SP0223", "`return` inside a loop is not supported", ret.span)
            return
        self.runtime_for(s, bounds, it)

    def runtime_for(self, s: A.For, bounds: list[Any], it: A.Call) -> None:
        from .values import Arg

        em = self.emitter()
        spans = [a.span for a in it.args]
        while len(spans) < 3:
            spans.append(it.span)
        if len(it.args) == 1:
            spans = [it.span, it.args[0].span, it.span]
        if isinstance(bounds[2], Const) and bounds[2].value == 0:
            raise self.error("SP0221", "the step of a loop cannot be zero", spans[2])
        ivals = []
        for b, sp in zip(bounds, spans, strict=True):
            v = em.value(Arg(b, sp), like=T.i32)
            e = T.element_type(v.type)
            if not (isinstance(e, T.ScalarType) and e.is_int and not T.shape_of(v.type)):
                raise self.error("SP0224", f"loop bounds must be integer scalars, found {v.type}", sp)
            ivals.append(v)
        iv_type = T.Promotion.binary(T.Promotion.binary(ivals[0].type, ivals[1].type), ivals[2].type)  # type: ignore[arg-type]
        ivals = [em.cast(v, iv_type) for v in ivals]
        assert isinstance(s.target, A.Name)
        carried = self._loop_carried(s.body, s.target.id)
        inits, types = self._carried_types(carried, s, iv_type, s.target.id)
        op = em.create("scf.for", ivals + inits, [], regions=1)
        blk = op.regions[0].block
        iv = blk.add_arg(iv_type, s.target.id)
        args = [blk.add_arg(t, n) for n, t in zip(carried, types, strict=True)]
        env, ret = self._run_loop_body(s.body, blk, {s.target.id: iv, **dict(zip(carried, args, strict=True))})
        if ret is not None:
            raise self.error("SP0223", "`return` inside a loop is not supported", ret.span)
        self._yield_carried(blk, env, carried, types, s.span)
        op.results = [Value(t, op, i) for i, t in enumerate(types)]
        for n, r in zip(carried, op.results, strict=True):
            self.bind(n, r)

    def _loop_carried(self, body: list[A.Stmt], iv_name: str | None) -> list[str]:
        return [n for n in assigned_names(body) if n != iv_name and self.scope.has(n)
                and self.scope.lookup(n) is not POISON]

    def _run_loop_body(self, body: list[A.Stmt], blk: Block, bound: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        saved_builder, saved_scope = self.builder, self.scope
        self.builder = Builder(blk)
        self.scope = Scope(saved_scope)
        self.scope.names.update(bound)
        try:
            ret = self.block(body)
            return self.scope.names, ret
        finally:
            self.builder, self.scope = saved_builder, saved_scope

    def _carried_types(self, carried: list[str], s: A.Stmt, iv_type: T.Type | None, iv_name: str | None
                       ) -> tuple[list[Value], list[T.Type]]:
        """Initial values and types of loop-carried names. Names holding constants before the loop
        take the type the body gives them, found by a trial run of the body that is thrown away."""
        from .values import Arg

        em = self.emitter()
        needs_trial = [n for n in carried if not isinstance(self.scope.lookup(n), Value)]
        trial_types: dict[str, T.Type] = {}
        if needs_trial:
            scratch = Block()
            bound: dict[str, Any] = {n: self.scope.lookup(n) for n in carried}
            if iv_name is not None and iv_type is not None:
                bound[iv_name] = scratch.add_arg(iv_type, iv_name)
            errors_before = len(self.bag.items)
            env, _ = self._run_loop_body(s.body, scratch, bound)  # type: ignore[attr-defined]
            del self.bag.items[errors_before:]  # the real run reports them
            for n in needs_trial:
                v = env.get(n)
                if isinstance(v, Value):
                    trial_types[n] = v.type
        inits, types = [], []
        for n in carried:
            cur = self.scope.lookup(n)
            if isinstance(cur, Value):
                inits.append(cur)
                types.append(cur.type)
                continue
            if n not in trial_types:
                if isinstance(cur, Const | tuple):
                    # constant before and after every iteration: stays a constant if unchanged
                    inits.append(em.value(Arg(cur, s.span)))
                    types.append(inits[-1].type)
                    continue
                raise self.error("SP0225", f"`{n}` cannot be carried through a run-time loop", s.span)
            t = trial_types[n]
            v = em.value(Arg(cur, s.span), like=t)
            if v.type != t:
                v = em.cast(v, T.element_type(t))  # type: ignore[arg-type]
                if v.type != t:
                    v = em.broadcast_to(v, T.shape_of(t))
            inits.append(v)
            types.append(t)
        return inits, types

    def _yield_carried(self, blk: Block, env: dict[str, Any], carried: list[str], types: list[T.Type],
                       span: Span) -> None:
        from .values import Arg

        saved = self.builder
        self.builder = Builder(blk)
        try:
            em = self.emitter()
            outs = []
            for n, t in zip(carried, types, strict=True):
                v = env.get(n)
                if v is POISON:
                    raise PoisonError()
                val = em.value(Arg(v, span), like=t)
                if val.type != t:
                    raise self.error("SP0226", f"`{n}` enters the loop as {t} and leaves an iteration as {val.type}",
                                     span, help=f"convert it with `.to({T.element_type(t)})` inside the loop, "
                                                "or give it the final type before the loop")
                outs.append(val)
            em.create("scf.yield", outs, [])
        finally:
            self.builder = saved

    def while_stmt(self, s: A.While) -> None:
        em = self.emitter()
        carried = self._loop_carried(s.body, None)
        inits, types = self._carried_types(carried, s, None, None)
        op = em.create("scf.while", inits, [], regions=2)
        before, after = op.regions[0].block, op.regions[1].block
        bargs = [before.add_arg(t, n) for n, t in zip(carried, types, strict=True)]
        saved_builder, saved_scope = self.builder, self.scope
        self.builder = Builder(before)
        self.scope = Scope(saved_scope)
        self.scope.names.update(dict(zip(carried, bargs, strict=True)))
        try:
            from .values import Arg

            cond = self.expr(s.test)
            em2 = self.emitter()
            c = em2.value(Arg(cond, s.test.span))
            if c.type != T.bool_:
                raise self.error("SP0214", f"a `while` condition must be a bool scalar, found {c.type}", s.test.span)
            em2.create("scf.condition", [c, *bargs], [])
        finally:
            self.builder, self.scope = saved_builder, saved_scope
        aargs = [after.add_arg(t, n) for n, t in zip(carried, types, strict=True)]
        env, ret = self._run_loop_body(s.body, after, dict(zip(carried, aargs, strict=True)))
        if ret is not None:
            raise self.error("SP0223", "`return` inside a loop is not supported", ret.span)
        self._yield_carried(after, env, carried, types, s.span)
        op.results = [Value(t, op, i) for i, t in enumerate(types)]
        for n, r in zip(carried, op.results, strict=True):
            self.bind(n, r)

    # ------------------------------------------------------------------------------ inlining
    def inline_call(self, helper: Any, args: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
        node: A.FunctionDef = helper.node
        if len(self.frames) > MAX_INLINE_DEPTH:
            raise self.error("SP0205", f"helper `{node.name}` is inlined more than {MAX_INLINE_DEPTH} levels deep "
                             "(recursion is not supported)", span)
        positional = [p for p in node.params if p.kind == "positional"]
        bound: dict[str, Any] = {}
        if len(args) > len(positional):
            raise self.error("SP0321", f"`{node.name}` takes {len(positional)} positional arguments but "
                             f"{len(args)} were given", span)
        for p, a in zip(positional, args, strict=False):
            bound[p.name] = a
        names = {p.name for p in node.params}
        for k, v in kwargs.items():
            if k not in names:
                raise self.error("SP0322", f"`{node.name}` has no parameter named `{k}`", span)
            if k in bound:
                raise self.error("SP0323", f"`{node.name}` got two values for `{k}`", span)
            bound[k] = v
        saved_scope = self.scope
        self.frames.append(Frame(node.name, helper.globals, False, len(self.frames)))
        try:
            self.scope = Scope()
            for p in node.params:
                if p.name not in bound:
                    if p.default is None:
                        raise self.error("SP0321", f"`{node.name}` is missing the argument `{p.name}`", span)
                    bound[p.name] = self.expr(p.default)
                if p.annotation is not None:
                    ann = self._annotation_value(p.annotation)
                    if ann is T.CONSTEXPR and not isinstance(bound[p.name], Const | tuple):
                        raise self.error("SP0201", f"`{p.name}` of `{node.name}` is constexpr but received a "
                                         "run-time value", span)
                self.scope.names[p.name] = bound[p.name]
            errors_before = sum(1 for d in self.bag.items if d.severity.value == "error")
            ret = self.block(node.body)
            errors_after = sum(1 for d in self.bag.items if d.severity.value == "error")
            if errors_after > errors_before:
                raise PoisonError()
        finally:
            self.scope = saved_scope
            self.frames.pop()
        return None if ret is None else ret.value

    def _annotation_value(self, node: A.Expr) -> Any:
        try:
            v = self.expr(node)
        except CompileError:
            return None
        return v.value if isinstance(v, Const) else None


def _ends_in_return(stmts: list[A.Stmt]) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, A.Return):
        return True
    if isinstance(last, A.If):
        return _ends_in_return(last.body) and _ends_in_return(last.orelse)
    return False


def _flatten(v: Any) -> list[Any]:
    if isinstance(v, tuple):
        out = []
        for x in v:
            out.extend(_flatten(x))
        return out
    return [v]


def _unflatten(template: Any, vals: list[Value]) -> Any:
    if isinstance(template, tuple):
        out = []
        for x in template:
            out.append(_unflatten(x, vals))
        return tuple(out)
    return vals.pop(0)
