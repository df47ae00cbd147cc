"""The GPU sparsity toolkit (stdlib/kernels/sparsity_24.spk through sparsity_gpu) in the CPU
interpreter, bit for bit against the host toolkit: prune, compress + encode ("sm90", "tcgen05"),
decompress and validate, on inputs with ties, all-zero chunks, negative zeros, NaN and ragged
shapes; every diagnostic with its code and message; GPU runs of large shapes (marked gpu)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sparsile
from sparsile.stdlib import sparsity as S
from sparsile.stdlib.kernels import sparsity_gpu as G
from sparsile.stdlib.sparsity import SparsityError

DTYPES = ("f16", "bf16", "tf32", "e4m3", "s8")
FORMATS = ("sm90", "tcgen05")


def tricky(dtype: str, m: int, k: int, seed: int) -> np.ndarray:
    """Small integers (many equal magnitudes: ties), all-zero chunks, negative zeros, NaN."""
    op = S.operand_type(dtype)
    rng = np.random.default_rng(seed)
    if dtype in ("s8", "u8"):
        lo = -128 if dtype == "s8" else 0
        w = rng.choice(np.array([lo, lo + 1, -3, -1, 0, 0, 1, 3, 127], dtype=np.int64), size=(m, k))
        return np.clip(w, lo, 255 if dtype == "u8" else 127).astype(op.host_dtype)
    w = rng.integers(-3, 4, size=(m, k)).astype(np.float32).astype(op.host_dtype)
    w[rng.random((m, k)) < 0.05] = -0.0
    if m > 2 and k > 8:
        w[1, :8] = 0
        w[2, 4:8] = -0.0
        w[0, 0] = np.nan
    return w


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8)


def host_reference(w: np.ndarray, dtype: str, fmt: str) -> tuple[np.ndarray, S.MetadataBuffer]:
    values, indices = S.compress(w, dtype, prune=True)
    return values, S.encode_metadata(indices, fmt, dtype, k=w.shape[1])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_compress_prune_decompress_bit_identical(dtype: str, fmt: str) -> None:
    w = tricky(dtype, 37, 200, seed=len(dtype) + len(fmt))
    values, meta = G.compress_gpu(w, dtype, fmt, interpret=True)
    ref_values, ref_meta = host_reference(w, dtype, fmt)
    assert values.dtype == ref_values.dtype and values.shape == ref_values.shape
    np.testing.assert_array_equal(bits(values), bits(ref_values))
    assert (meta.fmt, meta.dtype, meta.m, meta.k) == (fmt, dtype, 37, 200)
    np.testing.assert_array_equal(meta.data, ref_meta.data)
    dense = G.decompress_gpu(values, meta, interpret=True)
    np.testing.assert_array_equal(bits(dense), bits(S.decompress(ref_values, ref_meta)))
    np.testing.assert_array_equal(bits(G.prune_gpu(w, dtype, interpret=True)), bits(S.prune(w, dtype)))
    G.validate_metadata_gpu(meta, fmt, dtype, 37, 200, interpret=True)
    S.validate_metadata(meta.to_host(), fmt, dtype, 37, 200)


@pytest.mark.parametrize("dtype", ("e5m2", "u8"))
def test_other_8bit_types(dtype: str) -> None:
    w = tricky(dtype, 20, 64, seed=3)
    values, meta = G.compress_gpu(w, dtype, "sm90", interpret=True)
    ref_values, ref_meta = host_reference(w, dtype, "sm90")
    np.testing.assert_array_equal(bits(values), bits(ref_values))
    np.testing.assert_array_equal(meta.data, ref_meta.data)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(DTYPES), fmt=st.sampled_from(FORMATS), m=st.integers(1, 40), k=st.integers(1, 80),
       seed=st.integers(0, 2**16))
def test_random_shapes_bit_identical(dtype: str, fmt: str, m: int, k: int, seed: int) -> None:
    check_round_trip(tricky(dtype, m, k, seed), dtype, fmt)


def check_round_trip(w: np.ndarray, dtype: str, fmt: str) -> None:
    """compress_gpu and decompress_gpu of ``w`` in the interpreter, bit for bit the host's."""
    values, meta = G.compress_gpu(w, dtype, fmt, interpret=True)
    ref_values, ref_meta = host_reference(w, dtype, fmt)
    np.testing.assert_array_equal(bits(values), bits(ref_values))
    np.testing.assert_array_equal(meta.data, ref_meta.data)
    np.testing.assert_array_equal(bits(G.decompress_gpu(values, meta, interpret=True)),
                                  bits(S.decompress(ref_values, ref_meta)))


