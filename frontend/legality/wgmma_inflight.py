"""SP0370: the metadata of a sparse wgmma still in flight is never rewritten.

``wgmma.mma_async.sp`` reads its metadata register asynchronously: a register read by a wgmma must
not be modified before the ``wgmma.wait_group`` that retires it (PTX ISA, wgmma.mma_async). On an
H200, a loop that kept one sparse group in flight (``wgmma_wait(1)``) and rotated its metadata
(``meta = meta_next``) gave wrong results: the loop-carried variable's register is rewritten at the
back edge while the MMA still reads it. Keeping sparse groups in flight is otherwise legal, so this
rule accepts every program where it can show that no such register is rewritten, and reports the
others at the line that rewrites it.

**The model.** Each ``hopper.wgmma`` commits one group (``backend/lower/hopper.py``: one
``wgmma.commit_group`` per op); ``hopper.wgmma_wait(n)`` retires every group but the last ``n``
committed. Each SSA value is one PTX register, written each time its defining op executes (a value
defined in a loop body: once per iteration); a loop-carried value (a block argument) is written at
loop entry and at each back edge (a ``for`` loop's induction variable too), an ``if`` result at the
end of the branch taken. ``scf.for``
results and the arguments of a ``while`` loop's body are the registers they pass on
(``backend/lower/control.py``), written by nothing else. Two things may give different values one
register: LLVM's coalescing of the values a copy joins (a carried value, its initial value, the
value yielded for it, an ``if`` result and the values its branches yield: a *copy class*), and an
op that passes an operand's registers on (a layout conversion that only renames registers, a
no-op cast, ``x + 0`` folded by LLVM; assumed of every op but loads and atomics, whose results are
new registers, for operands of the result's width). So the registers of the metadata ``v`` may be
those of any value *related* to it: the closure of ``v`` under copy classes and passed-on operands.
A definition of a related value while the MMA is in flight is a possible write, and so is a copy
into one, except a copy from ``v`` itself, which leaves its register as it is.

**The analysis.** An abstract interpretation over the structured IR: its state maps each sparse
wgmma that may be in flight to the fewest groups committed after it on any path (capped at 7,
which every wait retires), so that ``wgmma_wait(n)`` retires exactly the entries at depth >= n.
Branches join (union, minimum depth); loops iterate to a fixed point (the state only grows in a
finite lattice; past :data:`MAX_ROUNDS` rounds the entry state is widened to "every sparse wgmma of
the kernel in flight", which can only report more). Each ``warp_specialize`` partition starts from
the state of the threads before it. A write of the register of an in-flight wgmma's metadata is
SP0370 at the op that writes it, or, for a loop-carried variable, at the loop (or ``if``) whose
edge reassigns it, with the wgmma and the wait that left it in flight as labels.

The IR cannot show every register LLVM shares (a phi it makes when it sinks an op both branches of
an ``if`` share, a constant re-materialized in a loop): the PTX of every kernel that keeps a
sparse group in flight is checked again once LLVM has chosen its registers
(backend/toolchain/ptx_inflight.py), also SP0370.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..diagnostics import Diagnostic, Label
from ..ir import types as T
from ..ir.core import Block, Function, Operation, Value
from .core import Context, function_rule

SP_SPARSE_META_IN_FLIGHT = "SP0370"
"""The metadata register of a sparse wgmma is rewritten before the wait that retires it."""

DEPTH_CAP = 7
"""``wgmma.wait_group`` keeps at most 7 groups pending: a group with 7 or more committed after it
is retired by every wait."""
MAX_ROUNDS = 16
"""Rounds of a loop's fixed-point iteration before its entry state is widened."""

HELP = ("keep a sparse MMA's metadata unchanged until the `hopper.wgmma_wait` that retires it: give each MMA in "
        "flight its own metadata variable (unroll the loop, e.g. by three with `wgmma_wait(1)`), load a new value "
        "into a variable only after the wait that retires the MMA reading it, or wait for every group with "
        "`hopper.wgmma_wait(0, acc)`")
