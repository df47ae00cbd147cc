"""Semantic mutations of *generated* programs (tests/support/program_gen.py, program_gen_sparse.py).

Where tests/fuzz/mutate.py mutates the shipped ``.spk`` files mostly token by token, this module
starts from a random valid program of the differential generators and makes it invalid or unusual in
ways a user might: an element type changed (``f16`` -> ``e4m3``, ``ptr[i32]`` -> ``ptr[bool]``), a
tile shape or constexpr value (0, 1, non powers of two, huge), a reduction axis, the operands of
``dot`` / ``sparse_dot`` swapped, a statement dropped or duplicated, an expression replaced by another
one in scope, the kernel options (``num_warps``, ``maxnreg``, ``cluster``, ...), a mask of another
shape, a load through a pointer of another type, a store of a value of another type, and the compile
targets (any of the target table's). Mutations are made on the program's Python ``ast`` (``.spk``
is Python syntax), so that the mutant stays parseable and reaches the later passes.

A mutant is reproduced from ``(generator, program seed, mutation seed)`` alone
(:func:`make_mutant`); scripts/fuzz_mutants.py sweeps them and tests/fuzz/test_gen_mutants_quick.py
runs a fixed few in CI.
"""

from __future__ import annotations

import ast
import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64", "tf32",
          "e4m3", "e5m2")
"""Every scalar type name of the language."""
ODD_SIZES = (0, 1, 2, 3, 5, 7, 12, 24, 48, 96, 100, 256, 512, 1000, 4096, 2**16, 2**20, -4)
"""Tile sizes and constexpr values to try: zero, one, non powers of two, huge, negative."""
AXES = ("0", "1", "2", "-1", "-2", "-3", "3", "None", "True", "0.5")
OPTIONS = ("num_warps=1", "num_warps=2", "num_warps=3", "num_warps=4", "num_warps=5", "num_warps=8",
           "num_warps=16", "num_warps=32", "num_warps=64", "num_warps=0", "num_warps=-1", "maxnreg=24",
           "maxnreg=300", "num_stages=0", "num_ctas=2", "cluster=(2, 1, 1)", "cluster=(3, 1, 1)",
           "cluster=(16, 1, 1)", "pdl=True")
OTHERS = ("0", "-1", "1e30", "-0.0", "True", "3.5", "2**40", "float('nan')", "None")
MASK_FORMS = ("{m}", "{m}[:, None]", "{m}[None, :]", "trans({m})", "True", "False", "{m} & {m}", "~{m}",
              "{m}.to(i32)", "{m}[0]", "sum({m}, axis=0)")
ALL_TARGETS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_100f", "sm_103",
               "sm_103a", "sm_103f", "sm_110", "sm_110a", "sm_110f", "sm_120", "sm_120a", "sm_120f", "sm_121",
               "sm_121a", "sm_121f")
"""The target table (target/targets.py; tests/fuzz/test_gen_mutants_quick.py keeps the two equal)."""


@dataclass
class Mutant:
    """A mutated program: its text, the constexpr values it is compiled with, the targets it is
    compiled for, the grid and argument seed of an interpreter run, and what was changed."""

    gen: str
    seed: int
    mseed: int
    source: str
    consts: dict[str, Any]
    targets: tuple[str, ...]
    grid: tuple[int, ...]
    steps: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The mutant's id, as scripts/fuzz_mutants.py --replay takes it."""
        return f"{self.gen}:{self.seed}:{self.mseed}"


def generate(gen: str, seed: int) -> Any:
    """The generator's program for ``seed`` (its first constexpr variant)."""
    if gen == "sparse":
        from ..support.program_gen_sparse import generate_sparse
        return generate_sparse(seed).variants()[0]
    from ..support.program_gen import generate as generate_plain
    return generate_plain(seed).variants()[0]


# -- the mutations ----------------------------------------------------------------------------------

class _State:
    """The tree being mutated, its kernel function and the mutant's constexprs and targets."""

    def __init__(self, tree: ast.Module, consts: dict[str, Any], targets: list[str], rng: random.Random):
        self.tree, self.consts, self.targets, self.rng = tree, consts, targets, rng
        self.sized: list[tuple[dict[str, Any], str] | ast.Constant] = []  # what m_constexpr / m_literal set
        self.kernel = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.decorator_list)

    def nodes(self, pred: Callable[[ast.AST], bool]) -> list[ast.AST]:
        return [n for n in ast.walk(self.kernel) if pred(n)]

    def params(self, kind: str | None = None) -> list[ast.arg]:
        out = []
        for a in self.kernel.args.args:
            text = ast.unparse(a.annotation) if a.annotation is not None else ""
            if kind is None or text.startswith(kind):
                out.append(a)
        return out

    def assigned(self) -> list[str]:
        return sorted({t.id for n in ast.walk(self.kernel) if isinstance(n, ast.Assign)
                       for t in n.targets if isinstance(t, ast.Name)})


