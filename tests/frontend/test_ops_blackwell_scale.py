"""Block-scaled tcgen05.mma (kind::mxf8f6f4 ``.block_scale``) in frontend/ops/blackwell.py: typing
rules with their diagnostics (code, message, span), TMEM scale regions and copies, and interpreter
semantics against the float64 reference of stdlib/blockscale.py (random non-zero operands whose
blocks span many binades, so that a wrong scale, block or byte shows)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from sparsile.driver.module import loads
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.interp.values import InterpreterError
from sparsile.stdlib import blockscale as BS
from sparsile.stdlib import sparsity as S


def body_kernel(body: str, params: str = "") -> str:
    lines = textwrap.dedent(body).strip("\n").split("\n")
    return "@kernel(num_warps=4)\ndef k(" + params + "):\n" + "\n".join("    " + ln for ln in lines) + "\n"


def sema(src: str) -> None:
    loads(src).k.compile({}, target="sm_100a", stop_after="ir")


ALLOC = """\
a_s = smem.alloc(e4m3, (128, 128), swizzle=128)
b_s = smem.alloc(e4m3, (128, 256), swizzle=128)
acc = tmem.alloc(f32, (128, 128))
meta = tmem.alloc(u32, (128, 8), kind="meta", meta_dtype=e4m3)
sa = tmem.alloc(u32, (128, 4), kind="scale")
sb = tmem.alloc(u32, (128, 4), kind="scale")
"""
MMA = "tcgen05.mma(a_s, b_s, acc, a_meta=meta, a_scale=sa, b_scale=sb)"

# (id, body, code, line, col, fragment); the body starts on line 3, column 5
ERRORS = [
    ("scale_dtype", 'x = tmem.alloc(f32, (128, 4), kind="scale")', "SP0542", 3, 20, "u32 words"),
    ("scale_columns", 'x = tmem.alloc(u32, (128, 6), kind="scale")', "SP0542", 3, 25, "allocate 8"),
    ("scale_rows", 'x = tmem.alloc(u32, (256, 8), kind="scale")', "SP0542", 3, 25, "128 rows"),
    ("missing_b_scale", ALLOC + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, a_scale=sa)", "SP0559", 9, 5,
     "b_scale= is missing"),
    ("f16_operands", ALLOC.replace("e4m3", "f16").replace("(128, 128), swizzle", "(128, 64), swizzle")
     .replace("(128, 256), swizzle", "(128, 128), swizzle") + MMA, "SP0559", 9, 17, "e4m3 or e5m2"),
    ("f16_accumulator", ALLOC.replace("tmem.alloc(f32", "tmem.alloc(f16") + MMA, "SP0503", 9, 27, "f32"),
    ("narrow_b_scales", ALLOC.replace("(128, 256), swizzle", "(256, 256), swizzle")
     .replace("acc = tmem.alloc(f32, (128, 128))", "acc = tmem.alloc(f32, (128, 256))") + MMA, "SP0559", 9, 65,
     "(128, >= 8)"),
    ("scale_is_metadata", ALLOC + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, a_scale=meta, b_scale=sb)", "SP0543", 9,
     53, "kind=\"scale\""),
    ("copy_shape", ALLOC + "x_s = smem.alloc(u32, (48, 4))\ntcgen05.copy(x_s, sa)", "SP0548", 10, 18,
     "512-byte atoms"),
    ("copy_width", ALLOC + "x_s = smem.alloc(u32, (64, 4))\ntcgen05.copy(x_s, sa)", "SP0548", 10, 23,
     "(128, 8) scale view"),
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


def test_cta_group_2_is_refused():
    src = ("@kernel(num_warps=4, cluster=(2, 1, 1))\ndef k():\n" + textwrap.indent(ALLOC, "    ")
           + "    tcgen05.mma(a_s, b_s, acc, a_meta=meta, a_scale=sa, b_scale=sb, cta_group=2)\n")
    with pytest.raises(CompileError) as info:
        sema(src)
    d = info.value.diagnostics[0]
    assert d.code in ("SP0555", "SP0559"), d.render()


def test_scale_regions_are_placed_in_whole_atoms():
    src = body_kernel('a = tmem.alloc(f32, (128, 100))\ns = tmem.alloc(u32, (3, 128, 8), kind="scale")\n'
                      'm = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=e4m3)')
    placed = [(op.attrs["col"], op.attrs["ncols"]) for op in loads(src).k.ir().walk() if op.name == "tmem.alloc"]
    assert placed == [(0, 100), (100, 24), (124, 4)]


# ------------------------------------------------------------------------------------------------
# Interpreter
# ------------------------------------------------------------------------------------------------
def operands(m: int, n: int, k: int, sparse: bool, seed: int):
    """Quantized operands with per-block magnitudes 2^-20..2^20 (a wrong scale is visible), the
    encoded scales as the kernel's TMA reads them, and the float64 reference."""
    rng = np.random.default_rng(seed)
    block = 64 if sparse else 32
    nb = -(-k // block)

    def spread(rows: int) -> np.ndarray:
        mag = np.exp2(rng.integers(-20, 21, (rows, nb)).astype(np.float64))
        return rng.standard_normal((rows, k)) * np.repeat(mag, block, axis=1)[:, :k]

    a = spread(m)
    if sparse:
        a = S.prune_2_4(a)
    qa, sa = BS.quantize_mx(a, block)
    qb, sb = BS.quantize_mx(spread(n), block)
    if sparse:
        vals, idx = S.compress(qa, "e4m3")
        meta = S.encode_metadata(idx, "tcgen05", "e4m3", k=k)
        ref = BS.scaled_matmul_reference(vals, sa, qb, sb, block=block, a_meta=meta)
        words = np.asarray(meta.data).reshape(-1, 4)
    else:
        vals, words = qa, None
        ref = BS.scaled_matmul_reference(qa, sa, qb, sb, block=block)
    return vals, words, BS.encode_scales(sa).reshape(-1, 4), qb, BS.encode_scales(sb).reshape(-1, 4), ref


def scaled_source(m: int, n: int, k: int, sparse: bool = True, b_type: str = "e4m3") -> str:
    """One CTA: TMA A, B, metadata and both scale tensors in, copy metadata and scales to TMEM, one
    block-scaled tcgen05.mma, load the accumulator."""
    from sparsile.frontend.ops.tmem_scales import scale_columns_needed

    ka = k // 2 if sparse else k
    steps = k // (64 if sparse else 32)
    groups = -(-steps // 4)
    la_atoms, lb_atoms = groups * (m // 128), groups * -(-n // 128)
    atoms = k // 128 if sparse else 0
    lines = [
        f"a_s = smem.alloc(e4m3, ({m}, {ka}), swizzle=128)",
        f"b_s = smem.alloc({b_type}, ({n}, {k}), swizzle=128)",
        f"sa_s = smem.alloc(u32, ({32 * la_atoms}, 4))",
        f"sb_s = smem.alloc(u32, ({32 * lb_atoms}, 4))",
        "bars = mbarrier.alloc(2)",
        f"acc = tmem.alloc(f32, ({m}, {n}))",
        f'sa = tmem.alloc(u32, (128, {scale_columns_needed(m, steps)}), kind="scale")',
        f'sb = tmem.alloc(u32, (128, {scale_columns_needed(n, steps)}), kind="scale")',
    ]
    nbytes = m * ka + n * k + 2048 * atoms * (m // 128) + 512 * (la_atoms + lb_atoms)
    if sparse:
        lines += [f"e_s = smem.alloc(u32, ({atoms * (m // 128)}, 128, 4))",
                  f'meta = tmem.alloc(u32, ({m}, {4 * atoms}), kind="meta", meta_dtype=e4m3)']
    lines += ["mbarrier.expect(bars[0], NBYTES)", "tma.load(A, (0, 0), a_s, bars[0])",
              "tma.load(SA, (0, 0), sa_s, bars[0])", "tma.load(SB, (0, 0), sb_s, bars[0])"]
    if k > 256:  # a TMA box is at most 256 elements wide: stage B through registers instead
        nbytes -= n * k
        lines += [f"b_s.store(B.load_tile((0, 0), ({n}, {k})))",
                  "fence.async_shared()", "barrier()"]
    else:
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
    lines += ["tcgen05.copy(sa_s, sa)", "tcgen05.copy(sb_s, sb)"]
    meta_arg = ", a_meta=meta" if sparse else ""
    lines.append(f"tcgen05.mma(a_s, b_s, acc{meta_arg}, a_scale=sa, b_scale=sb, accumulate=False)")
    lines += ["tcgen05.commit(bars[1])", "mbarrier.wait(bars[1], 0)", "tcgen05.fence_after()"]
    for n0 in range(0, n, 256):
        size = min(256, n - n0)
        for m0 in range(0, m, 128 if n > 256 else m):
            rows = 128 if n > 256 else m
            view = "acc" if n <= 256 else f"acc.slice(1, {n0}, {size})"
            if n > 256 and m > 128:
                view = f"acc.slice(0, {m0}, 128).slice(1, {n0}, {size})"
            lines += [f"c = {view}.load()",
                      f"store(C + (arange(0, {rows}) + {m0})[:, None] * {n} + {n0} + arange(0, {size})[None, :], c)"]
    params = (f"A: tensor[e4m3, 2], B: tensor[{b_type}, 2], C: ptr[f32], SA: tensor[u32, 2], SB: tensor[u32, 2]"
              + (", E: tensor[u32, 2]" if sparse else ""))
    return body_kernel("\n".join(lines).replace("NBYTES", str(nbytes)), params)


def run(m: int, n: int, k: int, sparse: bool = True, seed: int = 0, src: str | None = None):
    vals, words, sa, qb, sb, ref = operands(m, n, k, sparse, seed)
    c = np.full((m, n), np.nan, np.float32)
    args = (vals, qb, c, sa, sb) + ((words,) if sparse else ())
    loads(src or scaled_source(m, n, k, sparse)).k.interpret[(1,)](*args)
    return c, ref


def close(c: np.ndarray, ref: np.ndarray) -> bool:
    """f32 accumulation of exact products: relative to the row's and column's largest term."""
    scale = np.abs(ref).max(axis=1, keepdims=True) + np.abs(ref).max(axis=0, keepdims=True)
    return bool((np.abs(c.astype(np.float64) - ref) <= 2.0 ** -20 * scale).all())


@pytest.mark.parametrize("m,n,k", [(128, 64, 256), (128, 256, 512), (256, 128, 256), (128, 384, 256)])
def test_sparse_scaled_mma_matches_reference(m, n, k):
    c, ref = run(m, n, k, sparse=True, seed=m + n + k)
    assert np.isfinite(c).all() and close(c, ref)


@pytest.mark.parametrize("m,n,k", [(128, 64, 128), (128, 128, 256)])
def test_dense_scaled_mma_matches_reference(m, n, k):
    c, ref = run(m, n, k, sparse=False, seed=k)
    assert np.isfinite(c).all() and close(c, ref)


def test_scales_matter():
    """The same operands without their scales (all bytes 127) give a different product: the test
    above would catch scales that are ignored, misplaced by a lane quarter or read from the wrong
    byte."""
    vals, words, sa, qb, sb, ref = operands(128, 64, 256, True, 3)
    c = np.full((128, 64), np.nan, np.float32)
    loads(scaled_source(128, 64, 256)).k.interpret[(1,)](vals, qb, c, np.full_like(sa, 0x7F7F7F7F), sb, words)
    assert not close(c, ref)
    swapped = sa.copy()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]  # rows 0-31 and 32-63 exchange their scales
    loads(scaled_source(128, 64, 256)).k.interpret[(1,)](vals, qb, c, swapped, sb, words)
    assert not close(c, ref)


def test_uncopied_scales_are_nan():
    src = scaled_source(128, 64, 256).replace("tcgen05.copy(sb_s, sb)", "")
    c, _ = run(128, 64, 256, src=src)
    assert np.isnan(c).all()


def test_scales_not_duplicated_in_every_lane_quarter_are_reported():
    """A scale region written with tcgen05.st (one value per lane) instead of the duplicating copy."""
    src = scaled_source(128, 64, 256).replace("tcgen05.copy(sa_s, sa)",
                                              "sa.store(full((128, 4), 0x7F7F7F7F, u32) + arange(0, 128)[:, None])\n"
                                              "    tcgen05.fence_before()\n    barrier()\n    tcgen05.fence_after()")
    with pytest.raises(InterpreterError, match="differs between the TMEM lane quarters"):
        run(128, 64, 256, src=src)