def test_float32_input_is_cast_then_pruned() -> None:
    """The GPU kernels read the operand type: a wider w is cast first, then pruned (the host's
    compress(prune=True) prunes in w's precision first, so the reference casts explicitly)."""
    w = np.random.default_rng(5).standard_normal((16, 64)).astype(np.float32)
    values, meta = G.compress_gpu(w, "bf16", "tcgen05", interpret=True)
    ref_values, ref_meta = host_reference(w.astype(S.operand_type("bf16").host_dtype), "bf16", "tcgen05")
    np.testing.assert_array_equal(bits(values), bits(ref_values))
    np.testing.assert_array_equal(meta.data, ref_meta.data)
    f32_values, _ = G.compress_gpu(w, interpret=True)  # float32 means tf32 (1:2)
    np.testing.assert_array_equal(bits(f32_values), bits(S.compress(w, "tf32", prune=True)[0]))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ("bf16", "tf32", "s8"))
def test_kernel_writes_every_output_word(dtype: str, fmt: str) -> None:
    """The kernel launched directly on poisoned outputs: every value and every metadata word,
    padding included, is written."""
    op = S.operand_type(dtype)
    m, k = 21, 136
    w = tricky(dtype, m, k, seed=9)
    kc = k // op.group
    chunk_bytes = op.group * op.host_dtype.itemsize
    grid, mp, kw = G._grid(fmt, op, m, k)
    values = np.full((m, kc), 0xAB, np.dtype(f"u{chunk_bytes // 2}"))
    meta = np.full(S.metadata_shape(fmt, dtype, m, k), 0xDEADBEEF, np.uint32)
    bad = np.full(grid[0] * grid[1], -1, np.int32)
    G.kernel_module().prune_compress.interpret[grid](w.view(f"u{chunk_bytes}"), values, meta, bad, m, kc, mp, kw,
                                                     KIND=G._kind_of(op), FMT=fmt, INTERLEAVED=op.interleaved)
    ref_values, ref_meta = host_reference(w, dtype, fmt)
    np.testing.assert_array_equal(bits(values), bits(ref_values))
    np.testing.assert_array_equal(meta, ref_meta.data)


def test_compress_without_prune() -> None:
    w = S.prune_2_4(tricky("f16", 24, 96, seed=11))
    values, meta = G.compress_gpu(w, "f16", "sm90", prune=False, interpret=True)
    ref_values, ref_indices = S.compress(w, "f16")
    np.testing.assert_array_equal(bits(values), bits(ref_values))
    np.testing.assert_array_equal(meta.data, S.encode_metadata(ref_indices, "sm90", "f16").data)
    w[5, 8:12] = [1, 2, 3, 0]
    w[7, 0:4] = [1, 2, 3, 4]
    with pytest.raises(SparsityError) as err:
        G.compress_gpu(w, "f16", "sm90", prune=False, interpret=True)
    assert err.value.code == "SP0803"
    assert "row 5, group 2 (columns 8..11) has 3 nonzero elements, at most 2 allowed (1 more groups" in str(err.value)


def encoded(dtype: str = "f16", fmt: str = "sm90", m: int = 20, k: int = 64) -> G.DeviceMetadata:
    return G.compress_gpu(tricky(dtype, m, k, seed=2), dtype, fmt, interpret=True).meta


def with_nibble(meta: G.DeviceMetadata, index: tuple[int, ...], slot: int, nibble: int) -> np.ndarray:
    data = np.array(meta.data)
    data[index] = (data[index] & ~np.uint32(0xF << (4 * slot))) | np.uint32(nibble << (4 * slot))
    return data


