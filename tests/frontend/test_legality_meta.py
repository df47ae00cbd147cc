"""``meta[T]``: sparse metadata typed by the operand width it was formatted for
(frontend/legality/meta.py). A mismatch is a compile-time error at the MMA (SP0574, through
helpers and loop-carried values), or a launch-time error for a tagged MetadataBuffer (the sparsity
toolkit's SP0809 / SP0810); matching tags compile and run (interpreter, float64 reference)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.driver.compiler import compile_kernel
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ir import types as T
from sparsile.frontend.legality.meta import MetaPointerType, MetaTensorType, check_metadata_argument, width_class
from sparsile.frontend.sema.type_ctors import InvalidAnnotation
from sparsile.stdlib import sparsity as S

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"


def test_the_type_constructor() -> None:
    ctor = sp.meta
    t = ctor[sp.f16]
    assert isinstance(t, MetaPointerType) and isinstance(t, T.PointerType) and t.elem == T.u32
    assert str(t) == "meta[f16]" and t != T.PointerType(T.u32)
    assert str(ctor[sp.e4m3, "sm90"]) == "meta[e4m3, 'sm90']"
    tt = ctor[sp.bf16, 2]
    assert isinstance(tt, MetaTensorType) and isinstance(tt, T.TensorType) and (tt.elem, tt.rank) == (T.u32, 2)
    assert ctor[np.float16] == t and ctor[ml_dtypes.bfloat16, 2] == tt  # NumPy / ml_dtypes types, as in @jit
    for bad in ((sp.f64,), (sp.f16, "csr"), (sp.f16, 9), ("f16",), (sp.f16, 2, "sm90", 1)):
        # Python evaluating a @jit annotation must not fail the definition: the compiler reports it (SP0302)
        got = ctor[bad]
        assert isinstance(got, InvalidAnnotation) and got.message == ctor.apply(bad), bad


def test_bad_annotation_is_a_diagnostic_at_the_annotation() -> None:
    with pytest.raises(CompileError) as info:
        sp.loads("@kernel\ndef k(E: meta[f64]):\n    pass\n", "case.spk").kernels["k"].signature_bindings({})
    d = info.value.diagnostics[0]
    assert d.code == "SP0302" and "f64 operands have no sparse metadata" in d.message and d.span.line == 2


def test_width_classes() -> None:
    assert [width_class(t) for t in ("f16", "bf16", "f32", "tf32", "e4m3", "i8", "u8", "f64")] == \
        ["16-bit", "16-bit", "tf32", "tf32", "8-bit", "8-bit", "8-bit", None]


def _sm90_kernel(name: str, meta_type: str):
    import re

    text = (KERNELS / "sparse_gemm_sm90.spk").read_text()
    src = re.sub(rf"(def {name}\(.*?E: )meta\[\w+\]", rf"\g<1>{meta_type}", text)
    assert src != text or f"E: {meta_type}" in text
    k = sp.loads(src, "sparse_gemm_sm90.spk").kernels[name]
    sig = {p.name: p.annotation for p in k.params if p.annotation is not sp.constexpr}
    return k, sig, src


@pytest.mark.parametrize(("name", "meta_type"), [("sparse_gemm_f16", "meta[f16]"), ("sparse_gemm_f16", "meta[bf16]"),
                                                 ("sparse_gemm_e4m3", "meta[e5m2]"), ("sparse_gemm_s8", "meta[u8]")])
def test_matching_width_compiles(name: str, meta_type: str) -> None:
    k, sig, _ = _sm90_kernel(name, meta_type)
    assert "wgmma.mma_async.sp" in compile_kernel(k, sig, target="sm_90a", stop_after="ptx").ptx


def test_mismatch_through_a_helper_and_a_loop_carried_value() -> None:
    """The sm90 GEMM loads its metadata in a helper and carries it across loop iterations."""
    k, sig, src = _sm90_kernel("sparse_gemm_f16", "meta[e4m3]")
    with pytest.raises(CompileError) as info:
        compile_kernel(k, sig, target="sm_90a", stop_after="ir")
    d = info.value.diagnostics[0]
    lines = src.split("\n")
    assert d.code == "SP0574"
    assert "hopper.wgmma(" in lines[d.span.line - 1]
    assert "f16 operands (16-bit) but its metadata was declared meta[e4m3], formatted for 8-bit" in d.message
    assert d.help and "meta[f16]" in d.help
    assert "def sparse_gemm_f16(" in lines[d.labels[0].span.line - 1]


TILE_SRC = """\
@kernel(num_warps=4)
def k(A: ptr[DT], E: META, B: ptr[DT], C: ptr[f32]):
    r = arange(0, 64)
    k2 = arange(0, 32)
    a = load(A + r[:, None] * 32 + k2[None, :])
    e = load(E + r[:, None] * 2 + arange(0, 2)[None, :])
    b = load(B + arange(0, 64)[:, None] * 64 + r[None, :])
    acc = sparse_dot(a, e, b)
    store(C + r[:, None] * 64 + r[None, :], acc)
"""


def _tile(dt: str, meta: str):
    return sp.loads(TILE_SRC.replace("DT", dt).replace("META", meta), "case.spk").kernels["k"]


def test_tile_level_sparse_dot_is_checked_too() -> None:
    k = _tile("e4m3", "meta[f16]")
    with pytest.raises(CompileError) as info:
        compile_kernel(k, {p.name: p.annotation for p in k.params}, target="sm_80", stop_after="ir")
    d = info.value.diagnostics[0]
    assert (d.code, d.span.line, d.span.col) == ("SP0574", 8, 11)
    assert (d.labels[0].span.line, d.labels[0].span.col) == (2, 21)  # the parameter `E: meta[f16]`


def test_tagged_kernel_runs_in_the_interpreter() -> None:
    rng = np.random.default_rng(7)
    w = S.prune_2_4(rng.standard_normal((64, 64)).astype(np.float16))
    vals, idx = S.compress(w)
    meta = S.encode_metadata(idx, "sm90", "f16")
    b = rng.standard_normal((64, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    _tile("f16", "meta[f16]").interpret[(1,)](vals, check_metadata_argument("E", sp.meta[sp.f16], meta), b, c)
    ref = w.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(c - ref).max() <= 1e-3 * np.abs(ref).max()


def test_launch_time_check_of_a_metadata_buffer() -> None:
    rng = np.random.default_rng(3)
    idx = S.compress(S.prune_2_4(rng.standard_normal((32, 64)).astype(np.float16)))[1]
    f16 = S.encode_metadata(idx, "sm90", "f16")
    e4m3 = S.encode_metadata(idx, "sm90", "e4m3")
    assert check_metadata_argument("E", sp.meta[sp.bf16], f16) is f16.data  # same width class
    assert check_metadata_argument("E", sp.meta[sp.f16, 2, "sm90"], f16) is f16.data
    with pytest.raises(S.SparsityError) as info:
        check_metadata_argument("E", sp.meta[sp.f16], e4m3)
    assert info.value.code == "SP0809" and info.value.help
    with pytest.raises(S.SparsityError) as info:
        check_metadata_argument("E", sp.meta[sp.f16, "tcgen05"], f16)
    assert info.value.code == "SP0810"
    raw = np.asarray(f16.data)
    assert check_metadata_argument("E", sp.meta[sp.e4m3], raw) is raw  # untagged: unchecked
    assert check_metadata_argument("E", sp.ptr[sp.u32], e4m3) is e4m3.data  # a plain pointer takes the words