NOTE = ("wgmma.mma_async.sp reads its metadata register asynchronously; a register read by a wgmma must not be "
        "modified before the wgmma.wait_group that retires it (PTX ISA, wgmma.mma_async)")

State = dict[Operation, int]
"""Sparse wgmma -> the fewest groups committed after it on any path to this point (it may be in flight)."""


def _join(a: State, b: State) -> State:
    out = dict(a)
    for op, d in b.items():
        out[op] = min(d, out.get(op, d))
    return out


@dataclass(frozen=True)
class _Site:
    """Where a register is written: an op (its definition) or an edge of a region op."""

    op: Operation
    edge: str = ""  # "", "entry", "back edge", "merge"


FRESH = ("load", "smem.load", "tmem.load", "tmem.load_chunks", "tensor.load_tile", "atomic_rmw", "atomic_cas")
"""Ops whose results are new registers (a load's masked-off lanes keep its ``other``)."""


def _width(t: object) -> int | None:
    """The bit width of a register value's elements (None for memory, pointers and predicates)."""
    if not isinstance(t, T.ScalarType | T.TileType):
        return None
    e = T.element_type(t)
    return e.bits if isinstance(e, T.ScalarType) and not e.is_bool else None


def passed_on(v: Value) -> list[Value]:
    """The operands whose registers ``v``'s defining op may pass on as ``v``'s."""
    op = v.owner
    if op is None or op.regions:
        return []  # block arguments and region results: their copies are the copy classes
    if op.name in FRESH:
        other = op.optional_operand("other") if op.name == "load" else None
        return [other] if other is not None else []
    if op.name in ("hopper.wgmma", "hopper.wgmma_wait"):
        return [op.operand("acc")]
    width = _width(v.type)
    return [o for o in op.operands if width is not None and _width(o.type) == width]


