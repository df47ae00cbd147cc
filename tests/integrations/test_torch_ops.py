"""torch.ops.sparsile.sparse_linear / quantize_per_token_e4m3: the schema, torch.library.opcheck,
fake-tensor shapes, tracing a sparsified model with torch.compile(fullgraph=True) and torch.export
(on the CPU, the op runs in the interpreter), and the SP0906 diagnostics."""

from __future__ import annotations

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def test_schema():
    schema = str(torch.ops.sparsile.sparse_linear.default._schema)
    assert schema == ("sparsile::sparse_linear(Tensor x, Tensor values, Tensor meta, Tensor? bias=None, "
                      "Tensor? scale_x=None, Tensor? scale_w=None, *, str? activation=None, "
                      "ScalarType? out_dtype=None) -> Tensor")
    quant = str(torch.ops.sparsile.quantize_per_token_e4m3.default._schema)
    assert quant == "sparsile::quantize_per_token_e4m3(Tensor x) -> (Tensor, Tensor)"
    e4m3 = str(torch.ops.sparsile.sparse_linear_e4m3.default._schema)
    assert e4m3 == ("sparsile::sparse_linear_e4m3(Tensor x, Tensor values, Tensor meta, Tensor? bias, Tensor scale_w, "
                    "Tensor? scale_x=None, *, str? activation=None, ScalarType? out_dtype=None) -> Tensor")


def test_no_op_is_a_custom_op_whose_autograd_kernel_autograd_py_replaces():
    """autograd.py registers each op's Autograd kernel with ``Library.impl``. Over the one that
    ``torch.library.custom_op`` registers, torch before 2.13 raises at import (quantize_per_token_e4m3
    was a custom_op: ``import sparsile.torch`` failed on torch 2.11, found on the H100): each op that
    autograd.py gives a kernel is defined with ``Library.define`` instead, as is training.py's
    ``sparse_linear_train`` (its Autograd kernel: training._TrainFormula; ``sparse24_linear`` is a
    custom_op with ``register_autograd``: no second kernel)."""
    from torch._library.custom_ops import OPDEFS

    for name in ("sparse_linear", "sparse_linear_e4m3", "quantize_per_token_e4m3", "sparse_linear_train"):
        assert f"sparsile::{name}" not in OPDEFS
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"sparsile::{name}", "Autograd")


def _args(layer, x):
    return (x.to(layer.values.dtype), layer.values, layer.meta, layer.bias)


def test_opcheck_bf16_and_e4m3():
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    x = torch.randn(3, 64).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.sparsile.sparse_linear.default, _args(layer, x), {"activation": "relu"})
    fp8 = spt.SparseLinear.from_dense(linear(32, 64), "e4m3")
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    # test_schema compares float8 tensors with arithmetic torch lacks on the CPU ("mul_cpu_reduced_float")
    fp8_utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.sparsile.sparse_linear.default, (xq, fp8.values, fp8.meta, fp8.bias),
                          {"scale_x": sx, "scale_w": fp8.scale_w, "out_dtype": torch.float32}, test_utils=fp8_utils)
    torch.library.opcheck(torch.ops.sparsile.quantize_per_token_e4m3.default, (x,), test_utils=fp8_utils)
    for xg in (x, x.clone().requires_grad_()):  # (with grad: the autograd formula, traced by AOTAutograd)
        torch.library.opcheck(torch.ops.sparsile.sparse_linear_e4m3.default,
                              (xg, fp8.values, fp8.meta, fp8.bias, fp8.scale_w), {"activation": "silu"},
                              test_utils=fp8_utils)


