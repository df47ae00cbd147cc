"""The refusals of sparsile.torch that dynamo meets outside the Python it traces, under ``torch.compile``:
the compiled call fails with our code, message and help, as the eager call does.

Two ways a refusal reached the user as dynamo's own error, without our code (docs/torch.md, "A layer's
error under torch.compile"):

* forward-mode AD through a trainable ``SemiSparseLinear`` (``torch.func.jvp``, ``jacfwd``, a dual tensor
  of ``torch.autograd.forward_ad``): the layer's check read ``torch._C._is_fwd_grad_enabled()``, which
  dynamo cannot put in a graph ("torch.* op returned non-Tensor", an ``Unsupported``) before our SP0916;
* a refusal raised where dynamo runs a node on fake tensors (``torch._dynamo.utils.run_node``): a custom
  op's fake implementation (the op called with arguments that do not fit: SP0901, SP0904, SP0906, SP0919),
  its vmap rule (an ensemble whose weight is batched without its compressions: SP0916), an autograd
  formula under torch.func (a frozen layer's, fused group's or not: SP0922). Dynamo wrapped the error
  in its ``TorchRuntimeError`` (its repr in the text, no ``__cause__``), with ``fullgraph`` or without.

Now, as for the layers' SP0901 (test_torch_compiled_errors.py): with ``fullgraph=True`` dynamo's
``Unsupported`` whose text is our rendered error and whose ``__cause__`` is the ``IntegrationError``;
without it the frame runs eagerly and raises the ``IntegrationError`` itself. CPU tensors (interpreter)."""

from __future__ import annotations

import copy

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import FusedSiblings, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
fwad = pytest.importorskip("torch.autograd.forward_ad")

N, K, T = 32, 64, 5

FORWARD_MODE = ("SP0916", "a trainable sparse layer has no forward-mode derivative (torch.func.jvp, jacfwd, hessian; "
                "torch.autograd.forward_ad's dual tensors): its kernel has no tangent formula",
                "use reverse mode: backward() or torch.autograd.grad")
FROZEN_FORWARD_MODE = ("SP0922", "sparse_linear has no forward-mode derivative (torch.func.jvp, jacfwd, hessian; "
                       "torch.autograd.forward_ad): only x's reverse-mode gradient is implemented",
                       "use reverse mode: torch.func.grad, vjp or jacrev, or backward()")
FROZEN_VALUES = ("SP0922", "sparse_linear has no gradient for values: the sparse weight is frozen (an inference layer)",
                 "train x's producers through it, or make the layer trainable: sparsify_(model, trainable=True) "
                 "swaps in SemiSparseLinear (docs/training.md)")


def _batched(name: str) -> tuple[str, str, str]:
    return ("SP0916", f"a SemiSparseLinear cannot compute this call: its {name} is batched by torch.vmap, but its "
            "compressions are not (values, meta, values_t, meta_t: the kernel multiplies by those, made from the "
            "layer's own weight and mask)",
            "stack the layers' buffers with their parameters (torch.func.stack_module_state) and pass both to "
            "functional_call, after spt.recompress_ of each layer")


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _semi(seed: int = 1) -> spt.SemiSparseLinear:
    return spt.SemiSparseLinear.from_dense(linear(N, K, torch.float32, seed=seed), "bf16")


def _sparse() -> spt.SparseLinear:
    return spt.SparseLinear.from_dense(linear(N, K, seed=1), "bf16")



def _jvp(layer: torch.nn.Module):
    return (lambda x, t: torch.func.jvp(layer, (x,), (t,))), (_rand(T, K, seed=2), _rand(T, K, seed=3))


