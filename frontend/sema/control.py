"""Sema for structured control flow, in SSA form.

* ``if`` on a compile-time condition runs one branch only (the other is never analysed, as with
  ``if BLOCK > 64:`` in Triton); on a run-time scalar it becomes ``scf.if``, whose results merge
  the names either branch rebinds. A name bound in one branch only has no value after the ``if``
  (:class:`~sparsile.frontend.sema.values.Unbound`; using it is SP0237).
* ``for i in range(...)`` becomes ``scf.for``; ``for i in static_range(...)`` is unrolled
  (at most :data:`MAX_UNROLL` iterations). ``while`` becomes ``scf.while``.
* Loop-carried values are the names the body assigns that exist before the loop. A name holding
  a compile-time number before the loop takes the type the body gives it (found by a trial run of
  the body that is thrown away), so ``acc = 0`` followed by ``acc += x`` with ``x`` an ``f16`` tile
  carries an ``f16`` tile. Names first assigned inside a run-time loop, and the loop variable, have
  no value after it.
* ``break`` and ``continue`` are not supported (SP0203); ``return`` inside a loop neither (SP0223).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..diagnostics import CompileError, Diagnostic, DiagnosticBag, Label
from ..ir import types as T
from ..ir.core import Block, Builder, Value
from ..spans import Span
from ..syntax import ast as A
from .constant_kinds import check_number_use, wrong_constant_help
from .emitter import Emitter, describe
from .keyed_values import keyed_truth
from .scope import ReturnSignal, Scope, assigned_names
from .values import POISON, Arg, Const, PoisonError, Unbound, is_untyped_number

MAX_UNROLL = 4096
RANGE_HINTS = ("num_stages", "loop_unroll_factor")
"""Keywords of Triton's ``tl.range`` that ``range`` accepts (compile-time integers) and ignores."""
_MISSING = object()


def flatten(v: Any) -> list[Any]:
    if isinstance(v, tuple):
        out = []
        for x in v:
            out.extend(flatten(x))
        return out
    return [v]


def unflatten(template: Any, vals: list[Any]) -> Any:
    if isinstance(template, tuple):
        return tuple(unflatten(x, vals) for x in template)
    return vals.pop(0)


def _same_structure(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(_same_structure(x, y) for x, y in zip(a, b, strict=True)))
    return True


def _is_number_leaf(v: Any) -> bool:
    """A value that may differ between branches or iterations: a number, pointer or tile."""
    if isinstance(v, Value):
        return isinstance(v.type, T.ScalarType | T.PointerType | T.TileType)
    return isinstance(v, Const) and isinstance(v.value, bool | int | float)


def _same_const(a: Any, b: Any) -> bool:
    if isinstance(a, Const) and isinstance(b, Const):  # (`u8(1)` is not `i32(1)`, nor the literal 1)
        return type(a.value) is type(b.value) and a.value == b.value and a.dtype == b.dtype
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same_const(x, y) for x, y in zip(a, b, strict=True))
    return False


def _type_of(v: Any) -> T.Type | None:
    """The type of a run-time value or of a typed constant (a value of its type, ``u8(0)``); None
    for anything else (an untyped constant takes the type of what it meets)."""
    if isinstance(v, Value):
        return v.type
    if isinstance(v, Const) and v.dtype is not None:
        return v.dtype  # type: ignore[no-any-return]
    return None


def _carried_type(v: Any) -> T.Type:
    """The type a compile-time number before a run-time loop starts from: a typed constant's own
    (``acc = u8(0)`` is a u8 accumulator), an untyped one's literal type."""
    return _type_of(v) or T.literal_type(v.value)


