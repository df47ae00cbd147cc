"""prune_and_compress and SparseLinear.from_dense prune a CUDA weight on its GPU (compress_gpu).

On the CPU the GPU toolkit is faked by its own kernels in the interpreter, and a weight is made to
look like a CUDA array: the routing must call compress_gpu for a device weight in the operand's
type, never for numpy, a CPU tensor, another element type or the logical format, and give the
same values and metadata as the host path. The gpu-marked tests compare both paths bit for bit.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sparsile.stdlib.kernels import compress_weight, gemm_operands, sparsity_gpu
from sparsile.stdlib.kernels.compress_weight import prune_and_compress, prunes_on_gpu
from sparsile.stdlib.sparsity import as_host_array, compress, encode_metadata, operand_type


class FakeCupy:
    """An object that the launcher's array-kind test takes for a cupy array (a numpy one inside)."""

    __module__ = "cupy._core.core"

    def __init__(self, array: np.ndarray):
        self.array = array
        self.dtype = array.dtype
        self.shape = array.shape

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        """The host copy (what the host path reads)."""
        return self.array


@pytest.fixture
def fake_gpu(monkeypatch):
    """compress_gpu replaced by the same kernels in the interpreter, recording its calls."""
    calls = []
    real = sparsity_gpu.compress_gpu

    def fake(w, dtype=None, fmt="sm90", **kwargs):
        calls.append((w, dtype, fmt))
        if isinstance(w, FakeCupy):
            return real(w.array, dtype, fmt, interpret=True)
        from sparsile.integrations.torch.layer_args import host_to_torch  # a torch weight: torch outputs

        values, meta = real(as_host_array(w, "w"), dtype, fmt, interpret=True)
        return sparsity_gpu.GpuCompressed(host_to_torch(values), replace(meta, data=host_to_torch(meta.data)))

    monkeypatch.setattr(sparsity_gpu, "compress_gpu", fake)
    return calls


def weight(m: int = 16, k: int = 72, dtype: str = "f16", seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(operand_type(dtype).host_dtype)


@pytest.mark.parametrize("fmt", ["sm90", "tcgen05"])
def test_device_weight_goes_to_compress_gpu(fake_gpu, fmt):
    w = weight()
    values, meta = prune_and_compress(FakeCupy(w), "f16", fmt)
    assert len(fake_gpu) == 1 and fake_gpu[0][1:] == ("f16", fmt)
    want_values, indices = compress(w, "f16", prune=True)
    want = encode_metadata(indices, fmt, "f16", k=w.shape[1])
    np.testing.assert_array_equal(values.view(np.uint16), want_values.view(np.uint16))
    assert (meta.fmt, meta.dtype, meta.m, meta.k) == (want.fmt, want.dtype, want.m, want.k)
    np.testing.assert_array_equal(meta.data, want.data)
    if fmt == "sm90":  # the device words are the buffer's device copy: sparse_matmul does not upload them
        copy = gemm_operands.device_copies[meta][str(getattr(values, "device", "cupy"))]  # kernel_words' key
        np.testing.assert_array_equal(copy, want.data)


def test_host_weights_stay_on_the_host(fake_gpu, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(compress_weight, "copy_like", lambda host, like: host)  # no cupy here to copy values back to
    w = weight()
    prune_and_compress(w, "f16")
    prune_and_compress(torch.from_numpy(w), "f16")
    prune_and_compress(FakeCupy(w), "f16", "logical")  # compress_gpu writes hardware formats only
    prune_and_compress(FakeCupy(w.astype(np.float32)), "f16")  # another type: pruned before the cast
    assert fake_gpu == []


def test_routing_predicate():
    torch = pytest.importorskip("torch")
    f16, bf16 = operand_type("f16"), operand_type("bf16")
    assert prunes_on_gpu(FakeCupy(weight()), f16)
    assert not prunes_on_gpu(FakeCupy(weight()), bf16)
    assert not prunes_on_gpu(weight(), f16)
    assert not prunes_on_gpu(torch.zeros(4, 8, dtype=torch.float16), f16)


def test_device_weight_of_wrong_rank_is_a_diagnostic(fake_gpu):
    with pytest.raises(Exception) as info:
        prune_and_compress(FakeCupy(np.zeros((2, 3, 8), np.float16)), "f16")
    assert info.value.code == "SP0804" and "weight must be a 2-D (M, K) matrix" in info.value.message
    assert fake_gpu == []


def test_sparse_linear_from_dense_routes_a_device_weight(fake_gpu, monkeypatch):
    torch = pytest.importorskip("torch")
    from sparsile.integrations.torch import linear as torch_linear

    dense = torch.nn.Linear(72, 24, dtype=torch.bfloat16)
    want = torch_linear.SparseLinear.from_dense(dense)  # CPU weight: host path
    assert fake_gpu == []
    monkeypatch.setattr(torch_linear, "prunes_on_gpu", lambda w, op: w is dense.weight and op.name == "bf16")
    got = torch_linear.SparseLinear.from_dense(dense)
    assert len(fake_gpu) == 1 and fake_gpu[0][1:] == ("bf16", "sm90")
    for name in ("values", "meta", "bias"):
        a, b = getattr(got, name), torch.as_tensor(getattr(want, name))
        a = torch.as_tensor(a)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a, b.view(torch.int16)
                           if b.dtype == torch.bfloat16 else b), name
    assert got.scale_w is None and (got.in_features, got.out_features) == (72, 24)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16", "e4m3", "s8"])
@pytest.mark.parametrize("fmt", ["sm90", "tcgen05"])
def test_gpu_and_host_paths_are_bit_identical(dtype, fmt):
    torch = pytest.importorskip("torch")
    names = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "s8": torch.int8}
    base = torch.randn(256, 136, device="cuda") * (100 if dtype == "s8" else 1)
    w = base.to(names[dtype])
    w[:, 8:16] = 0  # chunks with fewer nonzeros
    assert prunes_on_gpu(w, operand_type(dtype))
    values, meta = prune_and_compress(w, dtype, fmt)
    assert values.is_cuda
    host = w.cpu()
    want_values, want_meta = prune_and_compress(host, dtype, fmt)
    bits = {1: torch.uint8, 2: torch.int16}[values.element_size()]
    assert torch.equal(values.cpu().view(bits), want_values.view(bits))
    np.testing.assert_array_equal(meta.data, want_meta.data)


@pytest.mark.gpu
def test_gpu_sparse_linear_from_dense_matches_the_host():
    torch = pytest.importorskip("torch")
    from sparsile.integrations.torch import SparseLinear

    dense = torch.nn.Linear(264, 128, dtype=torch.bfloat16)
    cpu = SparseLinear.from_dense(dense)
    gpu = SparseLinear.from_dense(dense.cuda())
    assert gpu.values.is_cuda and gpu.meta.is_cuda
    assert torch.equal(gpu.values.cpu().view(torch.int16), cpu.values.view(torch.int16))
    assert torch.equal(gpu.meta.cpu(), cpu.meta) and torch.equal(gpu.bias.cpu(), cpu.bias)
    x = torch.randn(16, 264, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(gpu(x), cpu.cuda()(x))
