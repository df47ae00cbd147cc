"""Gradients through frozen sparse layers (docs/torch.md, "Gradients").

A ``SparseLinear`` and ``torch.ops.sparsile.sparse_linear`` are inference layers: their weight
(values, metadata, scale_w) has no gradient. But a model that trains something else (LoRA adapters,
a prompt, the layers before a frozen sparse block) needs the gradient *through* them, with respect
to x, and the bias's where the bias is trainable. Before the thirty-fifth session a call with an x
that required grad returned a y outside the autograd graph (the eager layer) or one whose backward
silently gave x no gradient (the op, with torch's "autograd kernel was not registered" warning):
upstream parameters were trained on a wrong gradient.

For y = act(pre), pre = (x @ Wᵀ) * scale_x * scale_w + bias (W = decompress(values, meta)):

* ``d pre`` is ``dy`` without an activation; otherwise the pre-activations are computed again (the
  kernel with ``activation=None`` and a float32 output) and torch's own activation is differentiated
  there (relu, silu, tanh-GELU; SwiGLU / GeGLU on the [gate; up] columns), in float32;
* ``dx = (d pre * scale_w) @ W`` with W decompressed to float32 (on the GPU by the decompress kernel,
  ``decompress_gpu``; on the CPU by the host's ``decompress``), a dense GEMM: correct, not fast
  (training a sparse weight: ``SemiSparseLinear``, docs/training.md);
* ``d bias = Σ_tokens d pre``;
* e4m3: x is quantized per token in the forward (or with the layer's static ``input_scale``); its
  gradient is the straight-through one (the quantization is taken as the identity, as fp8 training
  recipes do; a static scale's saturation at ±448 too), so ``dx = d pre @ (W * scale_w)``.
  Traced (torch.compile, torch.export, make_fx), an e4m3 layer whose x requires grad runs the op
  ``sparsile::sparse_linear_e4m3`` (the quantizer and ``sparse_linear`` in one, on the 16-bit x),
  whose formula is this one (:func:`input_grads`): the compiled gradient is the eager one. (The
  two ops apart would give the fp8 x a gradient in fp8: SP0922.)

Gradients of values, meta, scale_w and scale_x are refused when asked for (SP0922), never left
silently at zero: the weight is frozen; ``sparsify_(model, trainable=True)`` trains it.

Second derivatives (``create_graph=True``, then a backward through x's gradient): exact without an
activation (dx is linear in dy). With one, d pre is taken from detached pre-activations, so dx and
d bias would miss their dependence on x, dy and the bias: they are refused instead (SP0922, when
the second backward reaches them), never silently wrong; across nested torch.func levels too (an
outer level's variable, which reads ``requires_grad`` False in an inner level's backward, counts:
``refuse_second_derivative(..., wrapped_live=True)``; before, a jacrev in the bias of a grad in x
gave a zero block).

torch.func (``grad``, ``vjp``, ``jacrev``, ``vmap`` of them): a layer's call goes through
:class:`TransformedLayerWithInputGrad`, whose backward is the eager one; the activation's
derivative by ``torch.func.vjp`` there (torch.func refuses ``requires_grad_`` inside its
transforms). The ops called directly have Autograd kernels of their own (:func:`autograd_kernel`,
:class:`OpWithInputGrad`: a node per transform level, as torch's own operators), so they work under
the transforms too; before, their formula was ``torch.library.register_autograd``'s, an
``autograd.Function`` without ``setup_context``, which torch.func refuses (torch's RuntimeError at
the call). Forward mode (``jvp``, ``jacfwd``, a dual x of ``torch.autograd.forward_ad``) is refused
(SP0922), the ops' included (before, they returned y without a tangent).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.functional as F
from torch._C._functorch import is_functorch_wrapped_tensor
from torch._dynamo import compiled_autograd
from torch._functorch.utils import enable_single_level_autograd_function
from torch.autograd.forward_ad import _set_fwd_grad_enabled

from ..errors import SP_FROZEN_WEIGHT, IntegrationError
from .dynamo_frames import skip_frames
from .refused_grad import Refusal, refused_like, traced_backward
from .saved_inputs import save_inputs, saved_inputs, shapes_only
from .weight import NAME_OF, host_dense
from .weight_versions import check_unwritten, weight_versions

_ACTIVATIONS: dict[str, Any] = {
    "relu": F.relu,
    "silu": F.silu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "swiglu": lambda t: F.silu(t[:, :t.shape[1] // 2]) * t[:, t.shape[1] // 2:],
    "geglu": lambda t: F.gelu(t[:, :t.shape[1] // 2], approximate="tanh") * t[:, t.shape[1] // 2:],
}


def dense_weight(values: torch.Tensor, meta: torch.Tensor, k: int) -> torch.Tensor:
    """W (N, k) in float32 on values' device, decompressed from values and "sm90" words (k: x's K,
    at most the K the values cover). Through the custom op ``sparsile::dense_weight``, so that a
    backward traced by torch.compile / AOTAutograd sees one opaque node (its fake gives the shape)
    instead of reading fake tensors' memory (before, the compiled backward of a call whose x
    requires grad stopped at SP0804, "cannot read meta of type FunctionalTensor on the host")."""
    return torch.ops.sparsile.dense_weight(values.detach(), meta.detach(), k)


@torch.library.custom_op("sparsile::dense_weight", mutates_args=())
def _dense_weight(values: torch.Tensor, meta: torch.Tensor, k: int) -> torch.Tensor:
    n = int(values.shape[0])
    if values.is_cuda:
        from ...stdlib.kernels.sparsity_gpu import decompress_gpu

        dense = decompress_gpu(values, meta, "sm90", NAME_OF[values.dtype], m=n, k=k)
        return dense.float()
    host = host_dense(values, meta, n, 2 * int(values.shape[1]))
    return torch.from_numpy(np.ascontiguousarray(host[:, :k], dtype=np.float32))


@_dense_weight.register_fake
def _dense_weight_fake(values: torch.Tensor, meta: torch.Tensor, k: int) -> torch.Tensor:
    return values.new_empty((values.shape[0], k), dtype=torch.float32)


class _RefusedSecondDerivative(torch.autograd.Function):
    """The identity on a gradient computed under ``create_graph=True`` whose graph would be wrong:
    differentiating it again raises the stored diagnostic (in reverse mode, and in forward mode: a
    ``torch.func.jacfwd`` of a ``jacrev``). Written with ``setup_context`` and a generated vmap rule,
    so that it runs under torch.func's transforms: their backward always has ``create_graph=True``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(refusal: Refusal, grad: torch.Tensor, *anchors: torch.Tensor) -> torch.Tensor:
        return grad.view_as(grad)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.refusal = inputs[0]
        ctx.like = tuple((t.shape, t.dtype) for t in inputs[1:])  # (what a traced backward's refusals look like)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        if traced_backward(grads[0]):  # AOTAutograd traces it ahead: the refusal in the graph (refused_grad.py)
            return (None, *refused_like(ctx.refusal, grads[0], ctx.like))
        raise ctx.refusal.error()

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise ctx.refusal.error()


