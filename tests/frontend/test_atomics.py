"""The atomic builtins (frontend/ops/atomic.py): their typing and diagnostics (code, message, span),
and their interpreter semantics against numpy on random non-zero inputs: each returns the old
values, elements of one tile naming the same address apply in row-major order, masked lanes
touch nothing and give 0, and programs apply one after another."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.driver.module import loads
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ir import types as T

RNG = np.random.default_rng(77)


def kernel(body: str, params: str) -> str:
    return "@kernel\ndef k(" + params + "):\n" + "".join("    " + ln + "\n" for ln in body.strip().splitlines())


def _compile_error(src: str) -> CompileError:
    kern = loads(src, "case.spk").kernels["k"]
    sig = {p.name: p.annotation for p in kern.params}
    with pytest.raises(CompileError) as info:
        kern.ir_for(*kern.signature_bindings(sig))
    return info.value


ERRORS = [
    ("atomic_max(out + arange(0, 32), 1.0)", "out: ptr[f32]", "SP0398", 3, 11,
     "`atomic_max` is not supported on f32", "reduce the tile first"),
    ("atomic_min(out, 1.0)", "out: ptr[f64]", "SP0398", 3, 11, "`atomic_min` is not supported on f64", "loop on"),
    ("atomic_add(out + arange(0, 32), 1.0)", "out: ptr[bf16]", "SP0398", 3, 11,
     "`atomic_add` is not supported on bf16", "accumulate in an f32"),
    ("atomic_add(out, 1)", "out: ptr[i16]", "SP0398", 3, 11, "`atomic_add` is not supported on i16", "f32"),
    ("atomic_xchg(out, 1)", "out: ptr[u8]", "SP0398", 3, 11, "`atomic_xchg` is not supported on u8", "32- and 64-bit"),
    ("atomic_cas(out, 0, 1)", "out: ptr[f16]", "SP0398", 3, 11, "`atomic_cas` is not supported on f16", "64-bit"),
    ("atomic_add(out, 1, sem=\"seq_cst\")", "out: ptr[i32]", "SP0399", 3, 34,
     "`sem` of an atomic must be one of 'relaxed', 'acquire', 'release', 'acq_rel', found 'seq_cst'", "default"),
    ("atomic_add(out, 1, scope=\"device\")", "out: ptr[i32]", "SP0399", 3, 36,
     "`scope` of an atomic must be one of 'cta', 'gpu', 'sys', found 'device'", "`scope='gpu'`"),
    ("atomic_add(out, 1, sem=n)", "out: ptr[i32], n: i32", "SP0399", 3, 34, "found a run-time value", "constant"),
    ("atomic_add(out + arange(0, 32), 1, mask=arange(0, 32))", "out: ptr[i32]", "SP0312", 3, 51,
     "a mask must be bool", "compare"),
    ("atomic_add(out + arange(0, 32), arange(0, 64))", "out: ptr[i32]", "SP0305", 3, 43,
     "cannot broadcast shapes", "size-1"),
    ("atomic_add(n, 1)", "out: ptr[i32], n: i32", "SP0315", 3, 22, "expected a pointer", "pointer parameter"),
]


@pytest.mark.parametrize(("call", "params", "code", "line", "col", "message", "fix"), ERRORS,
                         ids=[f"{e[2]}-{i}" for i, e in enumerate(ERRORS)])
def test_diagnostic(call: str, params: str, code: str, line: int, col: int, message: str, fix: str) -> None:
    err = _compile_error(kernel(f"old = {call}", params))
    d = err.diagnostics[0]
    assert (d.code, d.span.line, d.span.col) == (code, line, col), d.render()
    assert message in d.message, d.render()
    assert fix in (d.help or "") + d.message, d.render()
    assert "Traceback" not in err.render()


def test_result_types_follow_the_pointer() -> None:
    src = kernel("""