def test_the_e4m3_op_is_the_quantizer_then_sparse_linear_and_checks_its_values():
    """sparse_linear_e4m3(x, ...) = sparse_linear(*quantize_per_token_e4m3(x), ...) bit for bit (N-D x,
    out_dtype, fakes' shapes); values of another type are SP0906, not sparse_linear's dtype mismatch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fp8 = spt.SparseLinear.from_dense(linear(32, 64, seed=2), "e4m3")
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    for out in (None, torch.float32):
        want = torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, fp8.bias, sx, fp8.scale_w, out_dtype=out)
        got = torch.ops.sparsile.sparse_linear_e4m3(x, fp8.values, fp8.meta, fp8.bias, fp8.scale_w, out_dtype=out)
        assert got.dtype == want.dtype and torch.equal(got, want)
    with FakeTensorMode(allow_non_fake_inputs=True):
        y = torch.ops.sparsile.sparse_linear_e4m3(torch.empty(4, 1, 64, dtype=torch.float16), fp8.values, fp8.meta,
                                                  None, fp8.scale_w)
        assert (y.shape, y.dtype) == ((4, 1, 32), torch.bfloat16)  # (as sparse_linear of an fp8 x)
    bf16 = spt.SparseLinear.from_dense(linear(32, 64, seed=2))
    for fake in (False, True):
        with pytest.raises(IntegrationError) as info:
            with FakeTensorMode(allow_non_fake_inputs=True) if fake else torch.no_grad():
                torch.ops.sparsile.sparse_linear_e4m3(x, bf16.values, bf16.meta, None, fp8.scale_w)
        assert (info.value.code, info.value.message) == (
            "SP0906", "sparsile.sparse_linear_e4m3: values must be float8_e4m3fn, got torch.bfloat16 (32, 32)")


def test_op_matches_the_module_and_float64():
    layer = spt.SparseLinear.from_dense(linear(32, 64), activation="gelu_tanh")
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    y = torch.ops.sparsile.sparse_linear(*_args(layer, x), activation="gelu_tanh")
    assert torch.equal(y, layer(x))
    check_against_float64(layer, x, y)


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = spt.SparseLinear.from_dense(linear(48, 64), "e4m3")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        for lead in [(), (3,), (3, 1), (1,)]:
            x = torch.empty(*lead, 64, dtype=torch.float16)
            y = layer(x)
            assert y.shape == (*lead, 48) and y.dtype == torch.float16 and mode.is_our_fake(y)
        xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(torch.empty(5, 64, dtype=torch.bfloat16))
        assert (xq.shape, xq.dtype, sx.shape, sx.dtype) == ((5, 64), torch.float8_e4m3fn, (5,), torch.float32)



def test_fakes_match_the_real_ops_for_a_non_contiguous_x():
    """The fakes give the real outputs' shapes, dtypes and strides for a transposed x (2-D, 3-D):
    the quantizer's fake took x's strides (empty_like), its real output is contiguous."""
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    fp8 = spt.SparseLinear.from_dense(linear(32, 64), "e4m3")
    xs = [torch.randn(64, 6).to(torch.bfloat16).t(), torch.randn(3, 64, 2).to(torch.bfloat16).transpose(1, 2)]
    for x in xs:
        assert not x.is_contiguous()
        torch.library.opcheck(torch.ops.sparsile.quantize_per_token_e4m3.default, (x,),
                              test_utils=("test_faketensor",))
        torch.library.opcheck(torch.ops.sparsile.sparse_linear.default, _args(layer, x),
                              {"activation": "relu", "out_dtype": torch.float32}, test_utils=("test_faketensor",))
        xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
        torch.library.opcheck(torch.ops.sparsile.sparse_linear.default, (xq, fp8.values, fp8.meta, fp8.bias),
                              {"scale_x": sx, "scale_w": fp8.scale_w}, test_utils=("test_faketensor",))

class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = linear(64, 32, seed=1)
        self.down = linear(32, 64, seed=2)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


def _sparse_mlp(dtype=None):
    model = _Mlp()
    report = spt.sparsify_(model, dtype=dtype, interpret=True, min_features=16)
    assert report.swapped == ["up", "down"]
    return model


@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_torch_compile_fullgraph_traces_the_op(dtype):
    model = _sparse_mlp(dtype)
    x = torch.randn(4, 32).to(torch.bfloat16)
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, fullgraph=True, backend=backend)
    assert torch.equal(compiled(x), model(x))
    (gm,) = graphs
    targets = [str(n.target).removesuffix(".default") for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("sparsile.sparse_linear") == 2
    assert targets.count("sparsile.quantize_per_token_e4m3") == (2 if dtype else 0)


def test_torch_compile_aot_eager_dynamic_shapes():
    model = _sparse_mlp("e4m3")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for lead in [(2, 3), (5,), (1,)]:
        x = torch.randn(*lead, 32).to(torch.bfloat16)
        assert torch.equal(compiled(x), model(x))


def test_torch_export():
    model = _sparse_mlp("e4m3")
    x = torch.randn(3, 32).to(torch.bfloat16)
    program = torch.export.export(model, (x,))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    # (an e4m3 layer exports the quantizer and the kernel as one op, for an x that may require grad later:
    # test_torch_op_x_dtypes.py)
    assert targets.count("sparsile.sparse_linear_e4m3.default") == 2
    assert torch.equal(program.module()(x), model(x))


@pytest.mark.filterwarnings("ignore")  # torch.jit.trace is deprecated, and warns about shape checks
def test_jit_trace_records_the_op():
    layer = spt.SparseLinear.from_dense(linear(32, 64), activation="relu")
    x = torch.randn(3, 64).to(torch.bfloat16)
    traced = torch.jit.trace(layer, (x,), check_trace=False)
    assert "sparsile::sparse_linear" in str(traced.graph)
    assert torch.equal(traced(x), layer(x))


def _error(*args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        torch.ops.sparsile.sparse_linear(*args, **kwargs)
    return info.value


def test_argument_errors_are_sp0906_and_sp0901():
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    fp8 = spt.SparseLinear.from_dense(linear(32, 64), "e4m3")
    x = torch.randn(3, 64).to(torch.bfloat16)
    v, m, b = layer.values, layer.meta, layer.bias
    cases = [
        ((x, v.float(), m), "SP0906", "values must be a 2-D bfloat16, float16 or float8_e4m3fn tensor, got "
                                      "torch.float32 (32, 32)"),
        ((x[:, :40], v, m), "SP0901", "x has shape (3, 40) but values (32, 32) cover K = 64"),
        ((x.double(), v, m), "SP0901", "x has dtype torch.float64 but the weight is torch.bfloat16: x is bfloat16, "
                                       "float16 or float32, cast to the weight's type inside"),
        ((x, v, m[:, :1]), "SP0906", "meta must be int32 words of shape (32, 2), got torch.int32 (32, 1)"),
        ((x, v, m, b[:4]), "SP0906", "bias must have shape (32,), got (4,)"),
        ((x, v, m, b, torch.ones(3)), "SP0906", "scale_x and scale_w go with float8_e4m3fn x and values, and "
                                                "only with them"),
        ((x.to(torch.float8_e4m3fn), fp8.values, fp8.meta, None, torch.ones(3), torch.ones(5)), "SP0906",
         "scale_w has 5 elements; it is per tensor (1) or per output channel (32)"),
        ((x.to(torch.float8_e4m3fn), fp8.values, fp8.meta, None, torch.ones(2), torch.ones(32)), "SP0906",
         "scale_x has 2 elements; it is per tensor (1) or per token (3)"),
        ((x, v, m, b.to("meta")), "SP0906", "x is on cpu but bias is on meta"),
    ]
    for args, code, message in cases:
        err = _error(*args)
        assert (err.code, err.message) == (code, f"sparsile.sparse_linear: {message}")
    err = _error(x, v, m, activation="gelu")
    assert (err.code, err.message) == ("SP0904", "unknown activation 'gelu'")
    with pytest.raises(IntegrationError) as info:
        torch.ops.sparsile.quantize_per_token_e4m3(torch.ones(3, 4, dtype=torch.int32))
    assert (info.value.code, info.value.message) == (
        "SP0901", "quantize_per_token_e4m3 takes (..., K) bfloat16, float16 or float32 x, got torch.int32 (3, 4)")


def test_missing_tensors_are_sp0901_and_sp0906():
    """The dispatcher passes None through for the op's Tensor arguments: refused by the op's checks
    (it was an AttributeError inside them)."""
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    x = torch.randn(3, 64).to(torch.bfloat16)
    cases = [((None, layer.values, layer.meta), "SP0901", "x must be a tensor, got NoneType"),
             ((x, None, layer.meta), "SP0906", "values must be a tensor, got NoneType"),
             ((x, layer.values, None), "SP0906", "meta must be a tensor, got NoneType")]
    for args, code, message in cases:
        err = _error(*args)
        assert (err.code, err.message) == (code, f"sparsile.sparse_linear: {message}")


def test_empty_k_gives_the_epilogue_of_zero_sums():
    """K = 0 (values (N, 0)): y = activation(bias) per token, and quantize_per_token_e4m3 of a
    (T, 0) x gives (T, 0) and T scales (both were a reshape error: -1 is ambiguous with no elements)."""
    bias = torch.linspace(-2, 2, 32)
    x = torch.ones(4, 0, dtype=torch.bfloat16)
    values, meta = torch.zeros(32, 0, dtype=torch.bfloat16), torch.zeros(32, 0, dtype=torch.int32)
    y = torch.ops.sparsile.sparse_linear(x, values, meta, bias, activation="relu")
    assert y.shape == (4, 32) and torch.equal(y.float(), torch.relu(bias).bfloat16().float().expand(4, 32))
    fp8 = torch.ops.sparsile.sparse_linear(x.to(torch.float8_e4m3fn), values.to(torch.float8_e4m3fn), meta, bias,
                                           torch.ones(4), torch.ones(32))
    assert torch.equal(fp8.float(), bias.bfloat16().float().expand(4, 32))
    xq, scale = torch.ops.sparsile.quantize_per_token_e4m3(torch.ones(2, 4, 0))
    assert xq.shape == (2, 4, 0) and xq.dtype == torch.float8_e4m3fn and scale.shape == (2, 4)


@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_vmap_over_a_layer_takes_the_op(dtype):
    """torch.func.vmap over a SparseLinear: x is a BatchedTensor (type torch.Tensor, no dispatch mode),
    so the layer takes the custom op as under other tracers. Before, it took the eager path, which
    read the BatchedTensor on the host: SP0804."""
    layer = spt.SparseLinear.from_dense(linear(32, 64), dtype, activation="relu")
    x = torch.randn(4, 3, 64).to(torch.bfloat16)
    assert torch.equal(torch.func.vmap(layer)(x), layer(x))
    assert torch.equal(torch.func.vmap(layer, in_dims=1)(x), layer(x.transpose(0, 1)))


def _lru_cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "functools.lru_cache" in str(w.message)]


def test_dynamo_compiling_the_op_implementation_meets_no_lru_cache(monkeypatch, recwarn):
    """Where a compiled frame runs the op eagerly (a graph break), dynamo compiles the op's Python
    implementation, argument check included; the check's shape cache (an ``functools.lru_cache``) made
    dynamo warn "Dynamo detected a call to a `functools.lru_cache`-wrapped function at 'ops.py:114'"
    in the user's run. Compiled directly here: the same frame, the same numbers, no such warning."""
    from sparsile.integrations.torch import ops

    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set(), raising=False)  # (dynamo warns once)
    torch._dynamo.reset()
    layer = spt.SparseLinear.from_dense(linear(32, 64), activation="relu")
    x = torch.randn(3, 64).to(torch.bfloat16)
    y = torch.compile(ops.sparse_linear, backend="eager")(x, layer.values, layer.meta, layer.bias, activation="relu")
    check_against_float64(layer, x, y)
    assert _lru_cache_warnings(recwarn) == []


def test_a_graph_break_at_the_op_meets_no_lru_cache(monkeypatch, recwarn):
    """A compiled call the op's fake implementation refuses: a graph break, the frame runs eagerly and dynamo
    compiles the op's implementation on the way to the refusal (SP0906), without the lru_cache warning."""
    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set(), raising=False)
    torch._dynamo.reset()
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    x = torch.randn(3, 64).to(torch.bfloat16)
    with pytest.raises(IntegrationError) as info:
        torch.compile(lambda t: torch.ops.sparsile.sparse_linear(t, layer.values, layer.meta[:, :1]),
                      backend="eager")(x)
    assert info.value.code == "SP0906"
    assert _lru_cache_warnings(recwarn) == []