def refuse_second_derivative(grad: torch.Tensor | None, anchors: tuple[Any, ...],
                             refusal: Refusal, *, wrapped_live: bool = False) -> torch.Tensor | None:
    """``grad`` itself, or, when a backward runs with ``create_graph=True`` (grad mode on) and
    ``grad`` or one of ``anchors`` (the tensors it truly depends on) requires grad, ``grad`` on a
    node whose backward raises ``refusal``'s diagnostic: a second derivative through it is an error, never a
    gradient that silently misses terms. ``wrapped_live``: an anchor wrapped by a torch.func
    transform counts as requiring grad (an outer level's GradTrackingTensor reads
    ``requires_grad`` False inside an inner level's backward, yet the outer level differentiates it)."""
    if grad is None or not torch.is_grad_enabled():
        return grad
    live = [a for a in anchors if isinstance(a, torch.Tensor)
            and (a.requires_grad or (wrapped_live and is_functorch_wrapped_tensor(a)))]
    if not live and not grad.requires_grad:
        return grad
    return _RefusedSecondDerivative.apply(refusal, grad, *live)


def frozen(what: str) -> IntegrationError:
    return IntegrationError(SP_FROZEN_WEIGHT, f"sparse_linear has no gradient for {what}: the sparse weight is "
                            "frozen (an inference layer)",
                            help="train x's producers through it, or make the layer trainable: "
                                 "sparsify_(model, trainable=True) swaps in SemiSparseLinear (docs/training.md)")