@pytest.mark.parametrize("fmt", FORMATS)
def test_validate_flags_bad_nibbles(fmt: str) -> None:
    meta = encoded("f16", fmt)
    index, slot = S.word_position(fmt, S.operand_type("f16"), 9, 5)
    for nibble, code, text in ((0x0, "SP0807", "undefined metadata nibble 0x0 at row 9, group 5 (K 20..23)"),
                               (0xF, "SP0807", "undefined metadata nibble 0xF at row 9, group 5"),
                               (0x6, "SP0808", "unordered metadata nibble (idx0 > idx1)")):
        bad = with_nibble(meta, index, slot, nibble)
        with pytest.raises(SparsityError) as err:
            G.validate_metadata_gpu(bad, fmt, "f16", 20, 64, interpret=True)
        assert err.value.code == code and text in err.value.message
    unordered = with_nibble(meta, index, slot, 0x6)
    G.validate_metadata_gpu(unordered, fmt, "f16", 20, 64, allow_unordered=True, interpret=True)
    if fmt == "tcgen05":  # of the unordered codes only 0x6 exists for tcgen05
        with pytest.raises(SparsityError) as err:
            G.validate_metadata_gpu(with_nibble(meta, index, slot, 0x7), fmt, "f16", 20, 64, allow_unordered=True,
                                    interpret=True)
        assert err.value.code == "SP0807" and "not defined for tcgen05.mma.sp" in err.value.message
    else:
        G.validate_metadata_gpu(with_nibble(meta, index, slot, 0x7), fmt, "f16", 20, 64, allow_unordered=True,
                                interpret=True)


def test_validate_flags_padding_and_widths() -> None:
    meta = encoded("f16", "sm90", m=20, k=40)  # rows 20..31 and K 40..63 are padding
    index, slot = S.word_position("sm90", S.operand_type("f16"), 25, 12)
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(with_nibble(meta, index, slot, 0xA), "sm90", "f16", 20, 40, interpret=True)
    assert err.value.code == "SP0807" and "(padding)" in err.value.message
    tf32 = encoded("tf32", "sm90", m=16, k=64)
    with pytest.raises(SparsityError) as err:  # 2:4 codes in a tf32 buffer
        G.validate_metadata_gpu(np.full(tf32.shape, 0x98989898, np.uint32), "sm90", "tf32", 16, 64, interpret=True)
    assert err.value.code == "SP0809" and "formatted for 2:4 operands" in err.value.message
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(tf32, "sm90", "f16", interpret=True)
    assert err.value.code == "SP0809" and "metadata formatted for tf32 operands" in err.value.message
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(tf32, "tcgen05", interpret=True)
    assert err.value.code == "SP0810" and "is in the 'sm90' format but 'tcgen05' is expected" in err.value.message


def test_validate_shape_type_and_sizes() -> None:
    meta = encoded("e4m3", "sm90", m=16, k=128)
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(np.zeros((16, 3), np.uint32), "sm90", "e4m3", 16, 128, interpret=True)
    assert err.value.code == "SP0805" and "must have shape (16, 4), found (16, 3)" in err.value.message
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(np.zeros((16, 4), np.float32), "sm90", "e4m3", 16, 128, interpret=True)
    assert err.value.code == "SP0806" and "must be uint32 words, found float32" in err.value.message
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(np.zeros((16, 4), ml_dtypes.bfloat16), "sm90", "e4m3", 16, 128, interpret=True)
    assert err.value.code == "SP0806" and "must be uint32 words, found bfloat16" in err.value.message
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(np.asarray(meta.data), "sm90", "e4m3", interpret=True)
    assert err.value.code == "SP0812" and "needs fmt=, dtype=, m= and k=" in err.value.message
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(meta, m=17, interpret=True)
    assert err.value.code == "SP0812" and "encoded for an operand with m = 16, but m = 17" in err.value.message
    signed = G.validate_metadata_gpu(np.asarray(meta.data).view(np.int32), "sm90", "e4m3", 16, 128, interpret=True)
    assert signed.data.dtype == np.uint32


