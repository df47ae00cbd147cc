"""The fake implementation of ``torch.ops.sparsile.sparse_linear`` (and ``sparse_linear_e4m3``) refuses
what the real one refuses: a bias or scale of a shape or element type the kernel does not take is the
kernel's SP0851 in both, with one message, so that torch.compile / torch.export stop at trace time
(before, the fake accepted a (1, N) scale_w, an integer bias or integer scales, and the compiled or
exported program failed at its first run)."""

from __future__ import annotations

import pytest

from sparsile.stdlib.kernels.linear_args import bias_or_scale
from sparsile.stdlib.sparsity import SparsityError
from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def _weights():
    bf16 = spt.SparseLinear.from_dense(linear(32, 64, seed=23))
    fp8 = spt.SparseLinear.from_dense(linear(32, 64, seed=23), "e4m3")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(24)).to(torch.bfloat16)
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    return bf16, fp8, x, xq, sx


def _cases():
    """(name, call, what, the value the kernel's check sees, its size, its dtypes) of each refused argument."""
    bf16, fp8, x, xq, sx = _weights()
    sw = fp8.scale_w
    lin = torch.ops.sparsile.sparse_linear
    e4m3 = torch.ops.sparsile.sparse_linear_e4m3
    ints = torch.arange(1, 33, dtype=torch.int32)
    return [
        ("scale_w (1, N)", lambda: lin(xq, fp8.values, fp8.meta, fp8.bias, sx, sw.reshape(1, -1)),
         "scale_w", sw.reshape(1, -1), 32, ("float32",)),
        ("scale_w (2, N/2)", lambda: lin(xq, fp8.values, fp8.meta, fp8.bias, sx, sw.reshape(2, -1)),
         "scale_w", sw.reshape(2, -1), 32, ("float32",)),
        ("int scale_w", lambda: lin(xq, fp8.values, fp8.meta, fp8.bias, sx, ints), "scale_w", ints, 32, ("float32",)),
        ("int scale_x", lambda: lin(xq, fp8.values, fp8.meta, fp8.bias, torch.ones(3, dtype=torch.int64), sw),
         "scale_x", torch.ones(3, dtype=torch.int64), 3, ("float32",)),
        ("int bias", lambda: lin(x, bf16.values, bf16.meta, ints), "bias", ints, 32, ("float32", "bfloat16")),
        ("bool bias", lambda: lin(x, bf16.values, bf16.meta, ints > 4), "bias", ints > 4, 32,
         ("float32", "bfloat16")),
        ("int bias, float32 y", lambda: lin(x, bf16.values, bf16.meta, ints, out_dtype=torch.float32), "bias", ints,
         32, ("float32", "float32")),
        ("e4m3 op, scale_w (1, N)", lambda: e4m3(x, fp8.values, fp8.meta, fp8.bias, sw.reshape(1, -1)),
         "scale_w", sw.reshape(1, -1), 32, ("float32",)),
        ("e4m3 op, int scale_w", lambda: e4m3(x, fp8.values, fp8.meta, fp8.bias, ints), "scale_w", ints, 32,
         ("float32",)),
        ("e4m3 op, int bias", lambda: e4m3(x, fp8.values, fp8.meta, ints, sw), "bias", ints, 32,
         ("float32", "bfloat16")),
    ]


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_fake_refuses_what_the_real_op_refuses_with_the_kernel_s_sp0851(case):
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, call, what, value, size, dtypes = case
    with pytest.raises(SparsityError) as kernel:  # the kernel's own check (the CPU interpreter's)
        bias_or_scale(value, what, size, torch.empty(1), True, dtypes)
    with pytest.raises(SparsityError) as real:
        call()
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(SparsityError) as fake:
        call()
    for got in (real.value, fake.value):
        assert (got.code, got.message, got.help) == ("SP0851", kernel.value.message, kernel.value.help)
        assert got.span == kernel.value.span
    assert kernel.value.message.startswith(f"{what} must be")


def test_accepted_shapes_and_types_still_run():
    """What the kernel takes stays accepted: scale_w (N, 1), (1, 1), 0-d; float64 or f16 bias; a float64 scale_x."""
    bf16, fp8, x, xq, sx = _weights()
    sw = fp8.scale_w
    want = torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, fp8.bias, sx, sw, out_dtype=torch.float32)
    for scale in (sw.reshape(-1, 1),):
        got = torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, fp8.bias, sx, scale, out_dtype=torch.float32)
        assert torch.equal(got, want)
    for scale in (sw[:1].reshape(1, 1), sw[0]):
        got = torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, fp8.bias, sx, scale, out_dtype=torch.float32)
        ref = torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, fp8.bias, sx, sw[:1],
                                               out_dtype=torch.float32)
        assert torch.equal(got, ref)
    got = torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, fp8.bias, sx.double(), sw,
                                           out_dtype=torch.float32)
    assert torch.equal(got, want)
    want = torch.ops.sparsile.sparse_linear(x, bf16.values, bf16.meta, bf16.bias)
    for bias in (bf16.bias.double(), bf16.bias.bfloat16()):
        y = torch.ops.sparsile.sparse_linear(x, bf16.values, bf16.meta, bias)
        assert y.dtype == torch.bfloat16 and torch.allclose(y.float(), want.float(), rtol=2 ** -7, atol=2 ** -6)


class _Call(torch.nn.Module):
    """A module that calls the op with a (1, N) scale_w."""

    def __init__(self):
        super().__init__()
        fp8 = spt.SparseLinear.from_dense(linear(32, 64, seed=25), "e4m3")
        for name in ("values", "meta", "bias"):
            self.register_buffer(name + "_", getattr(fp8, name))
        self.register_buffer("scale_w_", fp8.scale_w.reshape(1, -1))

    def forward(self, x):
        return torch.ops.sparsile.sparse_linear_e4m3(x, self.values_, self.meta_, self.bias_, self.scale_w_)


MESSAGE = "error[SP0851]: scale_w must be a number or of shape (32,), got shape (1, 32)"


def test_torch_compile_and_export_stop_at_trace_time():
    model = _Call()
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(26)).to(torch.bfloat16)
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(model, fullgraph=True, backend=backend)(x)
    assert MESSAGE in str(info.value) and graphs == []  # (no graph compiled: refused while tracing)
    with pytest.raises(Exception) as info:
        torch.export.export(model, (x,))
    assert MESSAGE in str(info.value)