_ACTIVATION_BACKWARD: dict[str, Any] = {
    "relu": lambda d, t: torch.ops.aten.threshold_backward(d, F.relu(t), 0),
    "silu": torch.ops.aten.silu_backward,
    "gelu_tanh": lambda d, t: torch.ops.aten.gelu_backward(d, t, approximate="tanh"),
}
"""d act(t) for the incoming gradient d: the aten kernels torch's autograd runs for each activation."""


def _activation_vjp(activation: str, pre: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """d pre of :data:`_ACTIVATIONS` [activation] at the float32 ``pre`` for dy, by the aten backward
    kernels torch's autograd computes it with (the same numbers): what compiled autograd's dynamo trace
    takes, which stops at ``torch.autograd.grad`` (a graph break, an error with ``fullgraph=True``).
    The gated ones (swiglu, geglu: act(g) * u for pre = [g, u]) as the product's and the slices' backward."""
    if activation in _ACTIVATION_BACKWARD:
        return _ACTIVATION_BACKWARD[activation](dy, pre)
    f = pre.shape[1] // 2
    gate, up = pre[:, :f], pre[:, f:]
    act = "silu" if activation == "swiglu" else "gelu_tanh"
    return torch.cat([_ACTIVATION_BACKWARD[act](dy * up, gate), dy * _ACTIVATIONS[act](gate)], dim=1)


def pre_activation_grad(dy: torch.Tensor, pre: torch.Tensor | None, activation: str | None) -> torch.Tensor:
    """d pre (T, N) in float32 from dy (T, N or F) and the float32 pre-activations (None: dy)."""
    dy = dy.float()
    if activation is None:
        return dy
    if compiled_autograd.in_compiled_autograd_region:  # (dynamo traces no torch.autograd.grad: fullgraph stopped)
        return _activation_vjp(activation, pre.detach().float(), dy)
    if torch._C._are_functorch_transforms_active():  # (torch.func refuses requires_grad_ inside its transforms)
        _, vjp = torch.func.vjp(_ACTIVATIONS[activation], pre.detach().float())
        return vjp(dy)[0]
    with torch.enable_grad():
        p = pre.detach().float().requires_grad_(True)
        (grad,) = torch.autograd.grad(_ACTIVATIONS[activation](p), p, dy)
    return grad


def input_grads(dy: torch.Tensor, x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor,
                bias: torch.Tensor | None, scale_w: torch.Tensor | None, activation: str | None,
                pre: Any, want_x: bool, want_bias: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dx in x's dtype and shape or None, d bias in bias's dtype or None) for dy (..., N out);
    ``pre()`` gives the float32 pre-activations (T, N), called only with an activation."""
    k = x.shape[-1]
    tokens = math.prod(x.shape[:-1])
    dy2 = dy.reshape(tokens, dy.shape[-1])
    d_pre = pre_activation_grad(dy2, pre() if activation is not None else None, activation)
    dx = db = None
    if want_x:
        scaled = d_pre if scale_w is None else d_pre * scale_w.detach().float().reshape(1, -1)
        dx = (scaled @ dense_weight(values, meta, k)).to(x.dtype).reshape(x.shape)
    if want_bias and bias is not None:
        db = d_pre.sum(0).to(bias.dtype).reshape(bias.shape)
    if activation is not None and torch.is_grad_enabled():  # d pre from detached pre-activations: no 2nd derivative
        refusal = Refusal(SP_FROZEN_WEIGHT, f"sparse_linear has no second derivative with activation "
                          f"{activation!r}: x's gradient is computed from detached pre-activations",
                          help="differentiate twice through a layer without a fused activation (apply "
                               "it after the layer), or through the dense weight")
        # (wrapped_live: under nested torch.func levels the outer level's variable, a bias or the x and
        # dy it feeds, reads requires_grad False in the inner level's backward: left out, jacrev of
        # grad across them gave a zero block)
        dx, db = (refuse_second_derivative(g, (x, dy, bias), refusal, wrapped_live=True) for g in (dx, db))
    return dx, db


# ------------------------------------------------------------------------------------------------
# the op: torch.ops.sparsile.sparse_linear


def _setup_context(ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any) -> None:
    x, values, meta, bias, scale_x, scale_w = (list(inputs) + [None] * 6)[:6]
    save_inputs(ctx, keyword_only_inputs.get("activation"), x, bias, (values, meta, scale_w), scale_x)


def _backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    needs = tuple(ctx.needs_input_grad) + (False,) * 6
    if ctx.x_dtype == torch.float8_e4m3fn and (needs[0] or needs[4]):  # (x and scale_x from the quantizer)
        raise IntegrationError(SP_FROZEN_WEIGHT, "sparse_linear has no gradient for an fp8 x (it would be fp8 too, "
                               "3 mantissa bits): an e4m3 SparseLinear, eager or traced, passes its 16-bit x's "
                               "gradient straight through the quantizer",
                               help="call torch.ops.sparsile.sparse_linear_e4m3(x, values, meta, bias, scale_w) on "
                                    "the 16-bit x instead of quantize_per_token_e4m3 then sparse_linear; a graph "
                                    "traced by make_fx or torch.jit.trace with an x that did not require grad holds "
                                    "those two ops: trace it with an x that requires grad (torch.export and "
                                    "torch.compile need nothing)")
    for index, what in ((1, "values"), (2, "meta"), (4, "scale_x"), (5, "scale_w")):
        if needs[index]:
            raise frozen(what)
    x, bias, scale_x, values, meta, scale_w = saved_inputs(ctx)
    activation = ctx.activation

    def pre() -> torch.Tensor:
        return torch.ops.sparsile.sparse_linear(x.detach(), values, meta, bias, scale_x, scale_w,
                                                out_dtype=torch.float32).reshape(-1, values.shape[0])

    dx, db = input_grads(dy, x, values, meta, bias, scale_w, activation, pre, needs[0], needs[3])
    return dx, None, None, db, None, None


# ------------------------------------------------------------------------------------------------
# the op: torch.ops.sparsile.sparse_linear_e4m3 (x quantized inside, its gradient straight through)


def _setup_context_e4m3(ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any) -> None:
    x, values, meta, bias, scale_w, scale_x = [*inputs, None][:6]
    save_inputs(ctx, keyword_only_inputs.get("activation"), x, bias, (values, meta, scale_w), scale_x)


def _backward_e4m3(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """The straight-through gradient of ``sparse_linear_e4m3``: :func:`input_grads` with the
    un-quantized x (dx in its dtype) and the pre-activations of the quantized one, as
    :class:`LayerWithInputGrad`'s backward computes an eager e4m3 layer's (a traced layer whose x
    requires grad runs this op: torch.compile's gradient is the eager one). Without an activation x,
    the bias and a static scale_x are not saved (saved_inputs.py): the straight-through dx does not
    read them."""
    needs = (*ctx.needs_input_grad, False)
    for index, what in ((1, "values"), (2, "meta"), (4, "scale_w"), (5, "scale_x (a static input scale)")):
        if needs[index]:
            raise frozen(what)
    x, bias, scale_x, values, meta, scale_w = saved_inputs(ctx)

    def pre() -> torch.Tensor:
        return torch.ops.sparsile.sparse_linear_e4m3(x.detach(), values, meta, bias, scale_w, scale_x,
                                                     out_dtype=torch.float32).reshape(-1, values.shape[0])

    dx, db = input_grads(dy, x, values, meta, bias, scale_w, ctx.activation, pre, needs[0], needs[3])
    return dx, None, None, db, None, None


# ------------------------------------------------------------------------------------------------
# the layer: SparseLinear with an x that requires grad


class LayerWithInputGrad(torch.autograd.Function):
    """y = layer(x) through the layer's eager forward (inside an ``autograd.Function`` grad mode is
    off, so it takes its usual launch path), with x's gradient (and a trainable bias's); e4m3 layers
    quantize x inside, straight through for the gradient. ``values``, ``meta``, ``scale_w``: the
    layer's frozen weight, inputs so that y requires grad where one of them does (x and the bias
    not), and the backward refuses their gradient (SP0922) instead of leaving it out. The backward
    computes with the tensors the call was given (``ctx.weight``, not saved: a saved-tensor hook,
    CPU offload or checkpointing, would copy the whole weight per call), not the layer's attributes
    at backward time (``torch.func.functional_call`` swaps them back when the forward returns), and
    differentiates the activation the forward applied (``ctx.activation``: the layer's, set anew
    between forward and backward, gave x the gradient of another function). x and the bias are saved
    only with an activation (without one, their shapes and dtypes: :class:`.saved_inputs.Like`). Not saved, the weight's
    tensors have their version counters checked instead (:func:`weight_versions`): one written in
    place between the forward and the backward is torch's RuntimeError, as for ``nn.Linear``'s saved
    weight (before, x got the gradient of the new weight without a word)."""

    @staticmethod
    def forward(x: torch.Tensor, bias: torch.Tensor | None, layer: Any, values: torch.Tensor, meta: torch.Tensor,
                scale_w: torch.Tensor | None) -> torch.Tensor:
        return layer._forward_eager(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, bias, layer, values, meta, scale_w = inputs
        ctx.layer, ctx.activation = layer, layer.activation
        ctx.weight = values, meta, scale_w
        ctx.versions = weight_versions(ctx.weight)
        if ctx.activation is None:  # dx = dy @ W, d bias = Σ dy: neither x's nor the bias's values (as nn.Linear's
            # with a frozen weight: x and the bias may be written in place after the call, x is not kept alive)
            ctx.like = shapes_only(x, bias)
            ctx.save_for_backward()
        else:  # (the pre-activations are computed again from x and the bias)
            ctx.save_for_backward(x, bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        like = getattr(ctx, "like", None)  # (TransformedLayerWithInputGrad saves x and the bias)
        x, bias, *weight = ctx.saved_tensors if like is None else (*like, *ctx.saved_tensors)
        if not weight:  # (TransformedLayerWithInputGrad saves them: torch checks their versions)
            check_unwritten(ctx.layer, ctx.weight, ctx.versions)
        values, meta, scale_w = weight or ctx.weight
        needs = ctx.needs_input_grad
        for index, what in ((3, "values"), (4, "meta"), (5, "scale_w")):
            if needs[index]:
                raise frozen(what)
        layer = ctx.layer

        def pre() -> torch.Tensor:
            with torch.no_grad():
                return layer._forward_op(x.detach(), pre=True, weight=(values, meta, bias, scale_w))

        dx, db = input_grads(dy, x, values, meta, bias, scale_w, ctx.activation, pre, needs[0], needs[1])
        return dx, db, None, None, None, None

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise IntegrationError(SP_FROZEN_WEIGHT, "sparse_linear has no forward-mode derivative (torch.func.jvp, "
                               "jacfwd, hessian; torch.autograd.forward_ad): only x's reverse-mode gradient is "
                               "implemented", help="use reverse mode: torch.func.grad, vjp or jacrev, or backward()")


class TransformedLayerWithInputGrad(LayerWithInputGrad):
    """:class:`LayerWithInputGrad` under torch.func's transforms (grad, vjp, jacrev, vmap of them):
    their x is a GradTrackingTensor or a BatchedTensor whose memory the eager launch cannot read,
    so the forward runs the custom ops with the tensors it was given (unwrapped by the transform:
    those ``torch.func.functional_call`` put in, too); the backward is the eager one (torch
    operations and the custom ops work under the transforms; the activation's derivative by
    ``torch.func.vjp``, :func:`pre_activation_grad`).
    ``generate_vmap_rule``: vmap runs forward, setup_context and backward per batch (the custom ops
    by torch's loop over the batch); every tensor saved, for vmap's batch dimensions."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, bias: torch.Tensor | None, layer: Any, values: torch.Tensor, meta: torch.Tensor,
                scale_w: torch.Tensor | None) -> torch.Tensor:
        return layer._forward_op(x, weight=(values, meta, bias, scale_w))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, bias, layer, values, meta, scale_w = inputs
        ctx.layer, ctx.activation = layer, layer.activation
        ctx.save_for_backward(x, bias, values, meta, scale_w)  # (vmap keeps a batched tensor's dimension)