@pytest.mark.parametrize("m, k", [(16.7, 128), ("16", 128), (16, 128.5), (True, 128), (16, np.float64(128))])
def test_sizes_that_are_not_integers_are_refused_as_on_the_host(m, k) -> None:
    """int() would read 16.7 as 16 and True as 1: the sizes are checked as the host checks them."""
    meta = encoded("e4m3", "sm90", m=16, k=128)
    for words in (np.asarray(meta.data), meta):
        with pytest.raises(SparsityError) as err:
            G.validate_metadata_gpu(words, "sm90", "e4m3", m, k, interpret=True)
        bad, name = (m, "m") if not isinstance(m, int) or isinstance(m, bool) else (k, "k")
        assert err.value.code == "SP0804" and f"{name} must be a non-negative integer, got {bad!r}" in err.value.message
        with pytest.raises(SparsityError) as err:
            G.decompress_gpu(np.zeros((16, 64), ml_dtypes.float8_e4m3fn), words, "sm90", "e4m3", m=m, k=k,
                             interpret=True)
        assert err.value.code == "SP0804"


@pytest.mark.parametrize("flag", ["no", 1, None])
def test_yes_no_options_must_be_bools(flag) -> None:
    """prune="no" pruned, allow_unordered="no" loosened the check, interpret="no" ran the interpreter:
    a truthy string turned the option on. Refused (SP0804) as the kernel layer's flags are, host too."""
    from sparsile.stdlib.sparsity import compress, validate_metadata

    w = np.random.default_rng(5).standard_normal((16, 64)).astype(np.float16)
    meta = encoded("f16", "sm90", m=16, k=64)
    cases = [
        (lambda: G.compress_gpu(w, "f16", prune=flag, interpret=True), "prune"),
        (lambda: G.prune_gpu(w, interpret=flag), "interpret"),
        (lambda: G.prune_transposable_gpu(w, interpret=flag), "interpret"),
        (lambda: G.validate_metadata_gpu(meta, allow_unordered=flag, interpret=True), "allow_unordered"),
        (lambda: G.decompress_gpu(np.zeros((16, 32), np.float16), meta, interpret=flag), "interpret"),
        (lambda: compress(w, "f16", prune=flag), "prune"),
        (lambda: validate_metadata(meta, allow_unordered=flag), "allow_unordered"),
    ]
    for call, name in cases:
        with pytest.raises(SparsityError) as err:
            call()
        assert (err.value.code, err.value.message) == ("SP0804", f"{name} must be True or False, got {flag!r}")
    assert G.validate_metadata_gpu(meta, allow_unordered=np.bool_(True), interpret=True).m == 16  # numpy's bool


def test_bad_arguments() -> None:
    w = np.zeros((8, 16), np.float16)
    cases = [
        (lambda: G.compress_gpu(w, "e2m1", interpret=True), "SP0804", "do not handle e2m1"),
        (lambda: G.compress_gpu(w, "f16", "logical", interpret=True), "SP0804", "not 'logical'"),
        (lambda: G.compress_gpu(w, "f16", "csr", interpret=True), "SP0802", "unknown metadata format 'csr'"),
        (lambda: G.compress_gpu(w, "f17", interpret=True), "SP0801", "unknown sparse operand dtype 'f17'"),
        (lambda: G.compress_gpu(np.zeros(8, np.float16), interpret=True), "SP0804", "must be a 2-D (M, K) matrix"),
        (lambda: G.compress_gpu(np.zeros((2, 4), np.complex64), interpret=True), "SP0804", "multiplies real numbers"),
        (lambda: G.compress_gpu(np.zeros((2, 4), np.int64), interpret=True), "SP0804", "cannot tell the sparse"),
        (lambda: G.prune_gpu(np.zeros((2, 2, 4), np.float16), interpret=True), "SP0804", "2-D (M, K)"),
    ]
    for call, code, text in cases:
        with pytest.raises(SparsityError) as err:
            call()
        assert err.value.code == code and text in err.value.message, err.value
    with pytest.raises(SparsityError) as err:
        G._grid("sm90", S.operand_type("bf16"), 2**20, 2**13 + 4)
    assert err.value.code == "SP0804" and "the GPU kernels' 32-bit offsets reach 2147483647" in err.value.message
    values, meta = G.compress_gpu(tricky("f16", 8, 32, 1), "f16", interpret=True)
    with pytest.raises(SparsityError) as err:
        G.decompress_gpu(values[:, :8], meta, interpret=True)
    assert err.value.code == "SP0814" and "values must be a (8, 16) f16 array" in err.value.message
    with pytest.raises(SparsityError) as err:
        G.decompress_gpu(values.astype(np.float32), meta, interpret=True)
    assert err.value.code == "SP0814" and "got (8, 16) float32" in err.value.message


