"""sparsile's safetensors reader and writer against the reference implementation (the ``safetensors``
package), and sparsile's sparse-24-bitmask files as that package reads them.

The other tests of integrations/safetensors.py read its files with its own reader, or with a reading
of the format written in the test: a reader and a writer that agreed on a wrong dtype name or byte
order would pass them. Here every tensor goes through both libraries, bit for bit (NaN payloads,
-0.0, fp8 and bf16 included): files the reference writes load in sparsile, files sparsile writes load
in the reference, metadata included. Then a checkpoint of SparseLinear layers that
``save_sparse24_checkpoint`` writes is read by the reference and decompressed by a reading of
compressed-tensors' layout written here (the bitmask unpacked little-endian, the values scattered in
row-major order): the layer's pruned weight, bit for bit, in the dtype the reference reports.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsile.integrations import safetensors as sft

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
reference = pytest.importorskip("safetensors")
reference_torch = pytest.importorskip("safetensors.torch")
reference_load, reference_save = reference_torch.load_file, reference_torch.save_file

SETTINGS = settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                            HealthCheck.too_slow])

# every dtype both libraries know, as torch names it
DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2)


def _random_tensor(rng: np.random.Generator, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Random bits of ``dtype`` (NaN payloads, infinities and -0.0 among them); booleans 0 or 1."""
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, count).astype(bool)).reshape(shape)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.from_numpy(rng.integers(0, 256, count * size, dtype=np.uint8))
    return (raw.view(dtype) if count else torch.empty(0, dtype=dtype)).reshape(shape)


def _bits(t: torch.Tensor | np.ndarray) -> bytes:
    """The tensor's bytes in C order (a bool as one byte 0 or 1)."""
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t).tobytes()
    if t.dtype == torch.bool:
        return t.contiguous().numpy().tobytes()
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@st.composite
def tensor_sets(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    out = {}
    for i in range(draw(st.integers(0, 5))):
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        out[f"layers.{i}.t"] = _random_tensor(rng, draw(st.sampled_from(DTYPES)), shape)
    return out


@SETTINGS
@given(tensors=tensor_sets(), extra=st.text(max_size=8))
def test_files_the_reference_writes_load_bit_for_bit(tmp_path, tensors, extra):
    metadata = {"format": "pt", "extra": extra}
    reference_save(tensors, str(tmp_path / "a.safetensors"), metadata=metadata)
    back = sft.load_file(tmp_path / "a.safetensors")
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == _numpy_dtype(t.dtype) and back[name].shape == tuple(t.shape), name
        assert _bits(back[name]) == _bits(t), name
    assert sft.read_header(tmp_path / "a.safetensors")[1] == metadata


@SETTINGS
@given(tensors=tensor_sets(), extra=st.text(max_size=8))
def test_files_sparsile_writes_load_in_the_reference_bit_for_bit(tmp_path, tensors, extra):
    metadata = {"format": "pt", "extra": extra}
    # sparsile writes numpy arrays: each tensor's bits, as sparsile's dtypes hold them
    arrays = {name: np.frombuffer(_bits(t), dtype=_numpy_dtype(t.dtype)).reshape(tuple(t.shape))
              for name, t in tensors.items()}
    sft.save_file(arrays, tmp_path / "b.safetensors", metadata=metadata)
    back = reference_load(str(tmp_path / "b.safetensors"))
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert _bits(back[name]) == _bits(t), name
    with reference.safe_open(str(tmp_path / "b.safetensors"), "pt") as f:
        assert f.metadata() == metadata


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype sparsile holds a torch dtype's values in (ml_dtypes for bf16 and fp8)."""
    import ml_dtypes

    special = {torch.bfloat16: ml_dtypes.bfloat16, torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
               torch.float8_e5m2: ml_dtypes.float8_e5m2, torch.bool: np.bool_}
    return np.dtype(special.get(dtype) or torch.empty((), dtype=dtype).numpy().dtype)


# ------------------------------------------------------------------------------------------------
# sparse-24-bitmask checkpoints as the reference reads them

STORED = {"bf16": torch.bfloat16, "f16": torch.float16, "e4m3": torch.float8_e4m3fn}


@st.composite
def weights(draw: st.DrawFn) -> tuple[str, torch.Tensor, bool]:
    """(dtype, a dense weight (out, in) with zeros, -0.0 and a few large values, bias or not); in a
    multiple of 4 (the format stores whole groups), of 8, 64 or 128 or not."""
    dtype = draw(st.sampled_from(sorted(STORED)))
    rows = draw(st.sampled_from([1, 3, 8, 13, 16]))
    cols = draw(st.sampled_from([4, 12, 20, 36, 64, 68, 128, 132]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    w = rng.standard_normal((rows, cols)) * draw(st.sampled_from([1e-3, 1.0, 30.0]))
    kind = rng.random((rows, cols))
    w[kind < 0.15] = 0.0
    w[(kind >= 0.15) & (kind < 0.2)] = -0.0
    return dtype, torch.from_numpy(w), draw(st.booleans())


@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_shapes.VLLMShapeWarning")
@SETTINGS
@given(case=weights())
def test_a_written_checkpoint_read_by_the_reference_is_the_pruned_weight(tmp_path, case):
    dtype, w, bias = case
    rows, cols = w.shape
    dense = torch.nn.Linear(cols, rows, bias=bias).to(torch.float16 if dtype == "f16" else torch.bfloat16)
    with torch.no_grad():
        dense.weight.copy_(w)
    model = torch.nn.Module()
    model.proj = spt.SparseLinear.from_dense(dense, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = reference_load(str(tmp_path / "model.safetensors"))
    assert tensors["proj.shape"].dtype == torch.int64 and tensors["proj.shape"].tolist() == [[rows], [cols]]
    bitmask, compressed = tensors["proj.bitmask"], tensors["proj.compressed"]
    assert bitmask.dtype == torch.uint8 and tuple(bitmask.shape) == (rows, -(-cols // 8))
    assert compressed.dtype == STORED[dtype] and tuple(compressed.shape) == (rows, cols // 2)
    mask = np.unpackbits(bitmask.numpy(), axis=1, bitorder="little").astype(bool)
    assert not mask[:, cols:].any()  # (padding bits zero)
    mask = mask[:, :cols]
    assert (mask.reshape(rows, -1, 4).sum(axis=2) == 2).all()
    weight = np.zeros((rows, cols), np.float32)
    weight[mask] = compressed.float().numpy().reshape(-1)  # (row-major scatter, as compressed-tensors reads it)
    if dtype == "e4m3":
        assert tensors["proj.weight_scale"].dtype == torch.float32
        assert tuple(tensors["proj.weight_scale"].shape) == (rows, 1)
        weight = weight * tensors["proj.weight_scale"].numpy()
    want = model.proj.to_dense().numpy()
    np.testing.assert_array_equal(weight, want)
    assert (np.signbit(weight) == np.signbit(want)).all()  # (-0.0 where the layer holds -0.0)
    if bias:
        assert torch.equal(tensors["proj.bias"], model.proj.bias)
    else:
        assert "proj.bias" not in tensors