class ControlFlowMixin:
    """``if``/``for``/``while`` for :class:`~sparsile.frontend.sema.core.Sema`."""

    # provided by Sema
    bag: DiagnosticBag
    builder: Builder
    scope: Scope
    in_trial: bool

    if TYPE_CHECKING:
        def expr(self, node: A.Expr) -> Any: ...
        def emitter(self) -> Emitter: ...
        def block(self, stmts: list[A.Stmt]) -> ReturnSignal | None: ...
        def bind(self, name: str, value: Any) -> None: ...

    @staticmethod
    def error(code: str, message: str, span: Span, help: str | None = None,
              labels: tuple[Label, ...] = ()) -> CompileError:
        return CompileError([Diagnostic(code, message, span, help=help, labels=labels)])

    def _in_block(self, block: Block) -> Emitter:
        em = self.emitter()
        em.builder = Builder(block)
        return em

    # ------------------------------------------------------------------------------ if
    def if_stmt(self, s: A.If) -> ReturnSignal | None:
        cond = self.expr(s.test)
        if isinstance(cond, Const):
            return self.block(s.body if keyed_truth(cond, s.test.span) else s.orelse)
        if isinstance(cond, tuple):
            return self.block(s.body if cond else s.orelse)
        if not isinstance(cond, Value):
            raise self.error("SP0214", f"an `if` condition must be a value, found {describe(cond)}", s.test.span)
        return self.runtime_if(self.scalar_condition(cond, s.test.span, "an `if`"), s)

    def scalar_condition(self, cond: Value, span: Span, what: str) -> Value:
        """A run-time condition as a scalar bool (numbers compare with zero, as in Python)."""
        em = self.emitter()
        em.span = span
        t = cond.type
        if isinstance(t, T.TileType):
            raise self.error("SP0214", f"{what} condition must be a scalar, found {t}", span,
                             help="use `where(mask, a, b)` for elementwise choices, or reduce the tile first")
        if not isinstance(t, T.ScalarType):
            raise self.error("SP0214", f"{what} condition must be a scalar bool or number, found {t}", span)
        if t.is_bool:
            return cond
        if t.name in ("e4m3", "e5m2"):  # `.to(bool)`'s bit test: no fp8 -> f32 `cvt` (SP0577 below sm_89)
            return em.cast(cond, T.bool_)
        return em.op1("arith.cmp", [cond, em.constant(0, t)], T.bool_, pred="ne")

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
        em.span = s.span
        op = em.create("scf.if", [cond], [], regions=2)
        then_env, then_ret = self._run_branch(s.body, op.regions[0].block)
        else_env, else_ret = self._run_branch(s.orelse, op.regions[1].block)
        if (then_ret is None) != (else_ret is None):
            # One branch returned and the other fell off the end: legal only when nothing follows
            # and no value is returned (the kernel or a helper without a value ends).
            ret = then_ret or else_ret
            assert ret is not None
            if ret.value is not None:
                raise self.error("SP0215", "every path of a helper must return a value when one does", s.span,
                                 help="add a `return` to the other branch, or return once at the end")
        kept, then_vals, else_vals = self._names_to_merge(s, then_env, else_env)
        then_leaves = [x for v in then_vals for x in flatten(v)]
        else_leaves = [x for v in else_vals for x in flatten(v)]
        ret_then = then_ret.value if then_ret is not None else None
        ret_else = else_ret.value if else_ret is not None else None
        has_ret_value = ret_then is not None and ret_else is not None
        if has_ret_value:
            if not _same_structure(ret_then, ret_else):
                raise self.error("SP0215", "the branches return different numbers of values", s.span)
            then_leaves += flatten(ret_then)
            else_leaves += flatten(ret_else)
        types = self._yield_both(then_leaves, else_leaves, op.regions[0].block, op.regions[1].block, s.span)
        op.results = [Value(t, op, i) for i, t in enumerate(types)]
        results = list(op.results)
        for n, template in zip(kept, then_vals, strict=True):
            self.bind(n, unflatten(template, results))
        if then_ret is not None and else_ret is not None:
            return ReturnSignal(unflatten(ret_then, results) if has_ret_value else None, s.span)
        return None

    def _names_to_merge(self, s: A.If, then_env: dict[str, Any], else_env: dict[str, Any]
                        ) -> tuple[list[str], list[Any], list[Any]]:
        """Bind the names whose value does not depend on the branch; return the others."""
        kept: list[str] = []
        then_vals: list[Any] = []
        else_vals: list[Any] = []
        for n in dict.fromkeys([*then_env, *else_env]):
            before = self.scope.get(n, _MISSING)
            tv, ev = then_env.get(n, before), else_env.get(n, before)
            if tv is _MISSING or ev is _MISSING or isinstance(tv, Unbound) or isinstance(ev, Unbound):
                self.bind(n, Unbound("is assigned in only one branch of a run-time `if`", s.span,
                                     "assign it before the `if`, or in both branches"))
            elif tv is POISON or ev is POISON:
                self.bind(n, POISON)
            elif tv is ev or _same_const(tv, ev):
                self.bind(n, tv)
            elif _same_structure(tv, ev) and all(map(_is_number_leaf, flatten(tv) + flatten(ev))):
                kept.append(n)
                then_vals.append(tv)
                else_vals.append(ev)
            else:
                self.bind(n, POISON)
                self.bag.error("SP0216", f"`{n}` is {describe(tv)} in one branch of a run-time `if` and "
                               f"{describe(ev)} in the other; only numbers and tiles can differ between "
                               "run-time branches", s.span, help="make the condition a compile-time constant")
        return kept, then_vals, else_vals

    def _yield_both(self, a_vals: list[Any], b_vals: list[Any], a_block: Block, b_block: Block,
                    span: Span) -> list[T.Type]:
        """Terminate both branches with ``scf.yield`` of values of one type per position."""
        a_out, b_out, types = [], [], []
        for av, bv in zip(a_vals, b_vals, strict=True):
            a, b = self._unify(av, bv, a_block, b_block, span)
            a_out.append(a)
            b_out.append(b)
            types.append(a.type)
        Builder(a_block).create("scf.yield", a_out, [], None, span)
        Builder(b_block).create("scf.yield", b_out, [], None, span)
        return types

    def _unify(self, av: Any, bv: Any, a_block: Block, b_block: Block, span: Span) -> tuple[Value, Value]:
        """Materialize one merged value in each branch. A constant takes the other branch's type
        (cast and broadcast); two run-time values must already agree."""
        like = _type_of(av) or _type_of(bv)
        if like is None and is_untyped_number(av) and is_untyped_number(bv):  # `x = 2**63` / `x = 1`
            like = self._in_block(a_block).literals_type(Arg(av, span), Arg(bv, span), span)
        a = self._in_block(a_block).value(Arg(av, span), like=like)
        b = self._in_block(b_block).value(Arg(bv, span), like=like)
        if a.type != b.type:
            ea, eb = T.element_type(a.type), T.element_type(b.type)
            if (isinstance(av, Const) or isinstance(bv, Const)) and isinstance(ea, T.ScalarType) \
                    and isinstance(eb, T.ScalarType):
                elem = T.Promotion.binary(ea, eb) if ea != eb else ea
                em_a, em_b = self._in_block(a_block), self._in_block(b_block)
                em_a.span = em_b.span = span
                shape = em_a.broadcast_shapes(T.shape_of(a.type), T.shape_of(b.type), span)
                a = em_a.broadcast_to(em_a.cast(a, elem), shape)
                b = em_b.broadcast_to(em_b.cast(b, elem), shape)
            if a.type != b.type:
                raise self.error("SP0217", f"a value is {a.type} in one branch and {b.type} in the other", span,
                                 help="convert both to one type with `.to(...)`, or broadcast them to one shape")
        return a, b

    # ------------------------------------------------------------------------------ for
    def for_stmt(self, s: A.For) -> None:
        it = s.iter
        if not (isinstance(it, A.Call) and isinstance(it.func, A.Name | A.Attribute)):
            raise self.error("SP0218", "a kernel `for` loop iterates over `range(...)` or `static_range(...)`",
                             it.span, help="write `for i in range(start, stop, step):`")
        fname = it.func.id if isinstance(it.func, A.Name) else it.func.attr
        if fname not in ("range", "static_range"):
            raise self.error("SP0218", f"a kernel `for` loop iterates over `range` or `static_range`, found `{fname}`",
                             it.span, help="write `for i in range(start, stop, step):`")
        if isinstance(it.func, A.Name) and self.frames and fname in self.frames[-1].local_names:
            raise self.error("SP0218", f"`{fname}` is a local name of `{self.frames[-1].name}` (assigned in it), "
                             "not the builtin a kernel `for` loop iterates over", it.func.span,
                             help=f"rename the local, or keep the name `{fname}` for the loop")
        for kw in it.keywords:
            self._range_hint(fname, kw)
        if not 1 <= len(it.args) <= 3:
            raise self.error("SP0219", f"`{fname}` takes 1 to 3 arguments, found {len(it.args)}", it.span)
        if not isinstance(s.target, A.Name):
            raise self.error("SP0220", "the loop variable must be a single name", s.target.span)
        bounds = [self.expr(a) for a in it.args]
        spans = [a.span for a in it.args]
        if len(bounds) == 1:
            bounds, spans = [Const(0), bounds[0], Const(1)], [it.span, spans[0], it.span]
        elif len(bounds) == 2:
            bounds, spans = [*bounds, Const(1)], [*spans, it.span]
        if fname == "static_range":
            self.static_for(s, bounds, spans)
        else:
            self.runtime_for(s, bounds, spans)

    def _range_hint(self, fname: str, kw: Any) -> None:
        """Check one keyword of ``range(...)``: Triton's ``tl.range`` hints ``num_stages=`` and
        ``loop_unroll_factor=`` are accepted as compile-time integers and ignored (sparsile does not
        pipeline or unroll run-time loops by itself; docs/language.md, "Control flow"); any other
        keyword is SP0219."""
        if fname == "range" and kw.name in RANGE_HINTS:
            v = self.expr(kw.value)
            if not (isinstance(v, Const) and isinstance(v.value, int) and not isinstance(v.value, bool)
                    and v.value >= 0):
                raise self.error("SP0201", f"`{kw.name}` of `range` must be a compile-time integer >= 0, found "
                                 f"{describe(v)}", kw.value.span)
            return
        hints = " and ".join(f"`{h}=`" for h in RANGE_HINTS)
        raise self.error("SP0219", f"`{fname}` takes no keyword argument `{kw.name}`", kw.span,
                         help=f"pass `{fname}(start, stop, step)` positionally" + (
                             f"; of Triton's loop hints, `range` accepts {hints} (and ignores them)"
                             if fname == "range" else ""))

    def static_for(self, s: A.For, bounds: list[Any], spans: list[Span]) -> None:
        vals = []
        for b, sp in zip(bounds, spans, strict=True):
            check_number_use(self, b, "a bound of `static_range`", sp)
            if not (isinstance(b, Const) and isinstance(b.value, int) and not isinstance(b.value, bool)):
                raise self.error("SP0201", f"the bounds of `static_range` must be compile-time integers, found "
                                 f"{describe(b)}", sp, help=wrong_constant_help(b.value, "integer")
                                 if isinstance(b, Const) else "use `range(...)` for a loop with run-time bounds")
            vals.append(b.value)
        if vals[2] == 0:
            raise self.error("SP0221", "the step of a loop cannot be zero", spans[2])
        trips = range(*vals)
        count = max(0, -((vals[0] - vals[1]) // vals[2]))  # len(trips), which overflows past 2**63
        if count > MAX_UNROLL:
            raise self.error("SP0222", f"`static_range` would unroll {count} iterations (the limit is "
                             f"{MAX_UNROLL})", s.iter.span, help="use `range(...)`")
        assert isinstance(s.target, A.Name)
        for i in trips:
            self.bind(s.target.id, Const(i))
            ret = self.block(s.body)
            if ret is not None:
                raise self.error("SP0223", "`return` inside a loop is not supported", ret.span,
                                 help="mask the remaining work instead of leaving the loop")

    def runtime_for(self, s: A.For, bounds: list[Any], spans: list[Span]) -> None:
        em = self.emitter()
        em.span = s.span
        if isinstance(bounds[2], Const) and bounds[2].value == 0:
            raise self.error("SP0221", "the step of a loop cannot be zero", spans[2])
        ivals = []
        for b, sp in zip(bounds, spans, strict=True):
            check_number_use(self, b, "a bound of `range`", sp)
            if isinstance(b, Const) and not isinstance(b.value, int):
                raise self.error("SP0224", f"loop bounds must be integers, found {describe(b)}", sp)
            v = em.tile_or_scalar(Arg(b, sp), like=T.i32, what="a loop bound")
            e = T.element_type(v.type)
            if not (isinstance(e, T.ScalarType) and e.is_int and not e.is_bool and not T.shape_of(v.type)):
                raise self.error("SP0224", f"loop bounds must be integer scalars, found {v.type}", sp)
            ivals.append(v)
        iv_type = ivals[0].type
        for v in ivals[1:]:
            iv_type = T.Promotion.binary(iv_type, v.type)  # type: ignore[arg-type]
        ivals = [em.cast(v, iv_type) for v in ivals]  # type: ignore[arg-type]
        assert isinstance(s.target, A.Name)
        carried = self._loop_carried(s.body, s.target.id)
        carried, inits, types = self._carried_types(carried, s, iv_type, s.target.id)
        op = em.create("scf.for", ivals + inits, [], regions=1)
        blk = op.regions[0].block
        iv = blk.add_arg(iv_type, s.target.id)
        args = [blk.add_arg(t, n) for n, t in zip(carried, types, strict=True)]
        env, ret = self._run_loop_body(s.body, blk, {s.target.id: iv, **dict(zip(carried, args, strict=True))})
        if ret is not None:
            raise self.error("SP0223", "`return` inside a loop is not supported", ret.span,
                             help="mask the remaining work instead of leaving the loop")
        self._yield_carried(blk, env, carried, types, s.span)
        op.results = [Value(t, op, i) for i, t in enumerate(types)]
        self._after_loop(s, carried, op.results, s.target.id)

    def _after_loop(self, s: A.For | A.While, carried: list[str], results: list[Value], iv_name: str | None) -> None:
        for n, r in zip(carried, results, strict=True):
            self.bind(n, r)
        kind = "for" if isinstance(s, A.For) else "while"
        for n in assigned_names(s.body):
            if n not in carried and n != iv_name and not self.scope.has(n):
                self.bind(n, Unbound(f"is first assigned inside a run-time `{kind}` loop, so it has no value "
                                     "after the loop", s.span, "assign it before the loop"))
        if iv_name is not None:
            self.bind(iv_name, Unbound("is the variable of a run-time `for` loop and has no value after it",
                                       s.span, "keep the value you need in another variable assigned before "
                                       "the loop"))

    def _loop_carried(self, body: list[A.Stmt], iv_name: str | None) -> list[str]:
        out = []
        for n in assigned_names(body):
            if n == iv_name:
                continue
            cur = self.scope.get(n, _MISSING)
            if cur is _MISSING or cur is POISON or isinstance(cur, Unbound):
                continue
            out.append(n)
        return out

    def _run_loop_body(self, body: list[A.Stmt], blk: Block, bound: dict[str, Any]
                       ) -> tuple[dict[str, Any], ReturnSignal | None]:
        saved_builder, saved_scope = self.builder, self.scope
        self.builder = Builder(blk)
        self.scope = Scope(saved_scope)
        self.scope.names.update(bound)
        try:
            ret = self.block(body)
            return self.scope.names, ret
        finally:
            self.builder, self.scope = saved_builder, saved_scope

    def _carried_types(self, carried: list[str], s: A.For | A.While, iv_type: T.Type | None, iv_name: str | None
                       ) -> tuple[list[str], list[Value], list[T.Type]]:
        """The names a loop really carries, their initial values and their types.

        A name holding a compile-time number before the loop is given a placeholder of its type (a
        typed constant's, else its literal type: :func:`_carried_type`) in a trial run of the body
        (thrown away); it takes the type the body gives it. A name
        the body reassigns to the same constant stays a constant and is not carried."""
        em = self.emitter()
        em.span = s.span
        trial_env: dict[str, Any] = {}
        needs_trial = [n for n in carried if not isinstance(self.scope.lookup(n), Value)]
        # Inside another loop's trial run, constants keep their literal types: nested trial runs
        # would make sema exponential in the loop depth, and a trial run's IR is thrown away.
        if needs_trial and not self.in_trial:
            scratch = Block()
            bound: dict[str, Any] = {}
            for n in carried:
                cur = self.scope.lookup(n)
                if isinstance(cur, Const) and isinstance(cur.value, bool | int | float):
                    bound[n] = scratch.add_arg(_carried_type(cur), n)
            if iv_name is not None and iv_type is not None:
                bound[iv_name] = scratch.add_arg(iv_type, iv_name)
            errors_before = len(self.bag.items)
            self.in_trial = True
            try:
                trial_env, _ = self._run_loop_body(s.body, scratch, bound)
            finally:
                self.in_trial = False
            del self.bag.items[errors_before:]  # the real run reports them
        names, inits, types = [], [], []
        for n in carried:
            cur = self.scope.lookup(n)
            if isinstance(cur, Value):
                names.append(n)
                inits.append(cur)
                types.append(cur.type)
                continue
            new = trial_env.get(n, _MISSING)
            if _same_const(new, cur):
                continue  # reassigned to the value it already has: stays a constant
            if not (isinstance(cur, Const) and isinstance(cur.value, bool | int | float)):
                raise self.error("SP0225", f"`{n}` is {describe(cur)} before the loop and is reassigned in it; only "
                                 "numbers and tiles can change from one iteration of a run-time loop to the next",
                                 s.span, help="use `static_range` to unroll the loop, or keep the name constant")
            t = _type_of(new) or _carried_type(cur)  # what the body gives it: a value, a typed constant
            v = em.value(Arg(cur, s.span), like=t)
            if v.type != t and isinstance(t, T.ScalarType | T.TileType):
                v = em.broadcast_to(em.cast(v, T.element_type(t)), T.shape_of(t))  # type: ignore[arg-type]
            names.append(n)
            inits.append(v)
            types.append(v.type)
        return names, inits, types

    def _yield_carried(self, blk: Block, env: dict[str, Any], carried: list[str], types: list[T.Type],
                       span: Span) -> None:
        em = self._in_block(blk)
        em.span = span
        outs = []
        for n, t in zip(carried, types, strict=True):
            v = env.get(n)
            if v is POISON:
                raise PoisonError()
            if not _is_number_leaf(v):
                raise self.error("SP0226", f"`{n}` enters the loop as {t} and leaves an iteration as {describe(v)}",
                                 span)
            val = em.value(Arg(v, span), like=t)
            if val.type != t:
                convert = (f"convert it with `.to({T.element_type(t)})` inside the loop, or "
                           if isinstance(t, T.ScalarType | T.PointerType | T.TileType) else "")
                raise self.error("SP0226", f"`{n}` enters the loop as {t} and leaves an iteration as {val.type}",
                                 span, help=f"{convert}give it its final type and shape before the loop")
            outs.append(val)
        em.create("scf.yield", outs, [])

    # ------------------------------------------------------------------------------ while
    def while_stmt(self, s: A.While) -> None:
        em = self.emitter()
        em.span = s.span
        carried = self._loop_carried(s.body, None)
        carried, inits, types = self._carried_types(carried, s, None, None)
        op = em.create("scf.while", inits, [], regions=2)
        before, after = op.regions[0].block, op.regions[1].block
        bargs = [before.add_arg(t, n) for n, t in zip(carried, types, strict=True)]
        saved_builder, saved_scope = self.builder, self.scope
        self.builder = Builder(before)
        self.scope = Scope(saved_scope)
        self.scope.names.update(dict(zip(carried, bargs, strict=True)))
        try:
            cond = self.expr(s.test)
            if isinstance(cond, Const | tuple):
                if keyed_truth(cond, s.test.span):
                    raise self.error("SP0238", "this `while` condition is always true, so the loop never ends",
                                     s.test.span, help="`break` is not supported: make the condition depend on a "
                                     "variable the loop updates")
            elif not isinstance(cond, Value):
                raise self.error("SP0214", f"a `while` condition must be a value, found {describe(cond)}",
                                 s.test.span)
            else:
                c = self.scalar_condition(cond, s.test.span, "a `while`")
                Builder(before).create("scf.condition", [c, *bargs], [], None, s.test.span)
        finally:
            self.builder, self.scope = saved_builder, saved_scope
        if isinstance(cond, Const | tuple):  # always false: the loop never runs
            assert op.block is not None
            op.block.ops.remove(op)
            return
        aargs = [after.add_arg(t, n) for n, t in zip(carried, types, strict=True)]
        env, ret = self._run_loop_body(s.body, after, dict(zip(carried, aargs, strict=True)))
        if ret is not None:
            raise self.error("SP0223", "`return` inside a loop is not supported", ret.span,
                             help="mask the remaining work instead of leaving the loop")
        self._yield_carried(after, env, carried, types, s.span)
        op.results = [Value(t, op, i) for i, t in enumerate(types)]
        self._after_loop(s, carried, op.results, None)
