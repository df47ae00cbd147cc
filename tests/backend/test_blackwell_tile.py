"""The tile-level ``dot`` / ``sparse_dot`` on tcgen05 (backend/lower/blackwell_tile.py), not the
scalar FMA fallback, with an f16 accumulator (D stays f32 in TMEM: the accumulator tile widened on
the way in, the f32 sum rounded once on the way out, as ``ops.dot.mma_reference`` computes) and,
dense only, with a 64-row tile (M = 64, Layout F, ``tcgen05.ld/st.16x32bx2``).

No Blackwell GPU ran any of this: the checks are on the emitted LLVM IR (every MMA's instruction
descriptor decoded), the PTX (ptxas 13 and nvJitLink accept it; no FMA), and a golden PTX snapshot.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
from sparsile.driver.module import loads
from sparsile.frontend.ir import types as T
from sparsile.frontend.sema.core import ArgSpec
from sparsile.target.idesc import decode_idesc
from sparsile.target.targets import get_target
from sparsile.tests.backend.test_blackwell_lower import IR, TILE_DOT
from sparsile.tests.golden_ptx import check_golden

TILE_SPARSE = Path(__file__).resolve().parents[2] / "stdlib" / "kernels" / "sparse_gemm_tile.spk"
SPARSE_F16_ACC = TILE_SPARSE.read_text().replace("acc = zeros((BM, BN), f32)", "acc = zeros((BM, BN), f16)")
"""The shipped tile-level sparse GEMM with an f16 accumulator (its ``.to(f16)`` becomes a no-op)."""
KIND = {"f16": "f16", "e4m3": "f8f6f4", "i8": "i8", "f32": "tf32"}


def dense(dt: str, acc: str, *, bm: int = 128, nw: int = 4, bn: int = 64, target: str = "sm_100a",
          stop_after: str | None = "ptx"):
    """``TILE_DOT`` (a K loop of 64-wide ``dot`` calls) compiled for ``target``."""
    src = TILE_DOT.replace("NW", str(nw)).replace("DT", dt).replace("ACC", acc).replace("BM", str(bm))
    p = lambda t: ArgSpec(T.PointerType(T.scalar_type(t)), True)  # noqa: E731
    sig = {"A": p(dt), "B": p(dt), "C": p(acc), "K": T.i32, "BN": bn}
    kern = loads(src).k
    if stop_after is None:
        return kern.compile(sig, target=target)
    return kern.compile(sig, target=target, stop_after=stop_after)


def sparse(acc: str = "f16", *, stop_after: str | None = "ptx", bm: int = 128, bn: int = 64, bk: int = 64):
    """``sparse_gemm_tile`` (with an f16 accumulator unless ``acc="f32"``) compiled for sm_100a."""
    src = SPARSE_F16_ACC if acc == "f16" else TILE_SPARSE.read_text()
    kern = loads(src).sparse_gemm_tile
    sig = {p.name: ArgSpec(p.annotation, True) for p in kern.params if p.annotation is not T.CONSTEXPR}
    sig.update(BM=bm, BN=bn, BK=bk)
    if stop_after is None:
        return kern.compile(sig, target="sm_100a")
    return kern.compile(sig, target="sm_100a", stop_after=stop_after)


def mma_descriptors(llvm: str, kind: str, sparse_: bool) -> list:
    """The decoded instruction descriptor of every ``tcgen05.mma`` call of the LLVM IR."""
    name = f"llvm.nvvm.tcgen05.mma{'.sp' if sparse_ else ''}.shared"
    return [decode_idesc(int(c[3][1]), kind) for c in IR(llvm).calls(name)]


def tmem_columns(llvm: str) -> int:
    """The column count of the kernel's one ``tcgen05.alloc``."""
    cols = re.findall(r"call void @llvm\.nvvm\.tcgen05\.alloc\.shared\.cg1\(.*, i32 (\d+)\)", llvm)
    assert len(cols) == 1, cols
    return int(cols[0])


def stored_words(ir: IR) -> list[str]:
    """The i32 elements of every ``tcgen05.st`` call (followed through its ``insertelement`` chain)."""
    out = []
    store = re.compile(r"call void @llvm\.nvvm\.tcgen05\.st\.\w+\.x\d+\(ptr addrspace\(6\) \S+, "
                       r"(?:i64 \d+, )?<\d+ x i32> ([%\w.]+)")  # (16x32bx2: the half-split immediate first)
    for ln in ir.text.splitlines():
        m = store.search(ln)
        v = m.group(1) if m else None
        while v is not None and v != "poison":
            vec, elem = re.fullmatch(r"insertelement <\d+ x i32> (\S+), i32 (\S+), i32 \d+", ir.defs[v]).groups()
            out.append(elem)
            v = vec
    return out


def check_f32_d_path(ck, kind: str, sparse_: bool, n: int, nw: int = 4, m: int = 128) -> None:
    """tcgen05 MMAs with an f32 D; each accumulator element widened (``fpext``, exact) into the
    ``tcgen05.st`` words and each ``tcgen05.ld`` word (after its ``wait::ld``) rounded once
    (``fptrunc``, ``cvt.rn.f16.f32``); no FMA (the portable fallback's)."""
    ir = IR(ck.llvm)
    descs = mma_descriptors(ck.llvm, kind, sparse_)
    assert descs and all(d.d_dtype == "f32" and d.m == m and d.n == n and d.sparse == sparse_ for d in descs)
    per_thread = m * n // (32 * nw)
    floats = [ir.defs[w] for w in stored_words(ir) if ir.defs.get(w, "").startswith("bitcast float")]
    assert len(floats) == per_thread
    assert all(ir.defs[re.fullmatch(r"bitcast float (\S+) to i32", f).group(1)].startswith("fpext half ")
               for f in floats)
    rounded = re.findall(r"= fptrunc float (\S+) to half", ck.llvm)
    assert len(rounded) == per_thread
    for v in rounded:
        word = re.fullmatch(r"bitcast i32 (\S+) to float", ir.defs[v]).group(1)
        agg = re.fullmatch(r"extractvalue \{.*\} (\S+), \d+", ir.defs[word]).group(1)
        assert "tcgen05.wait::ld" in ir.defs[agg]
    assert not re.search(r"\bfma\.", ck.ptx)
    assert "cvt.f32.f16" in ck.ptx and "cvt.rn.f16.f32" in ck.ptx


