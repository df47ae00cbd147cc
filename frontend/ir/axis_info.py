"""Axis information: per-dimension contiguity, divisibility and constancy of integer and pointer
values (the analysis Triton calls AxisInfo).

* ``contiguity[d]``: the values form runs of this many consecutive integers (step 1) along dim d;
* ``divisibility[d]``: the first value of each such run is a multiple of this power of two (for
  pointers: in bytes);
* ``constancy[d]``: runs of this many equal values along dim d.

Layout inference uses it to pick vector widths for loads and stores; code generation uses it to
emit 16-byte accesses only where alignment and masks allow. Every answer is conservative.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from . import types as T
from .core import Function, Operation, Value

MAX_DIV = 1 << 30


@dataclass(frozen=True)
class AxisInfo:
    contiguity: tuple[int, ...]
    divisibility: tuple[int, ...]
    constancy: tuple[int, ...]

    @staticmethod
    def unknown(rank: int) -> AxisInfo:
        return AxisInfo((1,) * rank, (1,) * rank, (1,) * rank)


def pow2_factor(n: int) -> int:
    if n == 0:
        return MAX_DIV
    return min(MAX_DIV, n & -n)


def _rank(v: Value) -> int:
    return len(T.shape_of(v.type))


def _shape(v: Value) -> tuple[int, ...]:
    return T.shape_of(v.type)


class AxisAnalysis:
    def __init__(self, func: Function):
        self.info: dict[int, AxisInfo] = {}
        for p in func.runtime_params:
            if p.value is None:
                continue
            t = p.type
            if isinstance(t, T.PointerType):
                self.info[id(p.value)] = AxisInfo((1,), (16 if p.divisible_16 else t.elem.bytes,), (1,))
            elif isinstance(t, T.ScalarType) and t.is_int:
                self.info[id(p.value)] = AxisInfo((1,), (16 if p.divisible_16 else 1,), (1,))
        for op in func.walk():
            self._visit(op)

    def get(self, v: Value) -> AxisInfo:
        info = self.info.get(id(v))
        if info is None:
            r = max(1, _rank(v))
            return AxisInfo.unknown(r)
        return info

    def _set(self, v: Value, info: AxisInfo) -> None:
        self.info[id(v)] = info

    def _visit(self, op: Operation) -> None:
        name = op.name
        if name == "scf.for":  # the induction variable, also of a loop that yields nothing
            body = op.regions[0].block
            lb, step = self.get(op.operand("lower")), self.get(op.operand("step"))
            self._set(body.args[0], AxisInfo((1,), (gcd(lb.divisibility[0], step.divisibility[0]),), (1,)))
        if not op.results:
            return
        res = op.results[0]
        shape = _shape(res)
        rank = max(1, len(shape))
        full = shape if shape else (1,)
        if name == "arith.constant":
            val = op.attrs["value"]
            div = pow2_factor(int(val)) if isinstance(val, int) and not isinstance(val, bool) else 1
            self._set(res, AxisInfo((1,) * rank, (div,) * rank, full))
        elif name == "arange":
            self._set(res, AxisInfo((shape[0],), (pow2_factor(op.attrs["start"]),), (1,)))
        elif name == "program_id" or name == "num_programs":
            self._set(res, AxisInfo((1,), (1,), (1,)))
        elif name in ("splat",):
            s = self.get(op.operand("x"))
            self._set(res, AxisInfo((1,) * rank, (s.divisibility[0],) * rank, full))
        elif name == "broadcast":
            s = self.get(op.operand("x"))
            src_shape = _shape(op.operand("x"))
            cont, div, const = [], [], []
            for d in range(rank):
                if src_shape[d] == 1 and shape[d] != 1:
                    cont.append(1)
                    div.append(s.divisibility[d])
                    const.append(shape[d])
                else:
                    cont.append(s.contiguity[d])
                    div.append(s.divisibility[d])
                    const.append(s.constancy[d])
            self._set(res, AxisInfo(tuple(cont), tuple(div), tuple(const)))
        elif name == "expand_dims":
            s = self.get(op.operand("x"))
            ax = op.attrs["axis"]
            src_rank = _rank(op.operand("x"))
            if src_rank == 0:
                s = AxisInfo((), (), ())
            c, dv, k = list(s.contiguity), list(s.divisibility), list(s.constancy)
            # a new unit axis: each element is its own run there, so its divisibility is what every
            # element has (a contiguous run's elements past its first are not multiples of its start's)
            base_div = min(_at_runs(cc, d, 1) for cc, d in zip(c, dv, strict=True)) if dv else 1
            c.insert(ax, 1)
            dv.insert(ax, base_div)
            k.insert(ax, 1)
            self._set(res, AxisInfo(tuple(c), tuple(dv), tuple(k)))
        elif name == "arith.binary":
            self._binary(op)
        elif name == "addptr":
            p, off = self.get(op.operand("ptr")), self.get(op.operand("offset"))
            elem = T.element_type(res.type)
            eb = elem.elem.bytes if isinstance(elem, T.PointerType) else 1
            r = len(p.contiguity)
            off = _fit(off, r)
            p = _fit(p, r)
            cont = tuple(max(gcd(a, b), gcd(c, d)) for a, b, c, d in
                         zip(p.contiguity, off.constancy, p.constancy, off.contiguity, strict=True))
            # at the result's run starts: an operand's own run start moved by a multiple of the run
            div = tuple(gcd(_at_runs(pc, pd, r * eb), pow2_factor(_at_runs(oc, od, r) * eb)
                            if _at_runs(oc, od, r) < MAX_DIV else MAX_DIV)
                        for pc, pd, oc, od, r in zip(p.contiguity, p.divisibility, off.contiguity, off.divisibility,
                                                     cont, strict=True))
            const = tuple(gcd(a, b) for a, b in zip(p.constancy, off.constancy, strict=True))
            self._set(res, AxisInfo(cont, div, const))
        elif name == "arith.cmp":
            self._compare(op)
        elif name == "arith.cast" and _widens_exactly(op.operand("x").type, res.type):
            self._set(res, self.get(op.operand("x")))  # the same values: their runs and factors too
        elif name in ("arith.cast", "arith.select", "arith.unary", "math", "load"):
            # constancy survives elementwise maps of constant runs
            srcs = [self.get(v) for v in op.operands if _rank(v) == len(shape)]
            if srcs and shape:
                const = tuple(min(s.constancy[d] for s in srcs) for d in range(rank))
                self._set(res, AxisInfo((1,) * rank, (1,) * rank, const))
        # everything else: unknown (default)

    def _binary(self, op: Operation) -> None:
        res = op.results[0]
        a, b = self.get(op.operand("lhs")), self.get(op.operand("rhs"))
        rank = max(len(a.contiguity), len(b.contiguity))
        a, b = _fit(a, rank), _fit(b, rank)
        kind = op.attrs["op"]
        z = list(zip(a.contiguity, a.divisibility, a.constancy, b.contiguity, b.divisibility, b.constancy,
                     strict=True))
        if kind in ("add", "sub"):
            # c - x with x contiguous runs downwards: only a contiguous minuend keeps its runs
            cont = tuple(max(gcd(ca, kb), gcd(ka, cb) if kind == "add" else 1) for ca, _, ka, cb, _, kb in z)
            div = tuple(gcd(_at_runs(ca, da, r), _at_runs(cb, db, r)) for (ca, da, _, cb, db, _), r in zip(z, cont))
        elif kind == "mul":
            cont = tuple(1 for _ in z)
            # each element its own run: a contiguous operand's elements past its run start are odd
            div = tuple(min(MAX_DIV, _at_runs(ca, da, 1) * _at_runs(cb, db, 1)) for ca, da, _, cb, db, _ in z)
        elif kind == "shl":
            cont = tuple(1 for _ in z)
            div = tuple(1 for _ in z)
        else:
            cont = tuple(1 for _ in z)
            div = tuple(1 for _ in z)
        const = tuple(gcd(ka, kb) for _, _, ka, _, _, kb in z)
        if kind in ("floordiv", "and", "shr", "mod"):
            # x // c with contiguous x keeps runs of c equal values when aligned
            const = tuple(gcd(ka, kb) for _, _, ka, _, _, kb in z)
        self._set(res, AxisInfo(cont, div, const))

    def _compare(self, op: Operation) -> None:
        res = op.results[0]
        a, b = self.get(op.operand("lhs")), self.get(op.operand("rhs"))
        rank = max(len(a.contiguity), len(b.contiguity))
        a, b = _fit(a, rank), _fit(b, rank)
        const = []
        for d in range(rank):
            c = gcd(a.constancy[d], b.constancy[d])
            if op.attrs["pred"] in ("lt", "ge") and b.constancy[d] > 1:
                # contiguous runs starting at multiples of k, compared with a multiple of k, stay constant
                # (x < b changes at x = b, a block start; x <= b / x > b at b + 1, inside a block)
                run = min(a.contiguity[d], a.divisibility[d], b.divisibility[d])
                c = max(c, gcd(run, b.constancy[d]))
            const.append(c)
        self._set(res, AxisInfo((1,) * rank, (1,) * rank, tuple(const)))


def _widens_exactly(src: T.Type, dst: T.Type) -> bool:
    """Whether a cast from ``src`` to ``dst`` keeps every value (an integer widened: a signed one to a
    wider signed type, an unsigned one to a wider type of either kind), so that the result has the
    source's contiguity, divisibility and constancy (``i.to(i64)`` of an offset: 64-bit addressing
    that still vectorizes)."""
    a, b = T.element_type(src), T.element_type(dst)
    if not (isinstance(a, T.ScalarType) and isinstance(b, T.ScalarType)) or b.bits <= a.bits:
        return False
    return (a.kind == "int" and b.kind == "int") or (a.kind == "uint" and b.kind in ("int", "uint"))


def _at_runs(c: int, d: int, run: int) -> int:
    """The divisibility of an operand's values at the starts of a result's runs of ``run`` (index
    multiples of ``run``): its own ``d`` where each element starts a run (contiguity 1), else a run
    start of its own plus a multiple of ``run`` (for a pointer pass ``run`` in bytes)."""
    return d if c == 1 else gcd(d, run)


def _fit(info: AxisInfo, rank: int) -> AxisInfo:
    if len(info.contiguity) == rank:
        return info
    if len(info.contiguity) == 1:
        return AxisInfo((1,) * rank, info.divisibility * rank, (MAX_DIV,) * rank)
    raise ValueError("rank mismatch in axis analysis")
