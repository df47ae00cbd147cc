"""x of another layout than a dense (strided) tensor: a nested tensor (jagged or strided), a sparse COO
or CSR tensor, an mkldnn tensor. nn.Linear computes with them; the sparse kernel reads x's memory as a
dense (T, K) array, so the layer refuses them with SP0901 and say how to pass a dense x
(before: torch's internal errors from inside the layer, "NestedTensorImpl doesn't support sizes",
"Sparse CSR tensors do not have is_contiguous", "view(): cannot view shape (2, j1, 64)", ...). The op
called directly with such an x is torch's dispatcher error ("Could not run 'sparsile::sparse_linear' with
arguments from the 'SparseCPU' backend"), torch's convention for an op without that backend."""

from __future__ import annotations

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # (torch: sparse CSR and nested tensors are beta)

HELP = ("pass a dense x (x.to_dense()); for a nested tensor, run the layer on its packed tokens, "
        "layer(x.values()) for the jagged layout, then torch.nested.nested_tensor_from_jagged(y, x.offsets()), "
        "or on each tensor of x.unbind()")


KINDS = ("nested tensor (layout torch.strided)", "nested tensor (layout torch.jagged)",
         "tensor of layout torch.sparse_coo", "tensor of layout torch.sparse_csr", "tensor of layout torch._mkldnn")


def _layouts() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randn(2, 64, generator=gen), torch.randn(3, 64, generator=gen)]
    dense = torch.randn(3, 64, generator=gen)
    made = (torch.nested.nested_tensor(rows), torch.nested.nested_tensor(rows, layout=torch.jagged), dense.to_sparse(),
            dense.to_sparse_csr(), dense.to_mkldnn())
    return dict(zip(KINDS, made, strict=True))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("weight", "grad"), [("bf16", False), ("bf16", True), ("e4m3", False)])
def test_a_layer_refuses_an_x_that_is_not_dense(kind, weight, grad):
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=2), weight)
    x = _layouts()[kind]
    if grad and kind.startswith("nested"):
        x.requires_grad_()
    with torch.set_grad_enabled(grad), pytest.raises(IntegrationError) as caught:
        layer(x)
    assert caught.value.code == "SP0901"
    assert caught.value.message == f"x is a {kind}; SparseLinear takes a dense (strided) x"
    assert caught.value.help == HELP