@pytest.mark.parametrize("dt", ["f16", "e4m3"])
def test_tile_dot_with_an_f16_accumulator_runs_on_tcgen05_with_an_f32_d(dt):
    ck = dense(dt, "f16")
    check_f32_d_path(ck, KIND[dt], False, 64)
    assert f"tcgen05.mma.cta_group::1.kind::{KIND[dt]}" in ck.ptx
    assert tmem_columns(ck.llvm) == tmem_columns(dense(dt, "f32").llvm)  # one 32-bit column per element either way


def test_tile_sparse_dot_with_an_f16_accumulator_runs_on_tcgen05_with_an_f32_d():
    ck = sparse(bk=128)
    check_f32_d_path(ck, "f16", True, 64)
    assert [d.selector for d in mma_descriptors(ck.llvm, "f16", True)] == [0, 1, 0, 1]
    assert tmem_columns(ck.llvm) == tmem_columns(sparse("f32", bk=128).llvm)


def test_f16_and_f32_accumulators_share_the_mma_sequence():
    """Same descriptors (D f32), same TMEM columns and access shapes: only the two conversions differ."""
    f16, f32 = dense("f16", "f16"), dense("f16", "f32")
    assert IR(f16.llvm).calls("llvm.nvvm.tcgen05.mma.shared") and \
        [c[3] for c in IR(f16.llvm).calls("llvm.nvvm.tcgen05.mma.shared")] == \
        [c[3] for c in IR(f32.llvm).calls("llvm.nvvm.tcgen05.mma.shared")]
    shapes = lambda p: sorted(re.findall(r"tcgen05\.(?:ld|st)\.sync\.aligned\.\w+\.x\d+\.b32", p))  # noqa: E731
    assert shapes(f16.ptx) == shapes(f32.ptx)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("which", ["dense-f16", "dense-e4m3", "sparse"])
def test_ptxas_and_nvjitlink_accept_the_f16_accumulator_kernels(which):
    ck = sparse(stop_after=None) if which == "sparse" else dense(which.split("-")[1], "f16", stop_after=None)
    proc = assemble_with_ptxas(ck.ptx, get_target("sm_100a"))
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\b0 bytes lmem", ck.info_log) and "0 bytes spill stores" in ck.info_log


def test_sparse_tile_f16_accumulator_ptx_matches_the_golden_snapshot():
    check_golden(sparse().ptx, "sparse_gemm_tile_f16acc.sm_100a.ptx")


# ------------------------------------------------------------------------------------------------
# Dense M = 64 (cta_group::1, Layout F: rows in lanes 0..15 of each warp's quarter)
# ------------------------------------------------------------------------------------------------
M64 = [("f16", "f32"), ("f16", "f16"), ("e4m3", "f32"), ("i8", "i32"), ("f32", "f32")]
D_NAME = {"f32": "f32", "f16": "f32", "i32": "s32"}


@pytest.mark.parametrize("nw", [4, 8])
@pytest.mark.parametrize("dt,acc", M64)
def test_dense_tile_dot_with_64_rows_runs_on_tcgen05(dt, acc, nw):
    """One M = 64 MMA per K step (descriptor M = 64; 64 / 32 / 128 / 128 / 64 ... K per step by kind),
    the accumulator moved with ``16x32bx2`` (the 32x32b shape would touch the unused lanes 16..31 of
    each quarter), no FMA."""
    ck = dense(dt, acc, bm=64, nw=nw)
    descs = mma_descriptors(ck.llvm, KIND[dt], False)
    steps = 64 // {"f16": 16, "e4m3": 32, "i8": 32, "f32": 8}[dt]
    assert len(descs) == steps and all(d.m == 64 and d.n == 64 and d.d_dtype == D_NAME[acc] for d in descs)
    assert f"tcgen05.mma.cta_group::1.kind::{KIND[dt]}" in ck.ptx and not re.search(r"\bfma\.", ck.ptx)
    moves = set(re.findall(r"tcgen05\.(?:ld|st)\.sync\.aligned\.(\w+)\.x\d+", ck.ptx))
    assert moves == {"16x32bx2"}
    assert tmem_columns(ck.llvm) == 64
    if acc == "f16":
        check_f32_d_path(ck, KIND[dt], False, 64, nw, m=64)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("dt,acc", M64)
def test_ptxas_and_nvjitlink_accept_the_64_row_kernels(dt, acc):
    ck = dense(dt, acc, bm=64, stop_after=None)
    proc = assemble_with_ptxas(ck.ptx, get_target("sm_100a"))
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\b0 bytes lmem", ck.info_log) and "0 bytes spill stores" in ck.info_log


def test_sparse_tile_with_64_rows_stays_portable():
    """Sparse M = 64 needs the M = 64 metadata layout in TMEM, which is not known (docs/hardware.md §0
    item 6): the sparse tile op keeps the portable path there."""
    ptx = sparse("f32", bm=64).ptx
    assert "tcgen05.mma" not in ptx


def test_dense_64_row_tile_ptx_matches_the_golden_snapshot():
    check_golden(dense("f16", "f32", bm=64).ptx, "tile_dot_m64_f16.sm_100a.ptx")