def func_transformed() -> bool:
    """torch.func's transforms are on (grad, vjp, jacrev, vmap, ...) and nothing traces the call
    (torch.compile first: dynamo evaluates it to True; a dispatch mode, torch.jit.trace): then a
    layer's call goes through :class:`TransformedLayerWithInputGrad` (written before the ops had
    Autograd kernels that torch.func supports, :class:`OpWithInputGrad`; it runs the eager layer's
    backward)."""
    return (not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active()
            and torch._C._len_torch_dispatch_stack() == 0 and torch._C._get_tracing_state() is None)


def needs_autograd(x: torch.Tensor, buffers: dict[str, Any]) -> bool:
    """A call must go through :class:`LayerWithInputGrad`: grad mode is on and x or one of the
    layer's ``buffers`` (values, meta, bias, scale_w, a static input_scale by name,
    ``linear.tensors_of``: buffers or parameters) requires grad (an input_scale that does takes the
    custom op instead, whose backward refuses its gradient: SparseLinear._forward_eager). (Before,
    only x was looked at: a trainable bias fed an x without grad, the first layer's, silently got no
    gradient, and a values tensor made to require grad no SP0922.) Or x is a dual tensor of
    ``torch.autograd.forward_ad`` (grad mode or not): its ``jvp``
    refuses forward mode (SP0922); a direct launch would return y without a tangent, the directional
    derivative silently dropped."""
    # (unrolled, no generator: on every eager call with grad mode on, 0.65 µs against 1.6 µs for any();
    # meta is integer, which torch never lets require grad)
    return (torch.is_grad_enabled() and (
        x.requires_grad or buffers["values"].requires_grad
        or ((t := buffers["bias"]) is not None and t.requires_grad)
        or ((t := buffers["scale_w"]) is not None and t.requires_grad)
        or ((t := buffers.get("input_scale")) is not None and t.requires_grad))) or (
        _fwad._current_level >= 0 and _fwad.unpack_dual(x).tangent is not None)


