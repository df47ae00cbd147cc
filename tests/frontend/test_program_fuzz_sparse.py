"""Random sparse-core programs (tests/support/program_gen_sparse.py): each compiles to PTX for sm_90a
and sm_100a without a diagnostic, and computes in the interpreter what the generator's numpy
reference computes (with its own metadata decoder, written from docs/sparse-metadata.md): exact
outputs bit for bit, sparse_dot results within their accumulation bound. The GPU side is
tests/gpu/test_program_fuzz_sparse_gpu.py; its body runs here with the interpreter as the launch."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.stdlib.sparsity import compress, decompress, encode_metadata
from sparsile.tests.support.compile import compile_src
from sparsile.tests.support.program_check import check_against_reference, differential, interpret, mismatches, run
from sparsile.tests.support.program_gen_sparse import TOOLKIT, decode_sm90, generate_sparse

FEATURES = ("sparse_dot(", "ptr[f16]", "ptr[bf16]", "[e4m3", "[e5m2", "[i8", "[u8", "trans(bt)", "A.load_tile(",
            "E.load_tile(", "Bm.load_tile(", "C.store_tile(", "other=0x", "cdiv(M, 16) * 16", "< MP)",
            "while kt <", "range(0, KD, BK)", "range(0, cdiv(KD, BK))", "if kt % 2 == 0:", "acc=acc1",
            "bias[None, :]", "maximum(y", "where(y > 0.0", "minimum(maximum(", ">> 3", ".to(f16)", ".to(bf16)",
            ".to(e4m3)", ".to(i8)", "tensor[f32, 3]", "tensor[i16, 3]", "load_tile(Y,", "O.store_tile(",
            "R.store_tile(", "sum(v, axis=2)", "max(v, axis=2)", "+ (-3)")
TARGETS = ("sm_90a", "sm_100a")


def _check(seed: int) -> None:
    program = generate_sparse(seed)
    for target in TARGETS:
        compile_src(program.source, target, **program.consts)
    diffs = check_against_reference(program, seed)
    assert not diffs, f"seed {seed}:\n" + "\n".join(diffs) + "\n" + program.source


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_random_sparse_programs_compile_and_match_the_reference(seed: int) -> None:
    _check(seed)


def test_the_gpu_test_body_passes_with_the_interpreter_as_the_launch() -> None:
    assert differential([0, 1, 3], interpret, gen=generate_sparse) == []


def test_the_generator_reaches_every_feature_and_is_reproducible() -> None:
    sources = [generate_sparse(seed).source for seed in range(300)]
    missing = [f for f in FEATURES if not any(f in s for s in sources)]
    assert not missing, missing
    assert generate_sparse(7).source == sources[7] and sources[7] != sources[8]


def test_the_reference_decoder_reads_the_worked_examples_of_the_metadata_doc() -> None:
    """docs/sparse-metadata.md §4: 16-bit M = 16, K = 32 (words 0x4444E94C and 0x449E44D8) and the
    8-bit row 3 (words 0x44ED9C84, 0x4448C9DE)."""
    words = np.full((16, 1), 0x44444444, np.uint32)
    words[0, 0], words[8, 0] = 0x4444E94C, 0x449E44D8
    values = np.tile(np.arange(1, 17, dtype=np.float16), (16, 1))
    dense = decode_sm90(values, words, eight_bit=False)
    row0 = [(0, 3), (0, 1), (1, 2), (2, 3), (0, 2), (1, 3), (0, 1), (0, 1)]
    assert [tuple(np.flatnonzero(dense[0, 4 * c:4 * c + 4])) for c in range(8)] == row0
    assert dense[0, 3] == 2 and dense[0, 4] == 3  # chunk 0 keeps 1 at 0, 2 at 3; chunk 1 starts with 3
    row8 = [tuple(np.flatnonzero(dense[8, 4 * c:4 * c + 4])) for c in range(8)]
    assert row8 == [(0, 1)] * 4 + [(2, 3), (1, 2)] + [(0, 1)] * 2
    w8 = np.full((16, 2), 0x44444444, np.uint32)
    w8[3] = 0x44ED9C84, 0x4448C9DE
    d8 = decode_sm90(np.ones((16, 32), np.int8), w8, eight_bit=True)
    nib = [0x4, 0x8, 0xC, 0x9, 0xD, 0xE, 0x4, 0x4, 0xE, 0xD, 0x9, 0xC, 0x8, 0x4, 0x4, 0x4]
    assert [tuple(np.flatnonzero(d8[3, 4 * c:4 * c + 4])) for c in range(16)] == [(n & 3, n >> 2) for n in nib]


def test_the_reference_decoder_agrees_with_the_toolkit_on_random_matrices() -> None:
    rng = np.random.default_rng(5)
    for t, host in (("f16", np.float16), ("i8", np.int8)):
        w = (rng.standard_normal((48, 128)) * 20).astype(host)
        values, indices = compress(w, TOOLKIT[t], prune=True)
        meta = encode_metadata(indices, "sm90", TOOLKIT[t])
        want = np.asarray(decompress(values, meta)).astype(np.float64)
        assert np.array_equal(decode_sm90(values, np.asarray(meta.data), t == "i8"), want)


def test_a_wrong_element_is_reported() -> None:
    """The comparison is not vacuous: one changed element of a written output is named, whether
    exact or within a sparse_dot bound."""
    for seed in range(6):
        program = generate_sparse(seed)
        got = run(program, interpret, seed)
        want, tols = program.reference(program.inputs(seed))
        assert mismatches(got, want, tols) == []
        for name in got:
            bad = {k: v.copy() for k, v in got.items()}
            flat, w = bad[name], want[name].astype(np.float64)
            i = 0
            if flat.dtype.kind in "iu":
                flat[i] ^= 1
            else:
                flat[i] = -np.sign(w[i] or 1.0) * (abs(w[i]) + 4 * tols[name][i] + 1000)
            assert mismatches(bad, want, tols), (seed, name)


K32_I8 = """
@kernel
def k(A: ptr[i8], E: ptr[u32], B: ptr[i8], C: ptr[i32]):
    r = arange(0, 16)
    a = load(A + r[:, None] * 16 + arange(0, 16)[None, :])
    e = load(E + r[:, None] * 2 + arange(0, 1)[None, :])
    b = load(B + arange(0, 32)[:, None] * 8 + arange(0, 8)[None, :])
    store(C + r[:, None] * 8 + arange(0, 8)[None, :], sparse_dot(a, e, b))
"""


def test_an_8_bit_sparse_dot_of_k_32_runs_in_the_interpreter() -> None:
    """Found by the sparse program fuzzer (seed 71, minimized): sema takes an 8-bit sparse_dot with a
    K = 32 tile and its (M, 1) metadata words, and it compiles, but the interpreter refused that
    tile (SP0786: the toolkit's 8-bit format pads K to 64, two words a row)."""
    import sparsile as sp

    rng = np.random.default_rng(0)
    w = rng.integers(-100, 101, (16, 32)).astype(np.int8)
    values, indices = compress(w, "s8", prune=True)
    meta = np.asarray(encode_metadata(indices, "sm90", "s8").data)  # (16, 2): K padded to 64
    b = rng.integers(-128, 128, (32, 8)).astype(np.int8)
    c = np.full((16, 8), 77, np.int32)
    sp.loads(K32_I8, "case.spk").kernels["k"].interpret[(1,)](values, meta, b, c)
    dense = decode_sm90(values, meta[:, :1], eight_bit=True)
    assert np.array_equal(c, dense @ b.astype(np.int64))