def _expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def _call_name(n: ast.AST) -> str:
    if isinstance(n, ast.Call):
        f = n.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return ""


def _keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def m_dtype(s: _State) -> str:
    names = s.nodes(lambda n: isinstance(n, ast.Name) and n.id in DTYPES)
    if not names:
        return ""
    n = s.rng.choice(names)
    old, n.id = n.id, s.rng.choice([t for t in DTYPES if t != n.id])  # type: ignore[attr-defined]
    return f"type {old} -> {n.id} on line {n.lineno}"  # type: ignore[attr-defined]


def m_constexpr(s: _State) -> str:
    if not s.consts:
        return ""
    k = s.rng.choice(sorted(s.consts))
    old, s.consts[k] = s.consts[k], s.rng.choice(ODD_SIZES)
    s.sized.append((s.consts, k))
    return f"constexpr {k} = {old} -> {s.consts[k]}"


def m_literal(s: _State) -> str:
    """A number in the kernel (a tile shape in ``zeros`` / ``reshape`` / ``broadcast_to``, an
    ``arange`` bound, a shift count, a constant) made odd."""
    nums = s.nodes(lambda n: isinstance(n, ast.Constant) and type(n.value) in (int, float))
    if not nums:
        return ""
    n = s.rng.choice(nums)
    old, n.value = n.value, s.rng.choice(ODD_SIZES)  # type: ignore[attr-defined]
    s.sized.append(n)  # type: ignore[arg-type]
    return f"literal {old!r} -> {n.value!r} on line {n.lineno}"  # type: ignore[attr-defined]


def m_axis(s: _State) -> str:
    reds = s.nodes(lambda n: _call_name(n) in ("sum", "max", "min", "argmax", "argmin", "cumsum", "reduce"))
    if not reds:
        return ""
    call: ast.Call = s.rng.choice(reds)  # type: ignore[assignment]
    new = s.rng.choice(AXES)
    kw = _keyword(call, "axis")
    if kw is None:
        call.keywords.append(ast.keyword("axis", _expr(new)))
    else:
        kw.value = _expr(new)
    if s.rng.random() < 0.2:
        call.keywords.append(ast.keyword("keep_dims", _expr(s.rng.choice(["True", "False", "1"]))))
    return f"axis of {_call_name(call)} on line {call.lineno} -> {new}"


def m_swap(s: _State) -> str:
    """The positional arguments of a call permuted (``dot`` / ``sparse_dot`` first)."""
    mm = s.nodes(lambda n: _call_name(n) in ("dot", "sparse_dot") and len(n.args) > 1)  # type: ignore[attr-defined]
    calls = mm or s.nodes(lambda n: isinstance(n, ast.Call) and len(n.args) > 1)
    if not calls:
        return ""
    call: ast.Call = s.rng.choice(calls)  # type: ignore[assignment]
    i, j = s.rng.sample(range(len(call.args)), 2)
    call.args[i], call.args[j] = call.args[j], call.args[i]
    return f"arguments {i} and {j} of {_call_name(call)} swapped on line {call.lineno}"


def _bodies(node: ast.AST) -> list[list[ast.stmt]]:
    return [b for n in ast.walk(node) for b in (getattr(n, "body", None), getattr(n, "orelse", None))
            if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]


def m_stmt(s: _State) -> str:
    body = s.rng.choice(_bodies(s.kernel))
    i = s.rng.randrange(len(body))
    how = s.rng.choice(["drop", "dup", "move"])
    if how == "drop":
        if len(body) == 1:
            body[0] = ast.Pass()
        else:
            del body[i]
    elif how == "dup":
        body.insert(s.rng.randrange(len(body) + 1), copy.deepcopy(body[i]))
    else:
        st = body.pop(i)
        body.insert(s.rng.randrange(len(body) + 1), st)
    return f"statement {i} of a block: {how}"


