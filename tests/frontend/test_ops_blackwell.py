"""The Blackwell explicit ops (frontend/ops/blackwell.py): typing rules with their diagnostics, and
interpreter semantics checked against the float64 sparse reference for every MMA kind."""

from __future__ import annotations

import textwrap

import ml_dtypes
import numpy as np
import pytest

from sparsile.driver.module import loads
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.interp.values import InterpreterError
from sparsile.frontend.ir import types as T
from sparsile.frontend.ops.blackwell_operands import instr_k
from sparsile.stdlib import sparsity as S

HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
        "e5m2": ml_dtypes.float8_e5m2, "i8": np.int8, "u8": np.uint8}
LANG = {"tf32": "f32", "f16": "f16", "bf16": "bf16", "e4m3": "e4m3", "e5m2": "e5m2", "i8": "i8", "u8": "u8"}
TOOLKIT = {"i8": "s8"}
BYTES = {"f16": 2, "bf16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1, "i8": 1, "u8": 1}


def body_kernel(body: str, params: str = "") -> str:
    lines = textwrap.dedent(body).strip("\n").split("\n")
    return "@kernel(num_warps=4)\ndef k(" + params + "):\n" + "\n".join("    " + ln for ln in lines) + "\n"


def sema(src: str) -> None:
    loads(src).k.compile({}, target="sm_100a", stop_after="ir")


ALLOC = """\
a_s = smem.alloc(f16, (128, 64), swizzle=128)
b_s = smem.alloc(f16, (128, 128), swizzle=128)
acc = tmem.alloc(f32, (128, 128))
meta = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=f16)
"""

# (id, body, code, line, col, fragment); the body starts on line 3, column 5
ERRORS = [
    ("kind", 'x = tmem.alloc(f32, (128, 64), kind="accumulator")', "SP0542", 3, 41, "must be \"acc\""),
    ("rows", "x = tmem.alloc(f32, (64, 64))", "SP0542", 3, 25, "128 rows"),
    ("acc_dtype", "x = tmem.alloc(bf16, (128, 64))", "SP0542", 3, 20, "f32, f16 or i32"),
    ("meta_dtype", 'x = tmem.alloc(f32, (128, 4), kind="meta", meta_dtype=f16)', "SP0542", 3, 20, "u32 words"),
    ("meta_needs_operand_type", 'x = tmem.alloc(u32, (128, 4), kind="meta")', "SP0542", 3, 9, "meta_dtype="),
    ("meta_atoms", 'x = tmem.alloc(u32, (128, 6), kind="meta", meta_dtype=f16)', "SP0542", 3, 25, "allocate 8"),
    ("capacity", 'x = tmem.alloc(f32, (128, 512))\ny = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=f16)',
     "SP0540", 4, 9, "512 columns per CTA"),
    ("capacity_m256", "x = tmem.alloc(f32, (256, 256))\ny = tmem.alloc(f32, (128, 32))", "SP0540", 4, 9, "up to 544"),
    ("in_loop", "for i in range(3):\n    x = tmem.alloc(f32, (128, 64))", "SP0541", 4, 13, "top level"),
    ("meta_width", ALLOC.replace("meta_dtype=f16", "meta_dtype=e4m3") +
     "tcgen05.mma(a_s, b_s, acc, a_meta=meta)", "SP0546", 7, 39, "allocated for e4m3-class"),
    ("b_tiling_too_small", ALLOC.replace("(128, 128), swizzle=128", "(128, 128), swizzle=32") +
     "tcgen05.mma(a_s, b_s, acc, a_meta=meta)", "SP0547", 7, 22, "tiling too small"),
    ("unswizzled", ALLOC.replace("(128, 64), swizzle=128", "(128, 64)") +
     "tcgen05.mma(a_s, b_s, acc, a_meta=meta)", "SP0547", 7, 17, "must be swizzled"),
    ("n_step", ALLOC.replace("f16", "e4m3").replace("(128, 128))", "(128, 200))").replace("(128, 128)", "(200, 128)")
     + "tcgen05.mma(a_s, b_s, acc, a_meta=meta)", "SP0505", 7, 27, "not a multiple of 16"),
    ("k_step", ALLOC.replace("(128, 64), swizzle", "(128, 24), swizzle").replace("(128, 128), swizzle",
                                                                                   "(128, 48), swizzle")
     + "tcgen05.mma(a_s, b_s, acc, a_meta=meta)", "SP0544", 7, 17, "not a multiple of the sparse tcgen05 K step 32"),
    ("acc_type", ALLOC.replace("tmem.alloc(f32,", "tmem.alloc(i32,") + "tcgen05.mma(a_s, b_s, acc, a_meta=meta)",
     "SP0503", 7, 27, "accumulator type s32"),
    ("cta_group_without_cluster", ALLOC + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=2)", "SP0552", 7, 55,
     "needs a thread-block cluster"),
    ("cta_group_3", ALLOC + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=3)", "SP0545", 7, 55,
     "cta_group must be 1 or 2"),
    ("mixed_16bit", ALLOC.replace("(128, 128), swizzle=128)", "(128, 128), swizzle=128)\nb2 = smem.alloc(bf16, "
                                  "(128, 128), swizzle=128)") + "tcgen05.mma(a_s, b2, acc, a_meta=meta)",
     "SP0544", 8, 22, "same type"),
    ("accumulate_tile", ALLOC + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, accumulate=arange(0, 4) > 1)",
     "SP0551", 7, 56, "one flag"),
    ("copy_shape", 'e = smem.alloc(u32, (128, 8))\nm = tmem.alloc(u32, (128, 8), kind="meta", meta_dtype=f16)\n'
     "tcgen05.copy(e, m)", "SP0548", 5, 18, "2 KB atoms"),
    ("copy_columns", 'e = smem.alloc(u32, (2, 128, 4))\nm = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=f16)\n'
     "tcgen05.copy(e, m)", "SP0548", 5, 21, "2 atom(s) fill a (128, 8)"),
    ("commit_array", "b = mbarrier.alloc(2)\ntcgen05.commit(b)", "SP0549", 4, 20, "one mbarrier"),
    ("meta_slice", 'm = tmem.alloc(u32, (128, 8), kind="meta", meta_dtype=f16)\nx = m.slice(1, 2, 4)', "SP0543", 4, 20,
     "multiples of 4"),
    ("columns_of_256_rows", "x = tmem.alloc(f32, (256, 64))\ny = x.slice(1, 0, 32)", "SP0543", 4, 9,
     "slice the 128-row tile first"),
    ("load_not_pow2", "x = tmem.alloc(f32, (128, 192))\ny = x.load()", "SP0543", 4, 9, "power-of-two"),
    ("chunks_of_acc", "x = tmem.alloc(f32, (128, 64))\ny = x.load_chunks()", "SP0543", 4, 9, "metadata reference"),
    ("store_shape", "x = tmem.alloc(f32, (128, 64))\nx.store(zeros((128, 32), f32))", "SP0543", 4, 13, "(128, 32)"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_diagnostics(case):
    _, body, code, line, col, fragment = case
    with pytest.raises(CompileError) as info:
        sema(body_kernel(body))
    d = info.value.diagnostics[0]
    text = d.message + " " + (d.help or "") + " ".join(d.notes)
    assert (d.code, d.span.line, d.span.col) == (code, line, col), d.render()
    assert fragment in text, d.render()


def test_allocations_are_placed_in_program_order_and_aligned():
    src = body_kernel('a = tmem.alloc(f32, (128, 100))\nm = tmem.alloc(u32, (2, 128, 4), kind="meta", '
                      'meta_dtype=e4m3)\nx = tmem.alloc(f16, (128, 64), kind="a")\ny = tmem.alloc(f32, (256, 64))')
    func = loads(src).k.ir()
    placed = [(op.attrs["col"], op.attrs["ncols"]) for op in func.walk() if op.name == "tmem.alloc"]
    # 100 columns at 0; metadata 4-aligned at 100 (2 stages x 4); packed f16 A: 32 columns at 128
    # (32-aligned); two 128-row tiles of 64 columns at 160
    assert placed == [(0, 100), (100, 8), (128, 32), (160, 128)]


# ------------------------------------------------------------------------------------------------
# Interpreter
# ------------------------------------------------------------------------------------------------
def mma_source(a: str, b: str, acc: str, m: int, n: int, k: int, sparse: bool = True, a_tmem: bool = False,
               accumulate: str = "False", second: bool = False) -> str:
    """One CTA: TMA the operands (and metadata atoms) in, one tcgen05.mma, load the accumulator."""
    ka = k // 2 if sparse else k
    la, lb = LANG[a], LANG[b]
    sw_a, sw_b = min(128, ka * BYTES[a]), min(128, k * BYTES[b])
    atoms = k // (64 if a == "tf32" else 128) if sparse else 0  # one 2 KB atom per 128 (tf32: 64) K
    lines = [
        f"a_s = smem.alloc({la}, ({m}, {ka}), swizzle={sw_a})",
        f"b_s = smem.alloc({lb}, ({n}, {k}), swizzle={sw_b})",
        "bars = mbarrier.alloc(2)",
        f"acc = tmem.alloc({acc}, ({m}, {n}))",
    ]
    nbytes = m * ka * BYTES[a] + n * k * BYTES[b] + 2048 * atoms * (m // 128)
    if sparse:
        lines += [f"e_s = smem.alloc(u32, ({atoms * (m // 128)}, 128, 4))",
                  f'meta = tmem.alloc(u32, ({m}, {4 * atoms}), kind="meta", meta_dtype={la})']
    if a_tmem:
        lines.append(f'a_t = tmem.alloc({la}, ({m}, {ka}), kind="a")')
    lines += [f"mbarrier.expect(bars[0], {nbytes})", "tma.load(A, (0, 0), a_s, bars[0])"]
    for n0 in range(0, n, 256):
        size = min(256, n - n0)
        view = "b_s" if n <= 256 else f"b_s.slice(0, {n0}, {size})"
        lines.append(f"tma.load(B, ({n0}, 0), {view}, bars[0])")
    if sparse:
        for mt in range(m // 128):
            for ka_i in range(atoms):
                lines.append(f"tma.load(E, ({(ka_i * (m // 128) + mt) * 128}, 0), e_s[{mt * atoms + ka_i}], bars[0])")
    lines.append("mbarrier.wait(bars[0], 0)")
    if sparse:
        for mt in range(m // 128):
            view = "meta" if m == 128 else f"meta.slice(0, {128 * mt}, 128)"
            for ka_i in range(atoms):
                dst = view if atoms == 1 else f"{view}.slice(1, {4 * ka_i}, 4)"
                lines.append(f"tcgen05.copy(e_s[{mt * atoms + ka_i}], {dst})")
    a_op = "a_s"
    if a_tmem:
        lines += ["a_t.store(a_s.load())", "tcgen05.fence_before()", "barrier()", "tcgen05.fence_after()"]
        a_op = "a_t"
    meta_arg = ", a_meta=meta" if sparse else ""
    lines.append(f"tcgen05.mma({a_op}, b_s, acc{meta_arg}, accumulate={accumulate})")
    if second:
        lines.append(f"tcgen05.mma({a_op}, b_s, acc{meta_arg}, accumulate=True)")
    lines += ["tcgen05.commit(bars[1])", "mbarrier.wait(bars[1], 0)", "tcgen05.fence_after()"]
    for n0 in range(0, n, 256):
        size = min(256, n - n0)
        for m0 in range(0, m, 128 if n > 256 else m):
            rows = 128 if n > 256 else m
            view = "acc" if n <= 256 else f"acc.slice(1, {n0}, {size})"
            lines += [f"c = {view}.load()",
                      f"store(C + (arange(0, {rows}) + {m0})[:, None] * {n} + {n0} + arange(0, {size})[None, :], c)"]
    params = f"A: tensor[{la}, 2], B: tensor[{lb}, 2], C: ptr[{acc}]" + (", E: tensor[u32, 2]" if sparse else "")
    return body_kernel("\n".join(lines), params)


def operands(a: str, b: str, m: int, n: int, k: int, sparse: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    if a in ("i8", "u8"):
        lo = 0 if a == "u8" else -100
        dense = rng.integers(lo, 100, (m, k)).astype(HOST[a])
        bm = rng.integers(0 if b == "u8" else -100, 100, (n, k)).astype(HOST[b])
    else:
        dense = rng.standard_normal((m, k)).astype(np.float32).astype(HOST[a])
        bm = rng.standard_normal((n, k)).astype(np.float32).astype(HOST[b])
    if not sparse:
        return dense, None, bm, dense.astype(np.float64) @ bm.astype(np.float64).T
    dt = TOOLKIT.get(a, a)
    w = S.prune(dense, dt)
    vals, idx = S.compress(w, dt)
    meta = S.encode_metadata(idx, "tcgen05", dt, k=k)
    ref = S.sparse_matmul_reference(vals, meta, bm.T)
    return vals, np.asarray(meta.data).reshape(-1, 4), bm, ref


def run(src: str, a: str, b: str, acc: str, m: int, n: int, k: int, sparse: bool = True, seed: int = 0):
    vals, meta, bm, ref = operands(a, b, m, n, k, sparse, seed)
    c = np.full((m, n), np.nan if acc != "i32" else 0, {"f32": np.float32, "f16": np.float16, "i32": np.int32}[acc])
    args = (vals, bm, c, meta) if sparse else (vals, bm, c)
    loads(src).k.interpret[(1,)](*args)
    return c, ref


KINDS = [("f16", "f16", "f32", 128), ("bf16", "bf16", "f32", 128), ("f16", "f16", "f16", 128),
         ("tf32", "tf32", "f32", 64), ("e4m3", "e4m3", "f32", 128), ("e5m2", "e4m3", "f16", 128),
         ("i8", "i8", "i32", 128), ("u8", "i8", "i32", 128), ("u8", "u8", "i32", 256)]


@pytest.mark.parametrize("a,b,acc,k", KINDS, ids=[f"{a}x{b}->{acc}" for a, b, acc, _ in KINDS])
def test_sparse_mma_matches_reference(a, b, acc, k):
    c, ref = run(mma_source(a, b, acc, 128, 64, k), a, b, acc, 128, 64, k)
    err = np.abs(c.astype(np.float64) - ref)
    if acc == "i32":
        assert (err == 0).all()
    elif a == "tf32":  # products of tf32-rounded operands (10 mantissa bits)
        assert (err <= 2.0 ** -9 * np.abs(ref).max()).all()
    elif acc == "f16":  # D rounded to f16 after each instruction: 2**-10 of every partial sum's magnitude
        assert (err <= 2.0 ** -10 * _partial_sums(a, b, k).sum(axis=0) + 1e-3).all(), err.max()
    else:
        assert (err <= 2.0 ** -20 * np.abs(ref) + 1e-3).all(), err.max()


def _partial_sums(a: str, b: str, k: int, m: int = 128, n: int = 64, seed: int = 0) -> np.ndarray:
    """|exact partial sums| of the pruned A @ B^T of :func:`operands` after each sparse instruction's K,
    shape (instructions, m, n): where an f16 D is rounded."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((m, k)).astype(np.float32).astype(HOST[a])
    bm = rng.standard_normal((n, k)).astype(np.float32).astype(HOST[b]).astype(np.float64)
    w = np.asarray(S.prune(dense, TOOLKIT.get(a, a))).astype(np.float64)
    step = instr_k(T.scalar_type(a), True)
    return np.abs(np.cumsum([w[:, i:i + step] @ bm[:, i:i + step].T for i in range(0, k, step)], axis=0))


@pytest.mark.parametrize("a,acc", [("f16", "f32"), ("e4m3", "f32")])
def test_dense_mma_matches_reference(a, acc):
    c, ref = run(mma_source(a, a, acc, 128, 32, 64, sparse=False), a, a, acc, 128, 32, 64, sparse=False)
    assert np.abs(c - ref).max() <= 1e-3


@pytest.mark.parametrize("m,n,a", [(256, 128, "f16"), (128, 384, "e4m3"), (256, 64, "i8")])
def test_one_call_spans_several_instruction_tiles(m, n, a):
    """Seed 001: M = 256 on one CTA (two M = 128 tiles, each with its own metadata rows) and N > 256."""
    acc = "i32" if a == "i8" else "f32"
    c, ref = run(mma_source(a, a, acc, m, n, 128), a, a, acc, m, n, 128, seed=m + n)
    assert np.abs(c.astype(np.float64) - ref).max() <= 1e-3 * np.abs(ref).max()


def test_a_operand_in_tmem():
    c, ref = run(mma_source("f16", "f16", "f32", 128, 64, 128, a_tmem=True), "f16", "f16", "f32", 128, 64, 128)
    assert np.abs(c - ref).max() <= 1e-3


def test_accumulate_flag():
    """accumulate=False overwrites the (poisoned) accumulator; a second MMA adds to it; accumulating
    into a never-written accumulator gives NaN, as undefined TMEM would on the GPU."""
    c, ref = run(mma_source("f16", "f16", "f32", 128, 32, 128, second=True), "f16", "f16", "f32", 128, 32, 128)
    assert np.abs(c - 2 * ref).max() <= 1e-3
    c, _ = run(mma_source("f16", "f16", "f32", 128, 32, 128, accumulate="True"), "f16", "f16", "f32", 128, 32, 128)
    assert np.isnan(c).all()


def test_missing_metadata_copy_is_reported():
    src = mma_source("f16", "f16", "f32", 128, 32, 128).replace("tcgen05.copy(e_s[0], meta)", "")
    with pytest.raises(InterpreterError, match="invalid sparse metadata in TMEM"):
        run(src, "f16", "f16", "f32", 128, 32, 128)


META_LOAD = body_kernel("""\
e_s = smem.alloc(u32, (128, 4))
meta = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=DT)
bars = mbarrier.alloc(2)
mbarrier.expect(bars[0], 2048)
tma.load(E, (0, 0), e_s, bars[0])
mbarrier.wait(bars[0], 0)
tcgen05.copy(e_s, meta)
tcgen05.commit(bars[1])
mbarrier.wait(bars[1], 0)
tcgen05.fence_after()
rows = arange(0, 128)
w = meta.load()
store(W + rows[:, None] * 4 + arange(0, 4)[None, :], w)
c = meta.load_chunks()
store(CH + rows[:, None] * 32 + arange(0, 32)[None, :], c)
""", "E: tensor[u32, 2], W: ptr[u32], CH: ptr[u8]")


@pytest.mark.parametrize("dtype", ["f16", "tf32", "e4m3"])
def test_metadata_loads_back_to_registers(dtype):
    """Seed 000: the words come back as copied; the chunk view gives each (row, chunk) its 4-bit code."""
    k = 64 if dtype == "tf32" else 128
    rng = np.random.default_rng(5)
    w = S.prune(rng.standard_normal((128, k)).astype(HOST[dtype]), dtype)
    _, idx = S.compress(w, dtype)
    meta = np.asarray(S.encode_metadata(idx, "tcgen05", dtype).data).reshape(128, 4)
    words = np.zeros((128, 4), np.uint32)
    chunks = np.zeros((128, 32), np.uint8)
    loads(META_LOAD.replace("DT", LANG[dtype])).k.interpret[(1,)](meta, words, chunks)
    assert (words == meta).all()
    if dtype == "tf32":  # 1:2: the kept element's nibble is 0x4 (element 0) or 0xE (element 1)
        want = np.where(idx[:, :, 0] == 0, 0x4, 0xE)
    else:
        want = idx[:, :, 0] | (idx[:, :, 1] << 2)
    assert (chunks[:, :want.shape[1]] == want).all()


def test_the_example_of_docs_blackwell_runs_and_compiles():
    import pathlib
    import re

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "blackwell.md").read_text()
    (src,) = re.findall(r"^```spk\n(.*?)^```", doc, re.S | re.M)
    mod = loads(src)
    vals, meta, b, ref = operands("f16", "f16", 128, 128, 128, True, seed=11)
    c = np.full((128, 128), np.nan, np.float32)
    mod.one_tile.interpret[(1,)](vals, meta, b, c)
    assert np.abs(c - ref).max() <= 1e-3
    ck = mod.one_tile[(1,)].compile_for("sm_100a", vals, meta, b, c)
    assert ck.ptx.count("tcgen05.mma.sp.cta_group::1.kind::f16") == 4


def test_f16_accumulator_is_rounded_after_every_instruction():
    """A tcgen05.mma with an f16 D writes D once per instruction (K = 16 for dense f16): a partial sum
    of 16 x 8192 = 131072 is inf in f16 after the first instruction, and inf + finite stays inf, though
    the exact total (8) is small. The interpreter summed all of K in f64 and rounded once (8.0)."""
    m, n, k = 128, 32, 64
    src = mma_source("f16", "f16", "f16", m, n, k, sparse=False)
    a = np.ones((m, k), np.float16)
    b = np.full((n, k), 0.25, np.float16)
    b[:, :16], b[:, 16:32] = 8192.0, -8192.0
    b[1::2, :16], b[1::2, 16:32] = 1.0, -1.0  # odd columns: partial sums stay finite
    c = np.full((m, n), np.nan, np.float16)
    loads(src).k.interpret[(1,)](a, b, c)
    assert np.isposinf(c[:, 0::2]).all()
    assert (c[:, 1::2] == 8.0).all()