def _no_quantizer_grad(ctx: Any, d_xq: torch.Tensor, d_scale: torch.Tensor) -> tuple[torch.Tensor | None]:
    raise frozen("x through quantize_per_token_e4m3 (an fp8 x): SparseLinear passes x's gradient straight "
                 "through its quantizer by the op sparse_linear_e4m3, which takes the 16-bit x")


def _op_with_input_grad(setup_context: Any, backward: Any) -> type:
    """The autograd formula of a sparse linear op, from its own ``setup_context`` and ``backward``
    (:func:`_setup_context` / :func:`_backward`, or their e4m3 twins); ``apply`` takes the op's
    tensors, ``activation``, ``out_dtype``, then the redispatch.

    The formula as the op's Autograd kernel applies it (:func:`autograd_kernel`): a node on x's autograd
    graph at the level where the kernel runs, the forward the kernel below autograd (``redispatch``, the
    last input). That is how torch's own operators work under torch.func's grad transforms (``grad``,
    ``vjp``, ``jacrev``): the kernel runs once per transform level, on that level's GradTrackingTensors, and
    the redispatch unwraps them for the level below; a vmap level runs the op's vmap rule (vmap_rules.py)
    before autograd. A ``_SingleLevelFunction``, the base of ``autograd.Function`` without its torch.func
    routing (which would send the call to the transforms above, already handled, and fails inside a kernel:
    "could not find kernel for HigherOrderOperator custom_function_call at dispatch key AutogradCPU").
    ``torch.library.register_autograd`` applies an ``autograd.Function`` without ``setup_context``, which
    torch.func refuses: before, the op called directly under ``torch.func.grad`` stopped at torch's
    RuntimeError."""

    class Formula(torch.autograd.function._SingleLevelFunction):
        @staticmethod
        def forward(*args: Any) -> torch.Tensor:
            *tensors, _activation, _out_dtype, redispatch = args
            return redispatch(*tensors)

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            *tensors, activation, _, _ = inputs
            setup_context(ctx, tuple(tensors), {"activation": activation}, output)

        @staticmethod
        @skip_frames  # (see below)
        def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            return (*backward(ctx, dy), None, None, None)

        jvp = LayerWithInputGrad.jvp  # forward mode: SP0922
        # (compiled autograd, torch._dynamo.compiled_autograd, keys a node's backward by its class's
        # _compiled_autograd_key, which autograd.Function has and a _SingleLevelFunction has not: before, any
        # backward through the op under compiled autograd stopped at torch's AttributeError)
        _compiled_autograd_key = staticmethod(torch.autograd.Function._compiled_autograd_key)

    # backward, never a frame of dynamo's own (dynamo_frames.skip_frames): run by autograd's engine inside a
    # torch.compile'd function with a graph break, its frame was handed to dynamo, which gave up at
    # ctx.saved_tensors ("WON'T CONVERT", the frame then run eagerly) while x was saved first; with x not saved (an
    # op without activation: saved_inputs.py) dynamo's conversion of a weight made to require grad by
    # torch.func.grad stopped at its own AssertionError ("False != True") instead of our SP0922. AOTAutograd's
    # traces of the backward do not go through dynamo's frames. Compiled autograd (torch._dynamo.compiled_autograd)
    # inlines it into the compiled backward graph: traced there (torch.compiler.disable, as it was, made it a graph
    # break, which stopped a fullgraph=True compiled backward at "Skip calling `torch.compiler.disable()`d function").
    return Formula


