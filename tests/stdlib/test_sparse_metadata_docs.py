"""docs/sparse-metadata.md's examples run (the GPU toolkit's in the interpreter, on a small weight)
and state what they do: shapes, types, tags, bit-identical results; its pictures are what
``metadata_picture`` / ``hardware_placement`` draw today."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparsile.stdlib import sparsity as S
from sparsile.stdlib import viz
from sparsile.stdlib.sparsity.placement import hardware_placement
from sparsile.tests.support.doc_examples import adapted, fenced_blocks, run_block
from sparsile.tests.support.doc_examples import block_with as doc_block_with

DOC = Path(__file__).resolve().parents[2] / "docs" / "sparse-metadata.md"


def blocks(kind: str) -> list[str]:
    return fenced_blocks(DOC, kind)


def block_with(text: str) -> str:
    return doc_block_with(DOC, text)


def run(block: str, **names: Any) -> dict[str, Any]:
    return run_block(block, DOC, **names)


def test_the_opening_example() -> None:
    # it runs as it is (it used an f16 `dense`, M, K and b it did not define: a float32 dense made compress()
    # take the operand for tf32 and refuse it as not 1:2 sparse)
    env = run(block_with("encode_metadata(indices"))  # its own asserts run too
    m, k, dense, b = env["M"], env["K"], env["dense"], env["b"]
    assert m % 16 and k % 64 and dense.dtype == b.dtype == np.float16  # padding in every format; f16 operands
    assert b.shape == (k, env["N"])  # (K, N), as sparse_matmul_reference takes it
    assert env["values"].shape == (m, k // 2) and env["values"].dtype == np.float16  # (M, K/2) f16
    assert env["indices"].shape == (m, k // 4, 2) and env["indices"].dtype == np.uint8  # (M, K/4, 2) uint8
    meta = env["meta"]
    assert isinstance(meta, S.MetadataBuffer) and (meta.fmt, meta.dtype, meta.m, meta.k) == ("tcgen05", "f16", m, k)
    ref = env["ref"]
    assert ref.dtype == np.float64
    assert np.array_equal(ref, S.prune_2_4(dense).astype(np.float64) @ b.astype(np.float64))
    with pytest.raises(ValueError, match="read-only"):  # §6: the tagged words are frozen
        meta.data[0, 0, 0, 0] = 0


def test_the_gpu_toolkit_example_in_the_interpreter() -> None:
    pytest.importorskip("torch")  # the example builds w with torch
    block = block_with("compress_gpu(w, \"bf16\", \"sm90\")")
    assert "# values: (57344, 4096) bf16 on the GPU; meta: DeviceMetadata(data=(57344, 256) uint32" in block
    m, k = 48, 128
    env = run(adapted(block, ('torch.randn(57344, 8192, device="cuda")', f"torch.randn({m}, {k})"),
                      ('compress_gpu(w, "bf16", "sm90")', 'compress_gpu(w, "bf16", "sm90", interpret=True)'),
                      ("decompress_gpu(values, meta)", "decompress_gpu(values, meta, interpret=True)"),
                      ('prune_gpu(w, "bf16")', 'prune_gpu(w, "bf16", interpret=True)'),
                      ('validate_metadata_gpu(meta, "sm90", "bf16", 57344, 8192)',
                       f'validate_metadata_gpu(meta, "sm90", "bf16", {m}, {k}, interpret=True)'),
                      ('prune=False)', 'prune=False, interpret=True)')))
    w = env["w"]
    host_values, host_indices = S.compress(S.as_host_array(w, "w"), "bf16", prune=True)
    host_meta = S.encode_metadata(host_indices, "sm90", "bf16", k=k)
    dense, pruned = env["dense"], env["pruned"]
    assert isinstance(dense, np.ndarray)  # the interpreter's outputs are numpy arrays (§11, "Arrays")
    assert dense.shape == (m, k) and np.array_equal(dense, pruned)
    assert np.array_equal(dense, S.decompress(host_values, host_meta))  # bit-identical to the host toolkit
    last_values, last_meta = env["values"], env["meta"]  # compress_gpu(pruned, "bf16", "tcgen05", prune=False)
    assert type(last_meta).__name__ == "DeviceMetadata" and last_meta.fmt == "tcgen05"
    assert (last_meta.m, last_meta.k, last_meta.dtype) == (m, k, "bf16")
    assert np.array_equal(last_values, host_values)
    assert np.array_equal(last_meta.data, S.encode_metadata(host_indices, "tcgen05", "bf16", k=k).data)
    assert isinstance(last_meta.to_host(), S.MetadataBuffer)


def test_the_transposable_example() -> None:
    from sparsile.stdlib.kernels.sparsity_gpu import prune_transposable_gpu

    w = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    env = run(block_with("transposable_mask_2_4(w)"), w=w)
    mask, w_t = env["mask"], env["w_t"]
    assert mask.shape == w.shape and mask.dtype == bool
    assert (mask.reshape(64, -1, 4).sum(-1) == 2).all() and (mask.T.reshape(96, -1, 4).sum(-1) == 2).all()
    assert w_t.dtype == w.dtype and np.array_equal(w_t, np.where(mask, w, 0))
    price = S.kept_magnitude(w, mask) / S.kept_magnitude(w, S.prune_mask_2_4(w))
    assert 0.9 < price < 1  # about 94 % on Gaussian weights (the table of §12)
    assert np.array_equal(prune_transposable_gpu(w, interpret=True), w_t)  # "the same as prune_transposable_2_4"


def _rows(text: str) -> list[str]:
    """The data rows (``  3 :  3,0  3,1 ...``) of a picture, whitespace normalized."""
    return [" ".join(line.split()) for line in text.splitlines() if re.match(r"^\s*\d+ :", line)]


PICTURES = [  # a line of the doc's picture block -> what draws it
    ('metadata_picture("logical", "f16", 2, 32)', lambda: viz.metadata_picture("logical", "f16", 2, 32)),
    ('hardware_placement("sm90", "f16", 16, 32)',
     lambda: viz.render_placement(hardware_placement("sm90", "f16", 16, 32))),
    ('metadata_picture("sm90", "f16", 16, 64)', lambda: viz.metadata_picture("sm90", "f16", 16, 64)),
    ('metadata_picture("sm90", "e4m3", 16, 128)', lambda: viz.metadata_picture("sm90", "e4m3", 16, 128)),
    ("tcgen05 metadata, tf32 (tf32, 1:2), m=16, k=32", lambda: viz.metadata_picture("tcgen05", "tf32", 16, 32)),
    ("tcgen05 metadata, e2m1 (4-bit, 4:8 in pairs), m=3, k=256",
     lambda: viz.metadata_picture("tcgen05", "e2m1", 3, 256)),
]


@pytest.mark.parametrize(("label", "draw"), PICTURES, ids=[p[0] for p in PICTURES])
def test_the_pictures_are_what_the_code_draws(label: str, draw: Any) -> None:
    text = DOC.read_text()
    at = text.index(label)
    fences = [f.end() for f in re.finditer(r"^```.*\n", text, re.M)]
    before = [f for f in fences if f <= at]
    start = before[-1] if len(before) % 2 else min(f for f in fences if f > at)  # the block holding or after it
    block = text[start:text.index("```", start)]
    if label.startswith("tcgen05"):  # the two tcgen05 pictures share a block
        block = block[block.index(label):].split("\n\n")[0]
    shown = [row for row in _rows(block) if "..." not in row]
    drawn = _rows(draw())
    assert len(_rows(block)) >= 2
    assert all(row in drawn for row in shown), [row for row in shown if row not in drawn]
    if label.endswith("m=3, k=256"):  # rows abbreviated with "...": their first 16 cells
        for row in _rows(block):
            head = row.split("...")[0].strip(" |")
            assert any(d.startswith(head) for d in drawn), row
