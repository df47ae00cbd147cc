"""The weight dtype's spellings are the same at the three entry points that take one: SparseLinear
(and its from_dense), sparsify_ and prune_and_compress; a near miss ('fp16', 'half') is named in the
help, and 'fp8' is refused with 'e4m3' suggested (fp8 is e4m3 or e5m2; docs/torch.md)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels.compress_weight import prune_and_compress
from sparsile.stdlib.sparsity import SparsityError
from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.errors import IntegrationError  # noqa: E402

SPELLINGS = {
    "bf16": ("bf16", "bfloat16", "BF16", torch.bfloat16),
    "f16": ("f16", "float16", torch.float16),
    "e4m3": ("e4m3", "float8_e4m3fn", torch.float8_e4m3fn),
}
TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16, "e4m3": torch.float8_e4m3fn}
WEIGHT_HELP = ("pass dtype='bf16', 'f16' or 'e4m3' (fp8 weights with per-channel scales); 'bfloat16', 'float16', "
               "'float8_e4m3fn' and torch.bfloat16, torch.float16, torch.float8_e4m3fn work too")
FP8_HINT = "did you mean 'e4m3'? (fp8 is e4m3 or e5m2; weights' fp8 is e4m3, float8_e4m3fn)"
OPERAND_HELP = ("use one of 'f16', 'bf16', 'tf32', 'e4m3', 'e5m2', 's8', 'u8', 'e2m1' ('f32' is an alias of 'tf32'; "
                "the numpy and torch names such as 'float16' work too)")


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_every_spelling_works_at_every_entry_point(name: str) -> None:
    dense = linear(16, 64, dtype=torch.float32, seed=3)
    reference = prune_and_compress(dense.weight.detach(), name)
    for spelling in SPELLINGS[name]:
        assert spt.SparseLinear(64, 16, dtype=spelling).values.dtype == TORCH_DTYPE[name]
        layer = spt.SparseLinear.from_dense(dense, spelling)
        assert layer.values.dtype == TORCH_DTYPE[name]
        model = torch.nn.Sequential(linear(16, 64, dtype=torch.float32, seed=3))
        report = spt.sparsify_(model, dtype=spelling, interpret=True, min_features=16)
        assert report.swapped == ["0"] and model[0].values.dtype == TORCH_DTYPE[name]
        # prune_and_compress refused torch.float16 (SP0801) while the layers took it
        values, meta = prune_and_compress(dense.weight.detach(), spelling)
        assert values.dtype == TORCH_DTYPE[name] and meta.dtype == name
        assert torch.equal(values.view(torch.uint8), reference.values.view(torch.uint8))
        assert np.array_equal(meta.data, reference.meta.data)


def test_numpy_dtypes_name_an_operand_of_prune_and_compress() -> None:
    w = np.random.default_rng(4).standard_normal((16, 64)).astype(np.float32)
    assert prune_and_compress(w, np.float16).values.dtype == np.float16
    assert np.array_equal(prune_and_compress(w, np.dtype("float16")).values, prune_and_compress(w, "f16").values)


def layer_errors(dtype: object) -> list[IntegrationError]:
    errors = []
    for call in (lambda: spt.SparseLinear(64, 16, dtype=dtype),
                 lambda: spt.SparseLinear.from_dense(linear(16, 64, seed=1), dtype),
                 lambda: spt.sparsify_(torch.nn.Sequential(linear(16, 64, seed=1)), dtype=dtype, interpret=True,
                                       min_features=16)):
        with pytest.raises(IntegrationError) as e:
            call()
        errors.append(e.value)
    return errors


@pytest.mark.parametrize(("given", "hint"), [
    ("fp16", "did you mean 'f16'?"),
    ("half", "did you mean 'f16'?"),
    ("fp8", FP8_HINT),
])
def test_a_near_miss_names_the_spelling_meant(given: str, hint: str) -> None:
    # 'fp16' was "dtype fp16 has no 2:4 sparse linear kernel": f16 has one
    for err in layer_errors(given):
        assert (err.code, err.message, err.help) == ("SP0903", f"unknown weight dtype {given!r}",
                                                     f"{hint}; {WEIGHT_HELP}")
    with pytest.raises(SparsityError) as e:
        prune_and_compress(torch.randn(16, 64), given)
    assert (e.value.code, e.value.message, e.value.help) == ("SP0801", f"unknown sparse operand dtype {given!r}",
                                                             f"{hint}; {OPERAND_HELP}")


def test_a_type_without_a_layer_kernel_lists_the_spellings() -> None:
    for err in layer_errors(torch.float64):
        assert (err.code, err.message, err.help) == ("SP0903", "dtype torch.float64 has no 2:4 sparse linear kernel",
                                                     WEIGHT_HELP)
    with pytest.raises(SparsityError) as e:
        prune_and_compress(torch.randn(16, 64), torch.float64)
    assert (e.value.code, e.value.message, e.value.help) == ("SP0801", "unknown sparse operand dtype torch.float64",
                                                             OPERAND_HELP)