OpWithInputGrad = _op_with_input_grad(_setup_context, _backward)
"""The Autograd formula of ``sparsile::sparse_linear`` (:func:`_backward`; :func:`_op_with_input_grad`)."""
E4m3OpWithInputGrad = _op_with_input_grad(_setup_context_e4m3, _backward_e4m3)
"""OpWithInputGrad of ``sparsile::sparse_linear_e4m3`` (x's straight-through gradient, :func:`_backward_e4m3`)."""


def _has_tangent(args: tuple[Any, ...]) -> bool:
    """A tensor in ``args`` carries a forward-mode tangent (``torch.autograd.forward_ad``, or
    ``torch.func.jvp``'s dual tensors), forward-mode AD being on."""
    return _fwad._current_level >= 0 and torch._C._is_fwd_grad_enabled() and any(
        isinstance(a, torch.Tensor) and _fwad.unpack_dual(a).tangent is not None for a in args)


def autograd_kernel(name: str, function: Any, positional: int, keywords: tuple[str, ...] = ()) -> Any:
    """The Autograd kernel of ``sparsile::<name>``: through ``function`` where grad mode is on and a
    tensor argument requires grad (a GradTrackingTensor of torch.func's too), or one carries a
    forward-mode tangent (whose ``jvp`` refuses it, SP0922: before, the op returned y without a
    tangent, the directional derivative silently dropped); else straight to the kernel below
    autograd, as ``torch.library.register_autograd``'s kernel does. ``function.apply`` takes the
    schema's ``positional`` arguments (the dispatcher may leave trailing defaults out: None), the
    values of its keyword-only ``keywords``, then the redispatch."""
    op = getattr(torch.ops.sparsile, name).default

    def below(keyset: Any, tensors: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *tensors, **kwargs)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        grad_mode = torch.is_grad_enabled()
        if not ((grad_mode and torch._C._any_requires_grad(*args)) or _has_tangent(args)):
            return below(keyset, args, kwargs)
        fwd_mode = torch._C._is_fwd_grad_enabled()

        def redispatch(*tensors: Any) -> Any:
            # in the grad and forward-grad modes of the call, which apply turns off for the forward: a
            # torch.func transform below this one (grad of grad, jacfwd of jacrev) records the op only
            # with them on, as torch's single-level functions do (torch._functorch.autograd_function);
            # on this level the autograd keys stay excluded
            with torch.set_grad_enabled(grad_mode), _set_fwd_grad_enabled(fwd_mode):
                return below(keyset, tensors, kwargs)

        with enable_single_level_autograd_function():  # (allowed under torch.func's transforms)
            return function.apply(*args, *(None,) * (positional - len(args)), *(kwargs.get(k) for k in keywords),
                                  redispatch)

    return kernel