def _replaceable(s: _State) -> list[tuple[ast.AST, str, int | None]]:
    """(parent, field, index) of every expression that is a value in the kernel body."""
    out = []
    for parent in ast.walk(s.kernel):
        if isinstance(parent, ast.arguments | ast.arg) or parent is s.kernel:
            continue
        for fname, value in ast.iter_fields(parent):
            if fname in ("targets", "target", "func", "ctx", "annotation", "decorator_list"):
                continue
            if isinstance(value, ast.expr):
                out.append((parent, fname, None))
            elif isinstance(value, list):
                out += [(parent, fname, i) for i, v in enumerate(value) if isinstance(v, ast.expr)]
    return out


def m_expr(s: _State) -> str:
    """An expression replaced by a name in scope, or by another expression of the kernel."""
    spots = _replaceable(s)
    if not spots:
        return ""
    parent, fname, idx = s.rng.choice(spots)
    names = [a.arg for a in s.kernel.args.args] + s.assigned()
    if s.rng.random() < 0.5:
        new: ast.expr = ast.Name(s.rng.choice(names), ast.Load())
    else:
        exprs = [n for n in ast.walk(s.kernel) if isinstance(n, ast.expr) and not isinstance(n, ast.Name)
                 and not isinstance(getattr(n, "ctx", None), ast.Store)
                 and not any(isinstance(x, ast.Slice) for x in ast.walk(n))]
        new = copy.deepcopy(s.rng.choice(exprs)) if exprs else ast.Name(s.rng.choice(names), ast.Load())
    if idx is None:
        setattr(parent, fname, new)
    else:
        getattr(parent, fname)[idx] = new
    return f"an expression on line {getattr(parent, 'lineno', '?')} replaced by {ast.unparse(new)[:60]}"


def m_options(s: _State) -> str:
    opts = [_expr(f"f({o})").keywords[0] for o in s.rng.sample(OPTIONS, s.rng.choice([1, 1, 2]))]  # type: ignore[attr-defined]
    s.kernel.decorator_list = [ast.Call(ast.Name("kernel", ast.Load()), [], opts)]
    return f"decorator -> {ast.unparse(s.kernel.decorator_list[0])}"


def m_targets(s: _State) -> str:
    s.targets[:] = list(ALL_TARGETS)
    return "compiled for every target"


def m_mask(s: _State) -> str:
    calls = s.nodes(lambda n: _call_name(n) in ("load", "store", "atomic_add", "atomic_max", "atomic_min",
                                                 "atomic_xchg", "atomic_cas"))
    if not calls:
        return ""
    call: ast.Call = s.rng.choice(calls)  # type: ignore[assignment]
    kw = _keyword(call, "mask")
    if kw is not None and s.rng.random() < 0.2:
        call.keywords.remove(kw)
        return f"mask of {_call_name(call)} on line {call.lineno} dropped"
    bools = [n for n in s.assigned() if n in ("m", "mask")] or ["m"]
    base = ast.unparse(kw.value) if kw is not None and s.rng.random() < 0.5 else s.rng.choice(bools)
    new = s.rng.choice(MASK_FORMS).format(m=f"({base})")
    if kw is None:
        call.keywords.append(ast.keyword("mask", _expr(new)))
    else:
        kw.value = _expr(new)
    return f"mask of {_call_name(call)} on line {call.lineno} -> {new[:60]}"


def m_other(s: _State) -> str:
    loads = s.nodes(lambda n: _call_name(n) == "load")
    if not loads:
        return ""
    call: ast.Call = s.rng.choice(loads)  # type: ignore[assignment]
    kw = _keyword(call, "other")
    new = s.rng.choice(OTHERS)
    if kw is None:
        call.keywords.append(ast.keyword("other", _expr(new)))
    else:
        kw.value = _expr(new)
    return f"other= of load on line {call.lineno} -> {new}"


def m_pointer(s: _State) -> str:
    """A load or store through another pointer parameter (of another element type), or a pointer
    parameter's element type changed."""
    ptrs = s.params("ptr")
    uses = s.nodes(lambda n: isinstance(n, ast.Name) and n.id in {p.arg for p in ptrs})
    if not ptrs:
        return ""
    if uses and s.rng.random() < 0.6:
        n: ast.Name = s.rng.choice(uses)  # type: ignore[assignment]
        old, n.id = n.id, s.rng.choice(ptrs).arg
        return f"pointer {old} -> {n.id} on line {getattr(n, 'lineno', '?')}"
    p = s.rng.choice(ptrs)
    p.annotation = _expr(s.rng.choice([f"ptr[{s.rng.choice(DTYPES)}]", "i32", "f32", "tensor[f16, 2]",
                                       "ptr[ptr[f32]]", "constexpr"]))
    return f"parameter {p.arg}: {ast.unparse(p.annotation)}"