def test_no_gpu_is_a_launch_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparsile.backend import runtime

    monkeypatch.setattr(runtime, "has_gpu", lambda: False)
    with pytest.raises(sparsile.LaunchError) as err:
        G.compress_gpu(np.zeros((4, 8), np.float16))
    assert err.value.code == "SP0731" and "pass interpret=True" in str(err.value)


def test_empty_matrices() -> None:
    for shape in ((0, 16), (4, 0)):
        values, meta = G.compress_gpu(np.zeros(shape, np.float16), "f16", "sm90", interpret=True)
        ref_values, ref_meta = host_reference(np.zeros(shape, np.float16), "f16", "sm90")
        assert values.shape == ref_values.shape and meta.shape == ref_meta.shape


@pytest.mark.parametrize("dtype,fmt,load", [("bf16", "sm90", "ld.global.v2.b64"),
                                            ("e4m3", "tcgen05", "ld.global.v4.b32")])
def test_compiled_kernel_reads_at_memory_width(dtype: str, fmt: str, load: str) -> None:
    """The fused kernel compiled for sm_90a (no GPU needed): every weight byte is read by a 16-byte
    vector load, the top-2-of-4 selection and the nibble packing stay in registers (no shuffles,
    no spills), and the values are written by 16- or 8-byte vector stores."""
    op = S.operand_type(dtype)
    m, k = 57344, 8192
    kc = k // op.group
    chunk_bytes = op.group * op.host_dtype.itemsize
    grid, mp, kw = G._grid(fmt, op, m, k)
    w = np.zeros((2, 2), f"u{chunk_bytes}")
    values = np.zeros((2, 2), f"u{chunk_bytes // 2}")
    meta, bad = np.zeros((2, 2), np.uint32), np.zeros(1, np.int32)
    compiled = G.kernel_module().prune_compress[grid].compile_for(
        "sm_90a", w, values, meta, bad, m, kc, mp, kw, KIND=G._kind_of(op), FMT=fmt, INTERLEAVED=op.interleaved)
    ptx = compiled.ptx
    per_thread = G.WR * G.WC * 8 // (32 * compiled.num_warps)  # chunks
    assert ptx.count(load) == per_thread * chunk_bytes // 16
    assert "shfl" not in ptx and "ld.global.b" not in ptx
    assert "0 bytes spill stores" in compiled.info_log
    store = "st.global.v4.b32" if chunk_bytes == 8 else "st.global.v2.b32"
    assert ptx.count(store) >= per_thread * chunk_bytes // 2 // (16 if chunk_bytes == 8 else 8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_path_in_the_interpreter(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch code of the wrappers (views as u64/u32 words, uint32 allocations, padding K with
    F.pad, the cast, reading metadata back) on CPU tensors: treated as device tensors, which the
    interpreter reads and writes in place."""
    torch = pytest.importorskip("torch")
    real_kind = G.array_kind
    monkeypatch.setattr(G, "array_kind", lambda x: "torch" if real_kind(x) == "torch-cpu" else real_kind(x))
    monkeypatch.setattr(G, "_placed", lambda x, what, interpret: x)
    w = torch.from_numpy(tricky(dtype, 21, 50, seed=6).view(f"i{2 if dtype in ('f16', 'bf16') else 1}")
                         if dtype not in ("tf32", "s8") else tricky(dtype, 21, 50, seed=6))
    if dtype in ("f16", "bf16", "e4m3"):
        w = w.view({"f16": torch.float16, "bf16": torch.bfloat16}.get(dtype, torch.uint8))
        w = w.view(torch.float8_e4m3fn) if dtype == "e4m3" else w
    host = S.as_host_array(w)
    for fmt in FORMATS:
        values, meta = G.compress_gpu(w, dtype, fmt, interpret=True)
        assert isinstance(values, torch.Tensor) and meta.data.dtype == torch.uint32
        ref_values, ref_meta = host_reference(host, dtype, fmt)
        np.testing.assert_array_equal(bits(S.as_host_array(values)), bits(ref_values))
        np.testing.assert_array_equal(meta.to_host().data, ref_meta.data)
        dense = G.decompress_gpu(values, meta, interpret=True)
        np.testing.assert_array_equal(bits(S.as_host_array(dense)), bits(S.decompress(ref_values, ref_meta)))
    np.testing.assert_array_equal(bits(S.as_host_array(G.prune_gpu(w, dtype, interpret=True))),
                                  bits(S.prune(host, dtype)))
    np.testing.assert_array_equal(bits(S.as_host_array(G.prune_transposable_gpu(w, interpret=True))),
                                  bits(S.prune_transposable_2_4(host)))
    bad = meta.data.clone()
    bad.view(torch.int32)[0, 0, 3, 1] = 0
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(bad, "tcgen05", dtype, 21, 50, interpret=True)
    assert err.value.code == "SP0807" and "row 3, group " in err.value.message
    if dtype == "bf16":  # float32 in: cast on the "device" by torch (as ml_dtypes casts), then pruned
        w32 = torch.randn(16, 64, generator=torch.Generator().manual_seed(11))
        values, _ = G.compress_gpu(w32, "bf16", "sm90", interpret=True)
        host_values = S.compress(w32.numpy().astype(S.operand_type("bf16").host_dtype), "bf16", prune=True)[0]
        np.testing.assert_array_equal(bits(S.as_host_array(values)), bits(host_values))


# ------------------------------------------------------------------------------------------------
# GPU


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_large_bit_identical(dtype: str, fmt: str) -> None:
    torch = _torch_cuda()
    w = tricky(dtype, 4096 + 40, 4096 + 96, seed=21)
    ints = torch.from_numpy(w.view(f"i{w.itemsize}" if w.itemsize > 1 else "u1")).cuda()
    tw = ints.view(getattr(torch, G._TORCH_DTYPES[dtype]))
    values, meta = G.compress_gpu(tw, dtype, fmt)
    assert values.is_cuda and meta.data.is_cuda
    ref_values, ref_meta = host_reference(w, dtype, fmt)
    host_values = S.as_host_array(values)
    np.testing.assert_array_equal(bits(host_values), bits(ref_values))
    np.testing.assert_array_equal(meta.to_host().data, ref_meta.data)
    dense = G.decompress_gpu(values, meta)
    np.testing.assert_array_equal(bits(S.as_host_array(dense)), bits(S.decompress(ref_values, ref_meta)))
    np.testing.assert_array_equal(bits(S.as_host_array(G.prune_gpu(tw, dtype))), bits(S.prune(w, dtype)))
    bad = meta.data.clone()
    bad.view(torch.int32)[3, 1] = 0
    with pytest.raises(SparsityError) as err:
        G.validate_metadata_gpu(bad, fmt, dtype, meta.m, meta.k)
    assert err.value.code in ("SP0807", "SP0809")


@pytest.mark.gpu
def test_gpu_cupy_in_place() -> None:
    cupy = pytest.importorskip("cupy")
    w = tricky("f16", 1000, 2048, seed=4)
    values, meta = G.compress_gpu(cupy.asarray(w), "f16", "sm90")
    assert isinstance(values, cupy.ndarray) and isinstance(meta.data, cupy.ndarray)
    ref_values, ref_meta = host_reference(w, "f16", "sm90")
    np.testing.assert_array_equal(bits(values.get()), bits(ref_values))
    np.testing.assert_array_equal(meta.to_host().data, ref_meta.data)


@pytest.mark.gpu
def test_gpu_bf16_from_float32_torch() -> None:
    torch = _torch_cuda()
    w = torch.randn(2048, 4096, device="cuda")
    values, meta = G.compress_gpu(w, "bf16", "tcgen05")
    host = w.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    ref_values, ref_meta = host_reference(host, "bf16", "tcgen05")
    np.testing.assert_array_equal(bits(S.as_host_array(values)), bits(ref_values))
    np.testing.assert_array_equal(meta.to_host().data, ref_meta.data)


def test_benchmark_script_needs_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    from sparsile.tests.support import load_script

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU run is the benchmark itself")
    module = load_script("benchmarks/bench_sparsity_gpu.py")
    assert module.main([]) == 2 and "needs a CUDA GPU" in capsys.readouterr().out
    assert module.TARGET_SHAPE in module.SHAPES


# ------------------------------------------------------------------------------------------------
# transposable masks (sparsity_transposable.spk)


@pytest.mark.parametrize("dtype", ("f16", "bf16", "tf32", "e4m3", "s8"))
def test_transposable_prune_matches_the_host(dtype: str) -> None:
    """Small integers: many ties, and block sums exact in f64 for every type, so even bf16 and f32
    must pick the host's pattern; NaN and inf are kept first; M and K ragged."""
    w = tricky(dtype, 14, 42, seed=17)
    if dtype not in ("s8", "e4m3"):
        w[5, 3] = np.inf
    got = G.prune_transposable_gpu(w, interpret=True)
    assert got.dtype == w.dtype and got.shape == w.shape
    np.testing.assert_array_equal(bits(got), bits(S.prune_transposable_2_4(w)))
    mask = np.zeros((16, 44), bool)
    mask[:14, :42] = S.transposable_mask_2_4(w)
    assert (mask.reshape(16, 11, 4).sum(axis=2) <= 2).all() and (mask.T.reshape(44, 4, 4).sum(axis=2) <= 2).all()