class _QuantizerGradRefused(torch.autograd.function._SingleLevelFunction):
    """``sparsile::quantize_per_token_e4m3``'s formula: its gradient is refused (SP0922) when a
    backward reaches it, under torch.func's transforms too (before, ``torch.func.grad`` stopped at
    torch's RuntimeError at the call)."""

    @staticmethod
    def forward(x: torch.Tensor, redispatch: Any) -> Any:
        return redispatch(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, d_xq: torch.Tensor, d_scale: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        return _no_quantizer_grad(ctx, d_xq, d_scale), None

    jvp = LayerWithInputGrad.jvp
    _compiled_autograd_key = staticmethod(torch.autograd.Function._compiled_autograd_key)  # (see Formula's)


def register(library: Any) -> None:
    """Give ``sparsile::sparse_linear`` and ``sparsile::sparse_linear_e4m3`` (defined in ``library``)
    their autograd formulas, as Autograd kernels that torch.func supports (:class:`OpWithInputGrad`),
    and the fp8 quantizer one that refuses to be differentiated (its fp8 output has no useful
    gradient)."""
    keywords = ("activation", "out_dtype")
    library.impl("sparse_linear", autograd_kernel("sparse_linear", OpWithInputGrad, 6, keywords), "Autograd",
                 with_keyset=True)
    library.impl("sparse_linear_e4m3", autograd_kernel("sparse_linear_e4m3", E4m3OpWithInputGrad, 6, keywords),
                 "Autograd", with_keyset=True)
    library.impl("quantize_per_token_e4m3", autograd_kernel("quantize_per_token_e4m3", _QuantizerGradRefused, 1),
                 "Autograd", with_keyset=True)
