"""The kernels of stdlib/kernels/sparsity_24.spk themselves: the fused prune + compress on every
chunk of a small alphabet (the composite-key network and its lone-nonzero exception), decompress
on poisoned outputs (both in the CPU interpreter, bit for bit against the host toolkit), and the
SASS instruction budget of both compiled for sm_90a (no GPU needed); the unmasked kernels on a GPU
(marked gpu)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sparsile.stdlib import sparsity as S
from sparsile.stdlib.kernels import sparsity_gpu as G

from .test_sparsity_gpu import DTYPES, FORMATS, _torch_cuda, bits, check_round_trip, host_reference, tricky


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ("bf16", "tf32", "s8"))
def test_decompress_kernel_writes_every_element(dtype: str, fmt: str) -> None:
    """The decompress kernel launched directly on a poisoned output: every element is written, bit
    for bit the host's decompress (each thread reads its own metadata word; ragged M)."""
    op = S.operand_type(dtype)
    m, k = 21, 136
    kc = k // op.group
    chunk_bytes = op.group * op.host_dtype.itemsize
    ref_values, ref_meta = host_reference(tricky(dtype, m, k, seed=11), dtype, fmt)
    grid, mp, kw = G._grid(fmt, op, m, k)
    dense = np.full((m, kc), 0xAB, np.dtype(f"u{chunk_bytes}"))
    G.kernel_module().decompress.interpret[grid](ref_values.view(f"u{chunk_bytes // 2}"), ref_meta.data, dense,
                                                 m, kc, mp, kw, KIND=G._kind_of(op), FMT=fmt,
                                                 INTERLEAVED=op.interleaved)
    np.testing.assert_array_equal(bits(dense), bits(S.decompress(ref_values, ref_meta)))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ("bf16", "tf32", "e4m3", "s8"))
