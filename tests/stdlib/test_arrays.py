"""stdlib/kernels/arrays.py: which device memory an array covers, and an ``out`` that shares memory
with an operand is not written in place (its kernel would read its own results): C goes to a new
array and is copied into out. torch CPU tensors stand in for CUDA ones (``array_kind`` patched)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparsile.stdlib.kernels import arrays, call_cache, operand_cast  # noqa: E402


@pytest.fixture
def as_cuda(monkeypatch):
    """torch tensors count as device tensors (their addresses and strides are real)."""
    real = arrays.array_kind
    monkeypatch.setattr(arrays, "array_kind", lambda x: "torch" if isinstance(x, torch.Tensor) else real(x))


def test_device_span_covers_strided_and_transposed_views(as_cuda):
    base = torch.zeros(8, 16, dtype=torch.float16)
    start = base.data_ptr()
    assert arrays.device_span(base) == (start, start + 8 * 16 * 2)
    assert arrays.device_span(base[2:4]) == (start + 2 * 32, start + 4 * 32)
    assert arrays.device_span(base.T) == (start, start + 8 * 16 * 2)
    assert arrays.device_span(base[:, 3]) == (start + 6, start + 7 * 32 + 6 + 2)
    assert arrays.device_span(base[:0]) is None and arrays.device_span(None) is None
    assert arrays.device_span(base.numpy()) is None  # host arrays: the interpreter copies


def test_overlaps_only_where_memory_is_shared(as_cuda):
    base = torch.zeros(8, 16, dtype=torch.float16)
    assert arrays.overlaps(base[:4], base) and arrays.overlaps(base[3:5], None, base[4:])
    assert not arrays.overlaps(base[:4], base[4:], torch.zeros(3), None)
    assert arrays.overlaps(base.T, base[7:, 15:])  # the last element, through a transposed view


def test_an_out_sharing_memory_with_an_operand_gets_a_new_array_then_the_copy(as_cuda):
    x = torch.randn(16, 16).to(torch.float16)
    fresh = arrays.output_array(x, (16, 16), "float16", "rule", x, False)
    assert fresh is not x and fresh.shape == (16, 16)
    other = torch.empty(16, 16, dtype=torch.float16)
    assert arrays.output_array(other, (16, 16), "float16", "rule", x, False) is other
    weight = torch.randn(8, 32).to(torch.float16)
    aliased = weight.view(16, 16)  # out is the weight's memory, seen as C's shape
    assert arrays.output_array(aliased, (16, 16), "float16", "rule", x, False, (weight,)) is not aliased
    fresh.copy_(torch.arange(256.0).view(16, 16))
    assert arrays.deliver_result(fresh, x, x) is x and torch.equal(x, fresh)


def test_the_call_cache_keeps_no_call_whose_out_shares_memory(as_cuda, monkeypatch):
    monkeypatch.setattr(call_cache, "array_kind", arrays.array_kind)  # (the patched one)
    values = torch.zeros(16, 8, dtype=torch.float16)
    words = torch.zeros(16, 1, dtype=torch.int32)
    b = torch.zeros(16, 16, dtype=torch.float16)
    assert call_cache.call_key(values, words, b, b, False, ()) is None
    assert call_cache.call_key(values, words, b, torch.empty(16, 16, dtype=torch.float16), False, ()) is not None


def test_an_out_sharing_memory_is_checked_like_any_other_out(as_cuda):
    """An aliased out of another type or shape is refused, not taken for C's copy (torch's copy_
    would convert float16 C into a float32 out, or broadcast it, silently)."""
    from sparsile.stdlib.sparsity import SparsityError

    x = torch.randn(16, 16).to(torch.float16)
    with pytest.raises(SparsityError, match="out must be a"):
        arrays.output_array(x.view(torch.int16), (16, 16), "float16", "rule", x, False)
    wide = torch.zeros(16, 16, dtype=torch.float32)
    with pytest.raises(SparsityError, match="out must be a"):
        arrays.output_array(wide, (16, 16), "float16", "rule", x, False, (wide,))
    with pytest.raises(SparsityError, match="out must be a"):
        arrays.output_array(x[:1], (16, 16), "float16", "rule", x, False)


def test_cupy_arrays_are_made_on_the_device_of_the_array_they_go_with(monkeypatch):
    """cupy allocates on its current device: scratch and device copies for an array on another GPU
    landed on the current one (a stand-in cupy module records the device each call ran under)."""
    import sys
    import types

    import numpy as np

    current = [0]

    class Device:
        def __init__(self, index: int) -> None:
            self.id = index

        def __enter__(self) -> None:
            current.append(self.id)

        def __exit__(self, *exc: object) -> None:
            current.pop()

    fake = types.ModuleType("cupy")
    fake.empty = lambda shape, dtype: ("empty", current[-1])
    fake.asarray = lambda host: ("asarray", current[-1])
    on_gpu_1 = type("ndarray", (), {"__module__": "cupy", "device": Device(1)})()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert arrays.array_kind(on_gpu_1) == "cupy"
    assert arrays.empty_array(on_gpu_1, (2, 3), "float32", False) == ("empty", 1)
    assert arrays.copy_like(np.zeros(3, np.float32), on_gpu_1) == ("asarray", 1)
    assert current == [0]


def test_a_single_row_of_any_stride_is_placed_as_a_packed_row(as_cuda):
    """``hidden[:, -1, :]`` (torch calls it contiguous) keeps its row stride S * K; the launch gets
    the same memory as a row of stride K (a tensor map of the odd stride is refused)."""
    hidden = torch.randn(1, 5, 12)
    for x in (hidden[:, -1, :], torch.randn(3, 14)[1:2, :12]):
        assert x.is_contiguous() and x.stride(0) != 12
        placed = arrays.placed_array(x, "x", False)
        assert placed.stride() == (12, 1) and placed.data_ptr() == x.data_ptr() and torch.equal(placed, x)
    packed, strided = torch.randn(4, 12), torch.randn(4, 14)[:, :12]
    assert arrays.placed_array(packed, "x", False) is packed
    assert arrays.placed_array(strided, "x", False) is strided  # (several rows: the launch sees the strides)


def test_a_torch_operand_is_cast_by_the_host_rules(as_cuda):
    """sparse_matmul's b (and values) given as torch tensors of another type: an integer operand
    type refuses what it cannot hold (torch's own cast wrapped 300 to 44), float64 rounds once to
    bf16 (torch rounded through float32), e4m3 saturates as the host does."""
    from sparsile.stdlib.sparsity import SparsityError

    s8 = SimpleNamespace(operand="s8", torch_dtype="int8")
    with pytest.raises(SparsityError) as err:
        arrays.cast_operand(torch.tensor([[300.0, 1.0]]), s8)
    assert err.value.code == "SP0804" and err.value.message.startswith("1 values of b are not finite or lie beyond")
    assert arrays.cast_operand(torch.tensor([[-128.0, 127.9]]), s8).tolist() == [[-128, 127]]
    bf16 = SimpleNamespace(operand="bf16", torch_dtype="bfloat16")
    x = torch.tensor([[1 + 2**-8 + 2**-30]], dtype=torch.float64)
    assert arrays.cast_operand(x, bf16).item() == 1 + 2**-7  # nearest bf16 (1.0 through float32)
    e4m3 = SimpleNamespace(operand="e4m3", torch_dtype="float8_e4m3fn")
    big = torch.tensor([[500.0, float("inf"), -1e6, 3.0]])
    assert arrays.cast_operand(big, e4m3).float().tolist() == [[448.0, 448.0, -448.0, 3.0]]


@pytest.mark.parametrize(("dtype", "values", "saturated"), [
    ("float32", [500.0, float("inf"), -1e6, 3.0], [448.0, 448.0, -448.0, 3.0]),
    ("bfloat16", [512.0, -float("inf"), 3.0], [448.0, -448.0, 3.0]),
    ("float16", [float("inf"), 60000.0, -0.5], [448.0, 448.0, -0.5]),
    ("float64", [1e300, -449.0, 3.0], [448.0, -448.0, 3.0]),
    ("int8", [-128, 120, 3], [-128.0, 120.0, 3.0]),    # (a clamp in int8 would wrap -448 to 64)
    ("int16", [1000, -1000, 3], [448.0, -448.0, 3.0]),
    ("float8_e5m2", [57344.0, -float("inf"), 3.0], [448.0, -448.0, 3.0]),  # (float8 has no clamp)
])
def test_e4m3_saturates_where_torchs_cast_makes_nan(as_cuda, monkeypatch, dtype, values, saturated):
    """torch 2.11 and 2.12 cast |x| > 448 to NaN in float8_e4m3fn (2.13 saturates): where the probe
    finds that cast, cast_operand clamps first, for every input type, and NaN stays NaN."""
    monkeypatch.setattr(operand_cast, "torch_e4m3_cast_saturates", lambda: False)
    e4m3 = SimpleNamespace(operand="e4m3", torch_dtype="float8_e4m3fn")
    x = torch.tensor([values], dtype=torch.float64).to(getattr(torch, dtype))
    assert arrays.cast_operand(x, e4m3).float().tolist() == [saturated]
    if x.dtype.is_floating_point:
        nan = torch.tensor([[float("nan")]], dtype=x.dtype)
        assert torch.isnan(arrays.cast_operand(nan, e4m3).float()).all()


def test_the_e4m3_cast_clamps_only_where_torchs_own_cast_does_not_saturate(monkeypatch):
    """The probe answers for the torch that runs (2.13's cast saturates 500 to 448, 2.11's makes it
    NaN), and the cast takes the path that answer picks: torch's own cast alone, or a clamp first."""
    big = torch.tensor([[500.0, -float("inf"), 3.0]])
    saturates = operand_cast.torch_e4m3_cast_saturates()
    assert saturates is (big.to(torch.float8_e4m3fn).float()[0, 0].item() == 448.0)
    clamps = []
    real_clamp = torch.clamp
    monkeypatch.setattr(torch, "clamp", lambda *a, **k: clamps.append(a[0].dtype) or real_clamp(*a, **k))
    got = operand_cast.to_e4m3_saturating(big, torch.float8_e4m3fn)
    assert got.dtype == torch.float8_e4m3fn and got.float().tolist() == [[448.0, -448.0, 3.0]]
    assert clamps == ([] if saturates else [torch.float32])


@pytest.mark.parametrize("saturates", [True, False])
def test_a_float64_torch_operand_rounds_once_to_e4m3_as_numpy_does(as_cuda, monkeypatch, saturates):
    """float64 -> e4m3 rounds once, as the host (ml_dtypes) and the other operand types do:
    torch's own float64 cast rounds through float32, so 1.0625 + 2**-40 (just above the midpoint of
    1.0 and 1.125) became the midpoint, then 1.0 (ties to even), where the host gives 1.125. On
    either path of the cast (torch's saturating one, or the clamp first)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy as np

    monkeypatch.setattr(operand_cast, "torch_e4m3_cast_saturates", lambda: saturates)
    e4m3 = SimpleNamespace(operand="e4m3", torch_dtype="float8_e4m3fn")
    values = [1.0625 + 2**-40, -(1.0625 + 2**-40), 1.0625 - 2**-40, 449.0, float("inf"), 3.0]
    host = np.array(values).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    host[3:5] = 448.0  # (the host saturates with a warning; ml_dtypes' cast alone makes these NaN)
    got = arrays.cast_operand(torch.tensor([values], dtype=torch.float64), e4m3).float()
    assert got.tolist() == [host.tolist()]
    assert torch.isnan(arrays.cast_operand(torch.tensor([[float("nan")]], dtype=torch.float64), e4m3).float()).all()


def test_a_uint64_torch_operand_rounds_once_to_bf16_as_the_host_does(as_cuda):
    """uint64 -> bf16 rounds once too, values of 2**63 and above among them (its high word is
    unsigned: an int64 view would read them as negative)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy as np

    values = [2**60 + 2**52 + 1, 2**63 + 2**55 + 1, 2**64 - 1, 2**63, 2**54 + 3, 5, 0]
    choice = SimpleNamespace(operand="bf16", torch_dtype="bfloat16")
    host = np.array(values, np.uint64).astype(ml_dtypes.bfloat16).astype(np.float64)
    got = arrays.cast_operand(torch.tensor([values], dtype=torch.uint64), choice).double()
    assert got.tolist() == [host.tolist()]


def test_an_int64_torch_operand_rounds_once_to_bf16_as_the_host_does(as_cuda):
    """int64 -> bf16 rounds once, as the host (ml_dtypes) does: an int64 beyond 2**53 is not exact
    in float64, and its rounding there could land on a bf16 midpoint (2**60 + 2**52 + 1 became the
    midpoint 2**60 + 2**52, then 2**60 by ties to even, where the host gives 2**60 + 2**53)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy as np

    values = [2**60 + 2**52 + 1, -(2**60 + 2**52 + 1), 2**60 + 2**52, 2**63 - 1, -(2**63), 2**54 + 3, 5, -7, 0]
    for dtype, operand, torch_dtype in ((ml_dtypes.bfloat16, "bf16", "bfloat16"), (np.float16, "f16", "float16")):
        choice = SimpleNamespace(operand=operand, torch_dtype=torch_dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # f16: the huge values overflow to inf (OverflowWarning)
            host = np.array(values, np.int64).astype(dtype).astype(np.float64)
            got = arrays.cast_operand(torch.tensor([values], dtype=torch.int64), choice).double()
        assert got.tolist() == [host.tolist()], operand


def test_an_out_too_large_for_the_exact_overlap_check_may_overlap() -> None:
    """An out of more than 4194304 elements whose strides (8 and 12 bytes, float32) do not show them
    apart: SP0804 says they may overlap, and why the check does not know."""
    from sparsile.frontend.interp.overlap import EXACT_OVERLAP_CHECK
    from sparsile.stdlib.kernels.arrays import output_array
    from sparsile.stdlib.sparsity import SparsityError

    rows = EXACT_OVERLAP_CHECK // 2 + 1
    out = np.lib.stride_tricks.as_strided(np.zeros(2 * rows + 4, np.float32), (rows, 2), (8, 12))
    with pytest.raises(SparsityError) as info:
        output_array(out, (rows, 2), "float32", "help", None, True)
    assert info.value.code == "SP0804"
    assert info.value.message == (f"out's elements may overlap in memory (shape ({rows}, 2), byte strides (8, 12)): "
                                  "its strides do not show them apart, and it has more elements than the 4194304 "
                                  "the check compares one by one")
    assert info.value.help == "pass an array whose elements are distinct (a new array, or a slice of one)"