class _Analysis:
    def __init__(self, func: Function):
        self.parent: dict[Value, Value] = {}
        self.alias: dict[Value, Value] = {}
        self.sparse: list[Operation] = []
        self.passed_by: dict[Operation, Operation] = {}  # wgmma -> a wait that left it in flight
        self.found: dict[_Site, Diagnostic] = {}
        self.members: list[Value] = []
        ops = list(func.walk())
        for op in ops:  # aliases first: a class is made of canonical values
            self._aliases(op)
        for op in ops:
            self._classes(op)
            if op.name == "hopper.wgmma" and op.attrs.get("sparse"):
                self.sparse.append(op)
        self.by_root: dict[Value, list[Value]] = {}
        for v in dict.fromkeys(self.members):
            self.by_root.setdefault(self._find(v), []).append(v)
        self._related: dict[Value, set[Value]] = {}

    # -------------------------------------------------------------- copy classes and aliases
    def canon(self, v: Value) -> Value:
        while v in self.alias:
            v = self.alias[v]
        return v

    def _find(self, v: Value) -> Value:
        v = self.canon(v)
        root = v
        while root in self.parent:
            root = self.parent[root]
        return root

    def _union(self, a: Value, b: Value) -> None:
        self.members += [self.canon(a), self.canon(b)]
        ra, rb = self._find(a), self._find(b)
        if ra is not rb:
            self.parent[ra] = rb

    def _aliases(self, op: Operation) -> None:
        """Values that are another's register (backend/lower/control.py): a ``for`` loop's results
        are its carried values; a ``while`` loop's results and its body's arguments are the values
        its condition passes on."""
        if op.name == "scf.for":
            for r, a in zip(op.results, op.regions[0].block.args[1:], strict=True):
                self.alias[r] = a
        elif op.name == "scf.while":
            cond = op.regions[0].block.terminator
            passed = cond.operand_group("value") if cond is not None else []
            for a, p in zip(op.regions[1].block.args, passed, strict=True):
                self.alias[a] = p
            for r, p in zip(op.results, passed, strict=True):
                self.alias[r] = p

    def _classes(self, op: Operation) -> None:
        """Join the values a loop edge or an ``if`` merge copies into one another."""
        if op.name == "scf.for":
            body = op.regions[0].block
            args = body.args[1:]
            term = body.terminator
            yields = term.operands if term is not None else []
            for a, init, y in zip(args, op.operand_group("init"), yields, strict=True):
                self._union(a, init)
                self._union(a, y)
        elif op.name == "scf.while":
            before, after = op.regions[0].block, op.regions[1].block
            term = after.terminator
            yields = term.operands if term is not None else []
            for a, init, y in zip(before.args, op.operands, yields, strict=True):
                self._union(a, init)
                self._union(a, y)
        elif op.name == "scf.if":
            for region in op.regions:
                term = region.block.terminator
                for r, y in zip(op.results, term.operands if term is not None else [], strict=True):
                    self._union(r, y)

    def related(self, v: Value) -> set[Value]:
        """The values whose registers may be ``v``'s: its copy class and the operands its defining
        op may pass on, closed under both."""
        v = self.canon(v)
        if v not in self._related:
            seen, todo = {v}, [v]
            while todo:
                x = todo.pop()
                for y in (*self.by_root.get(self._find(x), ()), *passed_on(x)):
                    y = self.canon(y)
                    if y not in seen:
                        seen.add(y)
                        todo.append(y)
            self._related[v] = seen
        return self._related[v]

    def meta(self, wgmma: Operation) -> Value:
        return self.canon(wgmma.operand("a_meta"))

    # -------------------------------------------------------------- register writes
    def write(self, state: State, target: Value, site: _Site, source: Value | None = None) -> None:
        """``target`` is written at ``site``: by its definition, or (``source`` given) by a copy of
        ``source`` on an edge. Report every in-flight wgmma whose metadata register it may be."""
        u = self.canon(target)
        s = self.canon(source) if source is not None else None
        if s is u:
            return  # a value carried unchanged: no write
        for x in state:
            v = self.meta(x)
            if u is v:
                self._report(site, x, v, definite=True, copy=s is not None)
            elif s is not v and u in self.related(v):
                self._report(site, x, v, definite=False, copy=s is not None)

    def _report(self, site: _Site, x: Operation, v: Value, *, definite: bool, copy: bool) -> None:
        if site in self.found:
            return
        name = self._name(v)
        where = {"": "", "entry": "when this loop starts", "back edge": "at the end of each iteration of this loop",
                 "merge": "at the end of this `if`"}[site.edge]
        if not copy and site.edge:  # a for loop's counter, stepped on the edge
            msg = (f"the loop's counter is {'set' if site.edge == 'entry' else 'stepped'} {where} and may share a "
                   "register with the metadata of a sparse wgmma that may still be in flight")
        elif definite and copy:
            msg = (f"{name or 'a loop-carried value'} is reassigned {where} while a sparse wgmma that reads it as "
                   "metadata may still be in flight")
        elif definite:
            msg = "this redefines the metadata of a sparse wgmma that may still be in flight"
        else:
            what = f"the value assigned {where}" if copy else "this value"
            held = f"{name}, the metadata" if name else "the metadata"
            msg = (f"{what} may share a register with {held} of a sparse wgmma that may still be in flight (one "
                   "register may hold the values a loop or an `if` assigns to one variable, and a value and one it "
                   "passes on unchanged)")
        labels = [Label(x.span, "the sparse wgmma reading that metadata")]
        wait = self.passed_by.get(x)
        if wait is not None:
            labels.append(Label(wait.span, f"this `hopper.wgmma_wait({wait.attrs.get('pending')}, ...)` leaves "
                                           "it in flight"))
        self.found[site] = Diagnostic(SP_SPARSE_META_IN_FLIGHT, msg, site.op.span, help=HELP,
                                      labels=tuple(labels), notes=(NOTE,))

    def _name(self, v: Value) -> str:
        """The source name of ``v`` or of a loop-carried variable of its copy class, quoted, or ''."""
        if v.name_hint:
            return f"`{v.name_hint}`"
        for w in self.by_root.get(self._find(v), ()):
            if w.name_hint and w.owner is None:
                return f"`{w.name_hint}`"
        return ""

    # -------------------------------------------------------------- the walk
    def block(self, block: Block, state: State) -> State:
        for op in block.ops:
            if op.name in ("scf.yield", "scf.condition"):
                continue  # read by the enclosing op
            state = self.op(op, state)
        return state

    def op(self, op: Operation, state: State) -> State:
        if op.name == "hopper.wgmma":
            state = {x: min(d + 1, DEPTH_CAP) for x, d in state.items()}
            if op.attrs.get("sparse"):
                state[op] = 0
        elif op.name == "hopper.wgmma_wait":
            n = op.attrs.get("pending", 0)
            for x, d in state.items():
                if d < n:
                    self.passed_by.setdefault(x, op)
            state = {x: d for x, d in state.items() if d < n}
        elif op.name == "scf.for":
            return self._for(op, state)
        elif op.name == "scf.while":
            return self._while(op, state)
        elif op.name == "scf.if":
            return self._if(op, state)
        elif op.name == "warp_specialize":
            out: State = {}
            for region in op.regions:
                out = _join(out, self.block(region.block, dict(state)))
            state = out
        elif op.regions:  # any other region op: each region any number of times, in any order
            state = self._fixed_point(state, lambda s: _join(s, self._all_regions(op, s)))
        for r in op.results:
            self.write(state, r, _Site(op))
        return state

    def _all_regions(self, op: Operation, state: State) -> State:
        out = dict(state)
        for region in op.regions:
            out = _join(out, self.block(region.block, state))
        return out

    def _fixed_point(self, entry: State, step) -> State:  # type: ignore[no-untyped-def]
        head = entry
        for _ in range(MAX_ROUNDS):
            nxt = _join(head, step(head))
            if nxt == head:
                return head
            head = nxt
        widened = _join(head, {x: 0 for x in self.sparse})  # every sparse wgmma in flight: reports more, never less
        return _join(widened, step(widened))

    def _for(self, op: Operation, state: State) -> State:
        body = op.regions[0].block
        counter, args = body.args[0], body.args[1:]
        self.write(state, counter, _Site(op, "entry"))  # the induction variable: set on entry, stepped
        for a, init in zip(args, op.operand_group("init"), strict=True):
            self.write(state, a, _Site(op, "entry"), init)
        term = body.terminator
        yields = term.operands if term is not None else []

        def iteration(head: State) -> State:
            out = self.block(body, head)
            self.write(out, counter, _Site(op, "back edge"))  # at the end of each iteration
            for a, y in zip(args, yields, strict=True):
                self.write(out, a, _Site(op, "back edge"), y)
            return out

        return self._fixed_point(state, iteration)  # the loop leaves from its head (0 or more iterations)

    def _while(self, op: Operation, state: State) -> State:
        before, after = op.regions[0].block, op.regions[1].block
        for a, init in zip(before.args, op.operands, strict=True):
            self.write(state, a, _Site(op, "entry"), init)
        term = after.terminator
        yields = term.operands if term is not None else []

        def iteration(head: State) -> State:
            out = self.block(after, self.block(before, head))
            for a, y in zip(before.args, yields, strict=True):
                self.write(out, a, _Site(op, "back edge"), y)
            return out

        head = self._fixed_point(state, iteration)
        return self.block(before, head)  # the loop leaves after its condition

    def _if(self, op: Operation, state: State) -> State:
        out: State = {}
        for region in op.regions:
            branch = self.block(region.block, dict(state))
            term = region.block.terminator
            for r, y in zip(op.results, term.operands if term is not None else [], strict=True):
                self.write(branch, r, _Site(op, "merge"), y)
            out = _join(out, branch)
        return out


def sparse_metadata_diagnostics(func: Function) -> list[Diagnostic]:
    """SP0370 for every write of a register that a sparse wgmma in flight reads as metadata."""
    if not any(op.name == "hopper.wgmma" and op.attrs.get("sparse") for op in func.walk()):
        return []
    analysis = _Analysis(func)
    analysis.block(func.body.block, {})
    return list(analysis.found.values())


@function_rule(needs=("WGMMA",))
def sparse_metadata_not_rewritten_in_flight(func: Function, ctx: Context) -> Iterator[Diagnostic]:
    yield from sparse_metadata_diagnostics(func)