def test_transposable_prune_gaussian_f16() -> None:
    w = np.random.default_rng(8).standard_normal((8, 64)).astype(np.float16)
    np.testing.assert_array_equal(bits(G.prune_transposable_gpu(w, interpret=True)),
                                  bits(S.prune_transposable_2_4(w)))


@pytest.mark.parametrize("dtype", ("f16", "bf16", "tf32"))
def test_transposable_prune_ranks_nan_above_inf_as_the_host(dtype: str) -> None:
    """Blocks of NaN, ±inf, ±0.0 and numbers, many where a NaN and an infinity compete for a row's
    or a column's two places: NaN ranks above inf on the GPU as on the host (and in pruning;
    docs/sparse-metadata.md §12). The kernel counted them alike, as the host once did."""
    rng = np.random.default_rng(55)
    choices = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -2.0, 3.0], np.float32)
    w = rng.choice(choices, size=(16, 64), p=[0.2, 0.15, 0.15, 0.1, 0.1, 0.1, 0.1, 0.1])
    w[0, :4], w[1:4, 0] = np.inf, (-np.inf, np.inf, np.nan)  # a column whose first two places are infinite
    w = w.astype(S.operand_type(dtype).host_dtype)
    host = S.prune_transposable_2_4(w)
    assert np.isnan(host[3, 0])
    np.testing.assert_array_equal(bits(G.prune_transposable_gpu(w, interpret=True)), bits(host))