def _dual_tangent(layer: torch.nn.Module):
    def tangent(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        with fwad.dual_level():
            return fwad.unpack_dual(layer(fwad.make_dual(x, t))).tangent
    return tangent, (_rand(T, K, seed=2), _rand(T, K, seed=3))


def _jvp_in_parameters():
    layer = _semi()
    params = {name: p.detach() for name, p in layer.named_parameters()}
    tangents = {name: torch.randn_like(p) for name, p in params.items()}
    x = _rand(T, K, seed=2)
    return (lambda: torch.func.jvp(lambda p: torch.func.functional_call(layer, p, (x,)), (params,), (tangents,))), ()


def _ensemble(batched: str):
    """Three layers' stacked ``batched`` ("weight": the parameters; "mask": that buffer) through
    functional_call of the first, the compressions left the first layer's."""
    layers = [_semi(seed) for seed in (1, 2, 3)]
    base = copy.deepcopy(layers[0])
    params, buffers = torch.func.stack_module_state(layers)
    given = params if batched == "weight" else {"mask": buffers["mask"]}
    call = torch.vmap(lambda g, x: torch.func.functional_call(base, g, (x,)), in_dims=(0, None))
    return call, (given, _rand(4, K, seed=6))


def _values_grad(model: torch.nn.Module, name: str):
    """torch.func.grad of the (first) output's sum in the frozen ``values`` buffer ``name``."""
    values = dict(model.named_buffers())[name].detach().float()

    def loss(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = torch.func.functional_call(model, {name: v.to(torch.bfloat16)}, (x,))
        return (y[0] if isinstance(y, tuple) else y).float().sum()
    return (lambda x: torch.func.grad(loss)(values, x)), (_rand(T, K, seed=2),)


# (name, the call and its arguments, (code, message, help)): each refused eagerly, and compiled
CASES = [
    ("semi-jvp", lambda: _jvp(_semi()), FORWARD_MODE),
    ("semi-jacfwd", lambda: (torch.func.jacfwd(_semi()), (_rand(K, seed=2),)), FORWARD_MODE),
    ("semi-dual-tensor", lambda: _dual_tangent(_semi()), FORWARD_MODE),
    ("semi-jvp-in-parameters", _jvp_in_parameters, FORWARD_MODE),
    ("semi-ensemble-weight", lambda: _ensemble("weight"), _batched("weight")),
    ("semi-ensemble-mask", lambda: _ensemble("mask"), _batched("mask")),
    ("sparse-jvp", lambda: _jvp(_sparse()), FROZEN_FORWARD_MODE),
    ("fused-jvp", lambda: _jvp(FusedSiblings()), FROZEN_FORWARD_MODE),
    ("sparse-values-grad", lambda: _values_grad(_sparse(), "values"), FROZEN_VALUES),
    ("fused-values-grad", lambda: _values_grad(FusedSiblings(), "q_proj.values"), FROZEN_VALUES),
]


def _op_case(call, x_shape: tuple[int, ...], x_dtype: torch.dtype = torch.bfloat16):
    return lambda: (call, (_rand(*x_shape, seed=4, dtype=x_dtype),))


_LAYER = _sparse()
_SEMI = _semi()
_DENSE_W = linear(N, K, seed=1).weight.detach()

# the custom ops called directly in the compiled function: their fake implementations' checks
OP_CASES = [
    ("op-meta", _op_case(lambda x: torch.ops.sparsile.sparse_linear(x, _LAYER.values, _LAYER.meta[:, :1]), (T, K)),
     ("SP0906", "sparsile.sparse_linear: meta must be int32 words of shape (32, 2), got torch.int32 (32, 1)",
      "pass SparseLinear.meta (sm90 metadata words)")),
    ("op-x", _op_case(lambda x: torch.ops.sparsile.sparse_linear(x, _LAYER.values, _LAYER.meta), (T, 60)),
     ("SP0901", "sparsile.sparse_linear: x has shape (5, 60) but values (32, 32) cover K = 64",
      "x is (..., K) with the weight's in_features")),
    ("op-activation", _op_case(lambda x: torch.ops.sparsile.sparse_linear(x, _LAYER.values, _LAYER.meta,
                                                                          activation="tanh"), (T, K)),
     ("SP0904", "unknown activation 'tanh'", "use None, 'relu', 'silu', 'gelu_tanh', 'swiglu' or 'geglu'")),
    ("train-op-x", _op_case(lambda x: torch.ops.sparsile.sparse_linear_train(
        x, _SEMI.weight, _SEMI.mask, _SEMI.values, _SEMI.meta, _SEMI.values_t, _SEMI.meta_t, _SEMI.bias), (T, 60)),
     ("SP0901", "sparsile.sparse_linear_train: x must be (T, 64) torch.bfloat16, got torch.bfloat16 (5, 60)",
      "call it through SemiSparseLinear")),
    ("quantize-op-dtype", _op_case(lambda x: torch.ops.sparsile.quantize_per_token_e4m3(x), (T, K), torch.float64),
     ("SP0901", "quantize_per_token_e4m3 takes (..., K) bfloat16, float16 or float32 x, got torch.float64 (5, 64)",
      "cast x first")),
    ("sparse24-op-x", _op_case(lambda x: torch.ops.sparsile.sparse24_linear(x, _DENSE_W), (T, 60)),
     ("SP0919", "sparsile.sparse24_linear: x must be (..., 64) bfloat16, float16 or float32 for a weight (32, 64), "
      "got torch.bfloat16 (5, 60)", "the last dimension of x is the weight's in_features")),
]


def _reset() -> None:
    """``torch._dynamo.reset()`` (again where torch's raised "dictionary changed size during iteration")."""
    try:
        torch._dynamo.reset()
    except RuntimeError:
        torch._dynamo.reset()


def _eager_error(make) -> IntegrationError:
    fn, args = make()
    with pytest.raises(IntegrationError) as info:
        fn(*args)
    return info.value


def _check_expected(error: IntegrationError, want: tuple[str, str, str]) -> None:
    assert (error.code, error.message, error.help) == want


def _compiled_error(make, backend: str, fullgraph: bool) -> BaseException:
    fn, args = make()
    _reset()
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend=backend, fullgraph=fullgraph)(*args)
    return info.value


def _assert_ours(compiled: BaseException, eager: IntegrationError, fullgraph: bool) -> None:
    """With fullgraph: dynamo's error holds the rendered eager error and is caused by an equal
    IntegrationError; without: the IntegrationError itself."""
    ours = compiled.__cause__ if fullgraph else compiled
    assert isinstance(ours, IntegrationError), repr(compiled)[:2000]
    assert (ours.code, ours.message, ours.help) == (eager.code, eager.message, eager.help)
    assert eager.render() in str(compiled)


ALL = CASES + OP_CASES


@pytest.mark.parametrize("case", ALL, ids=[c[0] for c in ALL])
@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph-break"])
def test_compiled_refusal_is_the_eager_one(case, fullgraph):
    _, make, want = case
    eager = _eager_error(make)
    _check_expected(eager, want)
    _assert_ours(_compiled_error(make, "eager", fullgraph), eager, fullgraph)


@pytest.mark.parametrize("case", [c for c in ALL if c[0] in ("semi-jvp", "semi-ensemble-weight", "fused-values-grad",
                                                              "op-meta")], ids=lambda c: c[0])
def test_with_an_aot_backend_too(case):
    _, make, _ = case
    eager = _eager_error(make)
    _assert_ours(_compiled_error(make, "aot_eager", True), eager, True)


def test_strict_export_of_the_op_shows_ours():
    """torch.export's strict tracer is dynamo's: the op's fake check comes out as under fullgraph."""
    class Call(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.sparsile.sparse_linear(x, _LAYER.values, _LAYER.meta)

    with pytest.raises(Exception) as info:
        torch.export.export(Call(), (_rand(T, 60, seed=4),), strict=True)
    assert "error[SP0901]: sparsile.sparse_linear: x has shape (5, 60) but values (32, 32) cover K = 64" \
        in str(info.value)
    assert isinstance(info.value.__cause__, IntegrationError)


def test_compiled_forward_mode_through_a_frozen_input_gradient_still_computes():
    """The forward-mode check under dynamo changes nothing where nothing is refused: a compiled ``jvp`` of a
    dense function, and a compiled call of the trainable layer inside no forward-mode level, run as eagerly."""
    layer = _semi()
    x = _rand(T, K, seed=7)
    _reset()
    assert torch.equal(torch.compile(layer, backend="eager", fullgraph=True)(x), layer(x))
    dense = torch.nn.Linear(K, N).to(torch.bfloat16)
    t = _rand(T, K, seed=8)
    _reset()
    got = torch.compile(lambda a, b: torch.func.jvp(dense, (a,), (b,)), backend="eager", fullgraph=True)(x, t)
    want = torch.func.jvp(dense, (x,), (t,))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_outside_dynamo_nothing_is_in_fake_propagation():
    from sparsile.integrations.torch.traced_errors import in_fake_propagation

    assert not in_fake_propagation()
    with torch._subclasses.fake_tensor.FakeTensorMode():  # (a fake mode of one's own is not dynamo's)
        assert not in_fake_propagation()


def test_a_compiled_call_rechecks_forward_mode_when_the_flag_changes():
    """``forward_grad_enabled`` is an ``assume_constant_result`` of the trace: a function compiled with
    forward AD off inside a dual level must not keep that answer once it is on (dynamo's guard on the
    flag recompiles; a cached graph would skip SP0916 and return no tangent), and the other way round."""
    layer = _semi()
    x, t = _rand(T, K, seed=11), _rand(T, K, seed=12)
    _reset()
    f = torch.compile(lambda a: layer(a), backend="eager")
    with fwad.dual_level():
        d = fwad.make_dual(x, t)
        with fwad._set_fwd_grad_enabled(False):
            assert torch.equal(f(d), layer(x))
        with pytest.raises(IntegrationError) as info:
            f(d)
        assert (info.value.code, info.value.message, info.value.help) == FORWARD_MODE
        with fwad._set_fwd_grad_enabled(False):
            assert torch.equal(f(d), layer(x))


class _SeenCache:
    """A stand-in of the custom op's record cache: each run notes whether dynamo is tracing it, and
    computes y in the interpreter (the CPU x here stands for a CUDA one)."""

    def __init__(self) -> None:
        self.tracing: list[bool] = []

    def run(self, key, x, w, scale_x, out_dtype, stream=None, off_pool=False):
        from sparsile.integrations.torch import _kernels

        self.tracing.append(torch.compiler.is_compiling())
        return _kernels.run_interpreted(x, w, scale_x, out_dtype)


def test_the_op_s_record_path_is_never_traced_by_dynamo(monkeypatch):
    """``ops.run_record`` (the CUDA call of the custom op: the record cache's Python) is opaque to dynamo,
    as ``_kernels.run_interpreted`` is: a compiled frame that calls it (without fullgraph: the op's
    implementation called from a graph-broken frame) runs it eagerly, never traces into the cache
    (where a compiled torch.func.jvp met torch's internal assert on a GPU). CPU: a stand-in cache, and
    run_cuda called directly (the op calls it on CUDA). Before, dynamo traced the cache's run.
    GPU: test_capture_threads_gpu.py."""
    from sparsile.integrations.torch import _kernels, ops

    layer = _sparse()
    w = _kernels.Weight(layer.values, layer.meta, layer.bias, None, None)
    cache = _SeenCache()
    monkeypatch.setattr(ops, "RECORDS", cache)
    x = _rand(T, K, seed=4)

    def call(x2: torch.Tensor) -> torch.Tensor:
        return ops.run_cuda(x2, w, None, torch.bfloat16) * 2

    got = torch.compile(call, backend="eager")(x)  # (not fullgraph: the frames it calls are compiled too)
    assert cache.tracing == [False]
    torch.testing.assert_close(got, 2 * _kernels.run_interpreted(x, w, None, torch.bfloat16), rtol=0, atol=0)


def test_an_eager_call_of_the_op_skips_the_dynamo_wrapper(monkeypatch):
    """The disabled wrapper costs microseconds a call: an eager call (no dynamo) runs the record cache
    directly, and only a traced one takes ``run_record_untraced``."""
    from sparsile.integrations.torch import _kernels, ops

    def refuse(*args, **kwargs):
        raise AssertionError("an eager call took the dynamo wrapper")

    layer = _sparse()
    w = _kernels.Weight(layer.values, layer.meta, layer.bias, None, None)
    cache = _SeenCache()
    monkeypatch.setattr(ops, "RECORDS", cache)
    monkeypatch.setattr(ops, "run_record_untraced", refuse)
    x = _rand(T, K, seed=5)
    got = ops.run_cuda(x, w, None, torch.bfloat16)
    assert cache.tracing == [False]
    torch.testing.assert_close(got, _kernels.run_interpreted(x, w, None, torch.bfloat16), rtol=0, atol=0)