def m_store(s: _State) -> str:
    """A stored value converted to another type, replaced by a scalar or by another value."""
    stores = s.nodes(lambda n: _call_name(n) in ("store", "store_tile") and len(n.args) > 1)  # type: ignore[attr-defined]
    if not stores:
        return ""
    call: ast.Call = s.rng.choice(stores)  # type: ignore[assignment]
    old = ast.unparse(call.args[1])
    names = s.assigned()
    new = s.rng.choice([f"({old}).to({s.rng.choice(DTYPES)})", "1", "2.5", "True",
                        s.rng.choice(names) if names else "0", f"({old})[:, None]", f"trans({old})"])
    call.args[1] = _expr(new)
    return f"stored value on line {call.lineno} -> {new[:60]}"


MUTATIONS: dict[str, Callable[[_State], str]] = {
    "dtype": m_dtype, "constexpr": m_constexpr, "literal": m_literal, "axis": m_axis, "swap": m_swap,
    "stmt": m_stmt, "expr": m_expr, "options": m_options, "targets": m_targets, "mask": m_mask,
    "other": m_other, "pointer": m_pointer, "store": m_store,
}
WEIGHTS = {"dtype": 3, "constexpr": 2, "literal": 2, "axis": 1, "swap": 1, "stmt": 2, "expr": 3, "options": 1,
           "targets": 1, "mask": 2, "other": 1, "pointer": 2, "store": 2}


def make_mutant(gen: str, seed: int, mseed: int, n_targets: int = 3) -> Mutant:
    """The mutant ``mseed`` of the ``gen`` program ``seed`` (``gen``: ``"plain"`` or ``"sparse"``):
    one to three mutations, compiled for ``n_targets`` targets drawn from the table (every target
    when a ``targets`` mutation was drawn)."""
    rng = random.Random(f"{gen}:{seed}:{mseed}")
    program = generate(gen, seed)
    tree = ast.parse(program.source)
    targets = rng.sample(ALL_TARGETS, n_targets)
    state = _State(tree, dict(program.consts), targets, rng)
    steps = []
    kinds = list(WEIGHTS)
    for _ in range(rng.choice([1, 1, 2, 3])):
        for _attempt in range(5):
            kind = rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
            what = MUTATIONS[kind](state)
            if what:
                steps.append(f"{kind}: {what}")
                break
    source = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    m = Mutant(gen, seed, mseed, source, state.consts, tuple(targets), tuple(program.grid), steps)
    return _capped(m, state, tree)


TILE_CAP = 2**17
"""The most elements a mutant's tile may have (docs/testing.md): larger tiles, legal up to SP0344's 2**20,
take minutes in LLVM and ptxas, time the sweeps out and find nothing that smaller ones do not."""
MAX_TILE = 2**20
"""SP0344's limit: tiles larger than it are refused at once, a diagnostic the mutants keep exercising."""


def _capped(m: Mutant, state: _State, tree: ast.Module) -> Mutant:
    """``m``, or where a constexpr or literal it set to 4096 or more makes a tile of more than
    :data:`TILE_CAP` elements (and at most :data:`MAX_TILE`), ``m`` with those values halved until
    its tiles fit (a ``cap`` step says so). Other mutants, those whose largest tile halving them does
    not shrink among them, are returned as they were drawn."""
    def value(s: tuple[dict[str, Any], str] | ast.Constant) -> Any:
        return s[0][s[1]] if isinstance(s, tuple) else s.value

    big = [s for s in state.sized if type(value(s)) is int and value(s) >= 4096]
    if not big:
        return m
    from .gen_runner import largest_tile

    def put(s: tuple[dict[str, Any], str] | ast.Constant, v: Any) -> None:
        if isinstance(s, tuple):
            s[0][s[1]] = v
        else:
            s.value = v

    before = largest_tile(m)
    drawn, values = m, [value(s) for s in big]
    n = before
    while n is not None and TILE_CAP < n <= MAX_TILE and any(value(s) > 1 for s in big):
        for s in big:
            put(s, value(s) // 2)
        source = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
        m = Mutant(m.gen, m.seed, m.mseed, source, state.consts, m.targets, m.grid, m.steps)
        n = largest_tile(m)
    if n == before:  # halving them did not shrink the tile (they size none): the mutant as drawn
        for s, v in zip(big, values, strict=True):
            put(s, v)
        return drawn
    m.steps = [*m.steps, f"cap: halved to {[value(s) for s in big]} (largest tile {before} -> {n} elements)"]
    return m
