"""The GPU toolkit casts a wider input to the operand type as the host toolkit does
(stdlib/kernels/operand_cast.py), wherever the input lives: e4m3 saturates at ±448 with a
SaturationWarning (ml_dtypes alone would give NaN), s8/u8 refuse values they cannot hold (SP0804;
a plain cast wraps 300 to 44), and a float64 torch tensor is rounded once (torch alone rounds
through float32, twice). CUDA tensors are modeled by CPU tensors taken for device tensors, run in
the interpreter, as in test_sparsity_gpu.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sparsile.stdlib import sparsity as S
from sparsile.stdlib.kernels import sparsity_gpu as G
from sparsile.stdlib.kernels.operand_cast import cast_input
from sparsile.stdlib.sparsity import SaturationWarning, SparsityError

torch = pytest.importorskip("torch")


def bits(x: object) -> np.ndarray:
    return np.ascontiguousarray(S.as_host_array(x)).view(np.uint8)


@pytest.fixture(params=["numpy", "torch-cpu", "torch-device"])
def where(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the input lives: numpy, a CPU torch tensor (read through the host), or a tensor the
    wrappers take for a CUDA one (cast by torch)."""
    if request.param == "torch-device":
        real_kind = G.array_kind
        monkeypatch.setattr(G, "array_kind", lambda x: "torch" if real_kind(x) == "torch-cpu" else real_kind(x))
        monkeypatch.setattr(G, "_placed", lambda x, what, interpret: x)
    return request.param


def placed(w: np.ndarray, where: str) -> object:
    return w if where == "numpy" else torch.from_numpy(w)


def test_e4m3_saturates_as_on_the_host(where: str) -> None:
    w = np.array([[500.0, 1.0, 2.0, 3.0, -1000.0, 0.0, 0.0, 0.0], [np.inf, -np.inf, 0.5, np.nan, 0, 0, 0, 7]],
                 np.float32)
    with pytest.warns(SaturationWarning, match="3 values of w lie beyond ±448"):  # -inf is pruned first
        ref_values, ref_indices = S.compress(w, "e4m3", prune=True)
    with pytest.warns(SaturationWarning, match="4 values of w lie beyond ±448"):  # cast first
        values, meta = G.compress_gpu(placed(w, where), "e4m3", "sm90", interpret=True)
    np.testing.assert_array_equal(bits(values), bits(ref_values))
    np.testing.assert_array_equal(meta.to_host().data, S.encode_metadata(ref_indices, "sm90", "e4m3", k=8).data)
    assert S.as_host_array(values).astype(np.float32)[0].tolist() == [448.0, 3.0, -448.0, 0.0]
    with pytest.warns(SaturationWarning):
        pruned = G.prune_gpu(placed(w, where), "e4m3", interpret=True)
    assert not np.isnan(S.as_host_array(pruned).astype(np.float32)[0]).any()


@pytest.mark.parametrize(("dtype", "bad"), [("s8", 300.0), ("s8", -129.0), ("u8", -1.0), ("s8", np.nan),
                                            ("u8", np.inf)])
def test_integer_types_refuse_what_they_cannot_hold(where: str, dtype: str, bad: float) -> None:
    w = np.array([[bad, 1.0, 2.0, 3.0]], np.float32)
    info = np.iinfo(S.operand_type(dtype).host_dtype)
    message = (f"1 values of w are not finite or lie beyond [{info.min}, {info.max}], the range of {dtype}: "
               "a cast would wrap them")
    for call in (lambda: G.compress_gpu(placed(w, where), dtype, interpret=True),
                 lambda: G.prune_gpu(placed(w, where), dtype, interpret=True)):
        with pytest.raises(SparsityError) as err:
            call()
        assert (err.value.code, err.value.message) == ("SP0804", message)
    ok = np.array([[127.9, -128.9 if dtype == "s8" else 255.5, 2.0, 3.0]], np.float32)
    values, _ = G.compress_gpu(placed(ok, where), dtype, interpret=True)
    np.testing.assert_array_equal(bits(values), bits(S.compress(ok, dtype, prune=True)[0]))


def _wide_values() -> np.ndarray:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(20000) * 10.0 ** rng.integers(-45, 40, 20000)
    edge = [1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 1 + 2**-11 + 2**-40, 1 + 2**-4 + 2**-40, 1e300, -1e300,
            np.inf, np.nan, 5e-324, 0.0, -0.0, 3.4028235677973366e38, 65519.99, 65520.0, 447.9, 464.0]
    return np.concatenate([x, edge])


@pytest.mark.parametrize("dtype", ["bf16", "f16", "e4m3", "e5m2"])
def test_float64_tensor_rounds_once(dtype: str) -> None:
    """torch's float64 -> bf16 goes through float32 (1 + 2**-8 + 2**-30 -> 1.0, not 1 + 2**-7); the
    cast of the wrappers rounds once, bit for bit as ml_dtypes (cast_to_operand) does."""
    op = S.operand_type(dtype)
    x = _wide_values()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SaturationWarning)
        warnings.simplefilter("ignore", S.OverflowWarning)
        want = S.cast_to_operand(x, op)
        got = S.as_host_array(cast_input(torch.from_numpy(x), op, getattr(torch, G._TORCH_DTYPES[dtype]), "torch"))
    nan = np.isnan(want.astype(np.float64))
    assert (np.isnan(got.astype(np.float64)) == nan).all()
    np.testing.assert_array_equal(bits(got)[~np.repeat(nan, op.host_dtype.itemsize)],
                                  bits(want)[~np.repeat(nan, op.host_dtype.itemsize)])


@pytest.mark.filterwarnings("ignore::sparsile.stdlib.sparsity.OverflowWarning")  # (the host cast's: values past bf16)
def test_float64_weight_compresses_alike_on_cpu_and_device(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _wide_values()[:20000].reshape(100, 200)
    w[:, 1::4] = (1 + 2**-8 + 2**-30) * np.sign(w[:, 1::4])
    cpu_values, cpu_meta = G.compress_gpu(torch.from_numpy(w), "bf16", "sm90", interpret=True)
    real_kind = G.array_kind
    monkeypatch.setattr(G, "array_kind", lambda x: "torch" if real_kind(x) == "torch-cpu" else real_kind(x))
    monkeypatch.setattr(G, "_placed", lambda x, what, interpret: x)
    dev_values, dev_meta = G.compress_gpu(torch.from_numpy(w), "bf16", "sm90", interpret=True)
    np.testing.assert_array_equal(bits(dev_values), bits(cpu_values))
    np.testing.assert_array_equal(dev_meta.to_host().data, cpu_meta.to_host().data)