def test_transposable_checks_element_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transposable kernel indexes elements (i32), not chunks: a matrix whose chunks fit but
    whose elements do not is refused (modeled with a small limit, one block: 16 x 100 f16 has 400
    chunks and 1600 elements)."""
    monkeypatch.setattr(G, "MAX_OFFSET", 1023)
    w = np.ones((16, 100), np.float16)
    G.prune_gpu(w, interpret=True)  # 400 chunks: fine
    with pytest.raises(SparsityError) as err:
        G.prune_transposable_gpu(w, interpret=True)
    assert err.value.code == "SP0804"
    assert err.value.message == ("a 16x100 f16 matrix has 1600 elements; the GPU kernels' 32-bit offsets reach "
                                 "1023 (in whole blocks of 1024)")


def test_offsets_are_checked_for_whole_flat_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """prune_dense's programs compute the offsets of whole 1024-chunk blocks: with 2^31 - 1000 chunks the
    last program's offsets passed 2^31 - 1, wrapped negative and passed its `offs < n` mask. Modeled
    with a limit of 4100: 4096 chunks (blocks 0..3) fit; 4097 chunks are fewer than 4100, but their
    fifth block's offsets run to 5119."""
    monkeypatch.setattr(G, "MAX_OFFSET", 4100)
    G.prune_gpu(np.ones((16, 1024), np.float16), interpret=True)  # 4096 chunks: blocks 0..3
    with pytest.raises(SparsityError) as err:
        G.prune_gpu(np.ones((1, 4 * 4097), np.float16), interpret=True)
    assert (err.value.code, err.value.message) == (
        "SP0804", "a 1x16388 f16 matrix has 4097 chunks; the GPU kernels' 32-bit offsets reach 4100 (in whole "
        "blocks of 1024)")