def test_full_tiles_take_the_unmasked_path(dtype: str, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A matrix of whole programs (no padding rows or chunks) is compressed and decompressed with
    EVEN (no masks) bit-identically to the host; one row more takes the masked path."""
    launched: list[tuple[str, bool]] = []
    launch = G._launch
    monkeypatch.setattr(G, "_launch", lambda name, *args, **kw: (launched.append((name, kw.get("EVEN"))),
                                                                   launch(name, *args, **kw)))
    m, k = (16 if fmt == "sm90" else 128), 1024
    for rows, even in ((m, True), (m + 1, False)):
        check_round_trip(tricky(dtype, rows, k, seed=rows), dtype, fmt)
        assert ("prune_compress", even) in launched and ("decompress", even) in launched
        launched.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_full_tiles_bit_identical(dtype: str, fmt: str) -> None:
    """The unmasked (EVEN) kernels on the GPU: a 2048 x 4096 matrix of whole programs."""
    torch = _torch_cuda()
    w = tricky(dtype, 2048, 4096, seed=23)
    ints = torch.from_numpy(w.view(f"i{w.itemsize}" if w.itemsize > 1 else "u1")).cuda()
    values, meta = G.compress_gpu(ints.view(getattr(torch, G._TORCH_DTYPES[dtype])), dtype, fmt)
    ref_values, ref_meta = host_reference(w, dtype, fmt)
    np.testing.assert_array_equal(bits(S.as_host_array(values)), bits(ref_values))
    np.testing.assert_array_equal(meta.to_host().data, ref_meta.data)
    dense = G.decompress_gpu(values, meta)
    np.testing.assert_array_equal(bits(S.as_host_array(dense)), bits(S.decompress(ref_values, ref_meta)))


SMALL_VALUES = {"s8": (0, 1, -1, 2, -128, 127), "u8": (0, 1, 2, 255, 128, 3)}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ("f16", "bf16", "tf32", "e4m3", "e5m2", "s8", "u8"))
def test_every_chunk_of_six_values_bit_identical(dtype: str, fmt: str) -> None:
    """Every chunk whose elements come from six values (equal magnitudes of both signs: ties;
    +0 and -0; one, two or no nonzero elements in each position) compresses bit-identically to the
    host: the kernel's top-2 network and its exception for a lone nonzero element (docs/sparse-
    metadata.md §2) against the host's pruning and table."""
    op = S.operand_type(dtype)
    alphabet = np.array(SMALL_VALUES.get(dtype, (0.0, -0.0, 1.0, -1.0, 2.0, -2.0)))
    chunks = np.stack(np.meshgrid(*[np.arange(6)] * op.group, indexing="ij"), axis=-1).reshape(-1, op.group)
    rng = np.random.default_rng(op.group)
    w = alphabet[chunks[rng.permutation(len(chunks))]].reshape(-1, 16 * op.group // 4)
    w = w.astype(op.host_dtype) if dtype in ("s8", "u8") else w.astype(np.float32).astype(op.host_dtype)
    values, meta = G.compress_gpu(w, dtype, fmt, interpret=True)
    ref_values, ref_meta = host_reference(w, dtype, fmt)
    np.testing.assert_array_equal(bits(values), bits(ref_values))
    np.testing.assert_array_equal(meta.data, ref_meta.data)


SASS_BUDGET = {("prune_compress", "bf16"): 380, ("prune_compress", "e4m3"): 370, ("prune_compress", "tf32"): 140,
               ("decompress", "bf16"): 200}
"""Most SASS instructions (NOPs aside) per thread for sm_90a. The fused prune + compress was bound
by instruction issue on the H200; the composite-key network brought it from 558 / 549 / 158
(bf16 / e4m3 / tf32, ptxas 13.0) to about 352 / 341 / 134, and storing each thread's own metadata
word instead of widening the stores through shared memory to 334 / 325 / 119. decompress loads
each thread's own word instead of converting a word tile through shared memory: 280 -> 173 (bf16)."""


@pytest.mark.parametrize("even", (False, True))
@pytest.mark.parametrize("kernel,dtype", sorted(SASS_BUDGET))
def test_compiled_kernel_stays_within_its_instruction_budget(kernel: str, dtype: str, even: bool) -> None:
    from sparsile.backend.toolchain import linker

    op = S.operand_type(dtype)
    m, k = 57344, 8192
    chunk_bytes = op.group * op.host_dtype.itemsize
    grid, mp, kw = G._grid("sm90", op, m, k)
    chunks, halves, meta = np.zeros((2, 2), f"u{chunk_bytes}"), np.zeros((2, 2), f"u{chunk_bytes // 2}"), np.zeros(
        (2, 2), np.uint32)
    arrays = (chunks, halves, meta, np.zeros(1, np.int32)) if kernel == "prune_compress" else (halves, meta, chunks)
    compiled = getattr(G.kernel_module(), kernel)[grid].compile_for(
        "sm_90a", *arrays, m, k // op.group, mp, kw, KIND=G._kind_of(op), FMT="sm90", INTERLEAVED=op.interleaved,
        EVEN=even)
    sass = linker.nvdisasm_sass(compiled.cubin)
    if sass is None:
        pytest.skip("nvdisasm is not installed")
    instructions = re.findall(r"^\s*/\*[0-9a-f]{4}\*/\s+((?!NOP\b)\S.*)$", sass, re.MULTILINE)
    assert 0 < len(instructions) <= SASS_BUDGET[kernel, dtype], len(instructions)
    assert "0 bytes spill stores" in compiled.info_log
    assert "STS" not in sass and "BAR" not in sass  # no layout conversion through shared memory
    if even:  # plain vector loads issued together (masked ones were spread through the computation)
        loads = [i for i, text in enumerate(instructions) if "LDG" in text]
        assert loads and not any(instructions[i].startswith("@") for i in loads)
        assert loads[-1] - loads[0] <= 12, loads