a = atomic_add(F + arange(0, 8), 1)
b = atomic_cas(L, 1, 2)
c = atomic_max(U + arange(0, 4)[:, None] + arange(0, 2)[None, :], 3, mask=arange(0, 2)[None, :] > 0)
store(out + arange(0, 8), a.to(i32) + b.to(i32))
store(out + arange(0, 4)[:, None] + arange(0, 2)[None, :], c.to(i32))
""", "F: ptr[f32], L: ptr[i64], U: ptr[u32], out: ptr[i32]")
    kern = loads(src, "case.spk").kernels["k"]
    func = kern.ir_for(*kern.signature_bindings({p.name: p.annotation for p in kern.params}))
    atoms = [op for op in func.body.block.ops if op.name.startswith("atomic_")]
    assert [(op.name, op.attrs["kind"], op.result.type) for op in atoms] == [
        ("atomic_rmw", "add", T.TileType(T.f32, (8,))), ("atomic_cas", "cas", T.i64),
        ("atomic_rmw", "max", T.TileType(T.u32, (4, 2)))]
    assert all((op.attrs["sem"], op.attrs["scope"]) == ("acq_rel", "gpu") for op in atoms)


# ------------------------------------------------------------------------------------------------
# interpreter
# ------------------------------------------------------------------------------------------------
RMW = """
@kernel
def k(p: ptr[{t}], idx: ptr[i32], v: ptr[{t}], old: ptr[{t}], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    i = load(idx + offs, mask=m)
    o = atomic_{op}(p + i, load(v + offs, mask=m), mask=m, sem="relaxed")
    store(old + offs, o, mask=offs < n + 3)
"""


def _serial(op: str, mem: np.ndarray, idx: np.ndarray, val: np.ndarray) -> np.ndarray:
    """The reference: element by element, in program then row-major order, in float64 / Python ints."""
    old = np.zeros(len(idx), np.float64 if mem.dtype.kind == "f" else object)
    ref = [float(x) if mem.dtype.kind == "f" else int(x) for x in mem]
    for e, (i, x) in enumerate(zip(idx, val, strict=True)):
        old[e] = ref[i]
        x = float(x) if mem.dtype.kind == "f" else int(x)
        new = {"add": ref[i] + x, "max": max(ref[i], x), "min": min(ref[i], x), "xchg": x}[op]
        ref[i] = float(mem.dtype.type(new)) if mem.dtype.kind == "f" else new
    mem[:] = np.array(ref).astype(mem.dtype)
    return old


@pytest.mark.parametrize(("op", "dtype"), [("add", np.int32), ("add", np.uint64), ("add", np.float32),
                                           ("add", np.float64), ("max", np.int32), ("min", np.int64),
                                           ("max", np.uint32), ("xchg", np.float32), ("xchg", np.int64)])
def test_rmw_against_a_serial_reference(op: str, dtype: type) -> None:
    name = {np.int32: "i32", np.uint64: "u64", np.float32: "f32", np.float64: "f64", np.int64: "i64",
            np.uint32: "u32"}[dtype]
    kern = loads(RMW.format(t=name, op=op), "t.spk").kernels["k"]
    n, block, slots = 77, 32, 9  # 3 programs, the last one ragged; 9 addresses: many collisions
    idx = RNG.integers(0, slots, n).astype(np.int32)
    if np.dtype(dtype).kind == "f":
        val = RNG.uniform(-3, 3, n).astype(dtype)
        val[val == 0] = 0.25
        mem = RNG.uniform(-3, 3, slots).astype(dtype)
    else:
        lo = 1 if np.dtype(dtype).kind == "u" else -50
        val = RNG.integers(lo, 50, n).astype(dtype)
        mem = RNG.integers(lo, 50, slots).astype(dtype)
    want_mem = mem.copy()
    want_old = _serial(op, want_mem, idx, val)
    old = np.full(n + 5, 99, dtype)
    kern.interpret[((n + block - 1) // block,)](mem, idx, val, old, n, BLOCK=block)
    assert np.array_equal(mem, want_mem)
    assert np.array_equal(old[:n].astype(np.float64 if np.dtype(dtype).kind == "f" else object), want_old)
    assert np.all(old[n:n + 3] == 0)  # masked lanes give 0 ...
    assert np.all(old[n + 3:] == 99)  # ... and nothing past them is written


def test_duplicates_within_a_tile_apply_in_row_major_order() -> None:
    src = kernel("""
r = arange(0, 4)[:, None]
c = arange(0, 8)[None, :]
o = atomic_xchg(p + (r + c) % 3, (r * 8 + c).to(f32))
store(old + r * 8 + c, o)
""", "p: ptr[f32], old: ptr[f32]")
    kern = loads(src, "t.spk").kernels["k"]
    p = np.array([-1.5, -2.5, -3.5], np.float32)
    old = np.full(32, 7.0, np.float32)
    kern.interpret[(1,)](p, old)
    want = np.array([-1.5, -2.5, -3.5])
    want_old = np.zeros(32)
    for e in range(32):  # row-major: element (r, c) is e = r * 8 + c
        a = (e // 8 + e % 8) % 3
        want_old[e], want[a] = want[a], e
    assert np.array_equal(old, want_old) and np.array_equal(p, want)


def test_cas_compares_bits_and_returns_the_old_values() -> None:
    src = kernel("""
offs = arange(0, 8)
o = atomic_cas(p + offs, load(c + offs), load(v + offs), mask=offs < 6)
store(old + offs, o)
""", "p: ptr[f32], c: ptr[f32], v: ptr[f32], old: ptr[f32]")
    kern = loads(src, "t.spk").kernels["k"]
    p = np.array([1.5, -0.0, 2.5, np.nan, 3.5, 4.5, 5.5, 6.5], np.float32)
    c = np.array([1.5, 0.0, 9.0, np.nan, 3.5, 4.0, 5.5, 6.5], np.float32)
    v = RNG.uniform(10, 20, 8).astype(np.float32)
    want = p.copy()
    swapped = [0, 3, 4]  # equal bits: 1.5, the same NaN, 3.5; -0.0 != 0.0 bit for bit; 6, 7 masked
    want[swapped] = v[swapped]
    old = np.full(8, 7.0, np.float32)
    before = p.copy()
    kern.interpret[(1,)](p, c, v, old)
    assert np.array_equal(p, want, equal_nan=True)
    assert np.array_equal(old[:6], before[:6], equal_nan=True) and np.all(old[6:] == 0)


def test_a_scalar_counter_hands_out_tickets_in_program_order() -> None:
    src = kernel("""
t = atomic_add(counter, 3)
store(out + program_id(0), t)
""", "counter: ptr[i32], out: ptr[i32]")
    kern = loads(src, "t.spk").kernels["k"]
    counter = np.array([5], np.int32)
    out = np.full(6, -1, np.int32)
    kern.interpret[(6,)](counter, out)
    assert counter[0] == 5 + 18 and np.array_equal(out, 5 + 3 * np.arange(6))


def test_integer_add_wraps_around() -> None:
    src = kernel("o = atomic_add(p, 1)\nstore(q, o)", "p: ptr[i32], q: ptr[i32]")
    kern = loads(src, "t.spk").kernels["k"]
    p, q = np.array([2**31 - 1], np.int32), np.zeros(1, np.int32)
    kern.interpret[(1,)](p, q)
    assert p[0] == -2**31 and q[0] == 2**31 - 1


def test_an_out_of_bounds_atomic_is_reported() -> None:
    from sparsile.frontend.interp.values import InterpreterError

    src = kernel("o = atomic_add(p + arange(0, 8), 1)", "p: ptr[i32]")
    kern = loads(src, "t.spk").kernels["k"]
    with pytest.raises(InterpreterError, match="out-of-bounds atomic access of `p`"):
        kern.interpret[(1,)](np.zeros(5, np.int32))


@pytest.mark.parametrize(("args", "col", "message"), [
    ('sem="relaxed"', 22, "`sem` of a fence must be one of 'acq_rel', 'sc', found 'relaxed'"),
    ('scope="device"', 24, "`scope` of a fence must be one of 'cta', 'gpu', 'sys', found 'device'"),
])
def test_fence_diagnostics(args: str, col: int, message: str) -> None:
    err = _compile_error(kernel(f"fence.memory({args})\nstore(out, 1)", "out: ptr[i32]"))
    d = err.diagnostics[0]
    assert (d.code, d.span.line, d.span.col) == ("SP0399", 3, col), d.render()
    assert message in d.message and "default" in (d.help or "")


def test_fence_orders_and_compiles() -> None:
    """fence.memory() is a no-op in the (sequential) interpreter and PTX fence.<sem>.<scope> on the GPU."""
    src = kernel('store(out, 7)\nfence.memory()\nfence.memory(sem="sc", scope="cta")\nstore(out + 1, 8)',
                 "out: ptr[i32]")
    kern = loads(src, "case.spk").kernels["k"]
    out = np.full(2, -1, np.int32)
    kern.interpret[(1,)](out)
    assert out.tolist() == [7, 8]
    ptx = kern.compile(target="sm_90a", stop_after="ptx", cache=False).ptx
    fences = [ln.strip() for ln in ptx.splitlines() if ln.strip().startswith("fence.")]
    assert fences == ["fence.acq_rel.gpu;", "fence.sc.cta;"]