_ROUNDED_BLOCKS = {
    # the sums of these blocks round in float64 (magnitudes 2**45 and more apart): summed in another
    # order (numpy's matrix product), the host kept another pattern than the kernel
    "bf16": [0xB938, 0x34E0, 0x0002, 0x34E0, 0x0003, 0xB938, 0xD436, 0x0003,
             0x01F6, 0x34E0, 0x3EE8, 0x0002, 0x8000, 0x8000, 0x8001, 0x8000],
    "tf32": [0x0, 0x80000000, 0x0, 0x0, 0x80000000, 0x2, 0xFFFFFFFF, 0x64B0ED83,
             0x4991A9DA, 0x3, 0x4991A9DA, 0x55586A0D, 0x4991A9DA, 0x4991A9DA, 0x3DC6FF3A, 0x1],
}


@pytest.mark.parametrize("dtype", ("bf16", "tf32"))
def test_transposable_rounded_sums_match_the_host(dtype: str) -> None:
    """Where float64 rounding decides between patterns, the host adds in the kernel's order and
    picks the kernel's pattern (a CPU and a CUDA weight get the same mask)."""
    op = S.operand_type(dtype)
    block = np.array(_ROUNDED_BLOCKS[dtype], dtype=op.storage_dtype).view(op.host_dtype).reshape(4, 4)
    w = np.tile(block, (4, 16))  # many blocks: numpy's matrix product then sums in its blocked order
    np.testing.assert_array_equal(bits(G.prune_transposable_gpu(w, interpret=True)),
                                  bits(S.prune_transposable_2_4(w)))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from(("bf16", "tf32", "f16")))
def test_transposable_wide_magnitudes_match_the_host(seed: int, dtype: str) -> None:
    """Blocks mixing a few random bit patterns (magnitudes from subnormal to huge, ties, NaN, inf):
    the kernel and the host choose the same pattern bit for bit."""
    op = S.operand_type(dtype)
    rng = np.random.default_rng(seed)
    nbits = 8 * op.host_dtype.itemsize
    pool = rng.integers(0, 1 << nbits, size=5, dtype=np.uint64).astype(op.storage_dtype)
    w = rng.choice(pool, size=(12, 40)).astype(op.storage_dtype).view(op.host_dtype)
    np.testing.assert_array_equal(bits(G.prune_transposable_gpu(w, interpret=True)),
                                  bits(S.prune_transposable_2_4(w)))


def test_transposable_patterns_constant() -> None:
    from sparsile.stdlib.sparsity.transposable import PATTERNS

    assert len(G.pattern_bits()) == 90
    for p, b in zip(PATTERNS, G.pattern_bits(), strict=True):
        assert [(b >> i) & 1 for i in range(16)] == p.astype(int).tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("f16", "bf16", "tf32"))
def test_gpu_transposable_large(dtype: str) -> None:
    """The host's choice bit for bit, also for bf16 and f32 weights whose block sums round in f64
    (magnitudes spread over 2**-60..2**60: the host adds in the kernel's order)."""
    torch = _torch_cuda()
    gen = torch.Generator(device="cuda").manual_seed(3)
    w = torch.randn(2048 + 12, 4096 + 8, device="cuda", generator=gen)
    if dtype != "f16":
        w = w * torch.exp2(torch.randint(-60, 61, w.shape, device="cuda", generator=gen).float())
    w = w.to(getattr(torch, G._TORCH_DTYPES[dtype]))
    got = S.as_host_array(G.prune_transposable_gpu(w))
    np.testing.assert_array_equal(bits(got), bits(S.prune_transposable_2_4(S.as_host_array(w))))
    mask = got[:2048, :4096] != 0  # randn has no zeros: the kept elements are the mask
    assert (mask.reshape(2048, 1024, 4).sum(axis=2) == 2).all()
    assert (mask.T.reshape(4096, 512, 4).sum(axis=2) == 2).all()
