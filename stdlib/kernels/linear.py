"""``sparse_linear``: a 2:4 sparse linear layer, ``y = act(x @ W.T * scale_w * scale_x + bias)``,
on the Hopper sparse GEMM of ``sparse_gemm_sm90.spk`` with its epilogue fused.

    y (T x N_out, row-major) = act((x (T x K) @ decompress(values, meta).T) * scale_w[n] * scale_x[t] + bias[n])

On Blackwell targets (sm_100a, sm_103a, sm_110a) the persistent kernel of
``sparse_gemm_sm100_persistent.spk`` runs the same epilogue (:mod:`.linear_sm100`).

``values`` (N_out, K/2) and ``meta`` (its "sm90" metadata) are the weight as
:func:`~.compress_weight.prune_and_compress` returns it; the kernel computes ``W @ x.T`` with the weight as the
sparse A operand, and its epilogue scales, adds the bias, applies the activation and stores the
transposed tile straight into ``y`` in the output element type (the ``sparse_linear_<t>`` kernels:
docs/hopper.md describes the pipeline they share with ``sparse_gemm_<t>``). The semantics are those
of vLLM's ``cutlass_scaled_sparse_mm(a, bt_nzs, bt_meta, scale_a, scale_b, out_dtype, bias)``.

:func:`plan_sparse_linear` checks everything once and returns a
:class:`~.linear_plan.SparseLinearPlan` (``linear_plan.py``): the kernel launches as plain data
(``plan.launches()``), ready to run, to compile, or to rebind to a new ``x`` and ``out`` of the same
shape without any re-validation (``plan.rebind``). Split-K (few tiles
for the GPU) writes f32 partial sums, and ``splitk_reduce_linear`` applies the epilogue while adding
them. :func:`quantize_per_token_e4m3` quantizes activations for the e4m3 path.

Checks besides those of :func:`~.gemm.sparse_matmul` (each a SparsityError): SP0850 an unknown
activation or output dtype, SP0851 a bias or scale of the wrong shape or type, SP0852 e4m3 weights
with activations that are not e4m3 (but for the decode kernel's 16-bit x without scale_x, which it
quantizes itself), SP0853 a rebind to another shape or dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..sparsity import as_host_array
from ..sparsity.dtypes import operand_type
from .arrays import (
    bad_input,
    check_i32_elements,
    check_split_k,
    check_split_workspace,
    deliver_result,
    device_ordinal,
    empty_array,
    pad_columns,
    plain_int,
    zeros_array,
)
from .gemm import choose_split_k, pair_ctas, plan_target
from .gemm import (
    gpu_sm_count as _hopper_sm_count,
)
from .gemm_choice import KERNELS, KernelChoice, check_operand_order, resolve_kernel_choice
from .gemm_operands import checked_operands, kernel_words
from .linear_args import (  # noqa: F401 (re-exported: the SP codes and spellings callers import from here)
    ACTIVATIONS,
    E4M3_X_DTYPES,
    GATED_ACTIVATIONS,
    OUT_DTYPES,
    SP_LINEAR_FP8_INPUT,
    SP_LINEAR_OPTION,
    SP_LINEAR_REBIND,
    SP_LINEAR_VECTOR,
    TILED_ACTIVATIONS,
    X16_DTYPES,
    activation_name,
    bias_or_scale,
    check_e4m3_x,
    glu_features,
    is_gated,
    linear_error,
    linear_out_dtype,
)
from .linear_plan import SparseLinearPlan, linear_output
from .plan_device import plans_on_arrays
from .quantize_e4m3 import (  # noqa: F401 (re-exported: callers import the quantizer from here)
    E4M3_MAX,
    prepare_quantize_per_token_e4m3,
    prepare_quantize_static_e4m3,
    quantize_block,
    quantize_module,
    quantize_per_token_e4m3,
    quantize_static_e4m3,
)

LINEAR_KERNELS: dict[str, KernelChoice] = {name: KERNELS[name] for name in ("f16", "bf16", "e4m3")}
"""Operand types with a ``sparse_linear_<t>`` kernel."""


@plans_on_arrays
def plan_sparse_linear(values: Any, meta: Any, x: Any, *, bias: Any = None, activation: str | None = None,
                       scale_x: Any = None, scale_w: Any = None, out_dtype: Any = None, out: Any = None,
                       interpret: bool = False, target: str | None = None, num_sms: int | None = None,
                       split_k: int | None = None, kernel: str | None = None, reduce: str | None = None,
                       pdl: bool = False, meta_format: str | None = None,
                       _quantized_in_kernel: bool = False, _feature_major: bool = False) -> SparseLinearPlan:
    """Check the arguments of :func:`sparse_linear` once and plan its launches (nothing runs):
    the Hopper kernels for sm_90a, the persistent Blackwell kernel (:mod:`.linear_sm100`, no
    split-K) for sm_100a / sm_103a / sm_110a. For T <= 64 on sm_90a the decode kernel is planned
    instead (:mod:`.decode`, a ``SparseDecodePlan`` with the same interface) unless ``kernel="gemm"``
    or SPARSILE_DECODE_KERNEL=0; ``reduce`` and ``pdl`` are the decode kernel's (``plan_sparse_decode``:
    how split-K partial sums are added; programmatic dependent launch), unused by the tiled kernels.
    e4m3 weights take e4m3 x with its ``scale_x`` (:func:`quantize_per_token_e4m3`), or, where the
    decode kernel is planned and its share of x fits in shared memory, f16 / bf16 x without
    ``scale_x``: that kernel quantizes x per token itself, one launch (:mod:`.decode`).
    ``_quantized_in_kernel`` (plan_sparse_decode's base plan): such an x is checked and kept as it
    is, uncast and unpadded, and a gated activation ("swiglu", "geglu": only the decode kernel fuses
    them, SP0860 elsewhere) is planned. ``_feature_major`` (the base plan of a feature-major decode plan, for
    sparse_matmul): ``out`` is (N_out, T); the plan is only that base, never launched itself.
    ``meta_format="sm90"``: ``meta`` is a raw array of "sm90" words whatever the target (on
    Blackwell it is re-encoded as "tcgen05" words; a raw array is otherwise read in the target's
    format)."""
    check_operand_order(values, meta, x, "sparse_linear", "x")
    split_k, num_sms = plain_int(split_k), plain_int(num_sms)  # numpy integers are integers
    tgt = plan_target(target, interpret)
    if num_sms is not None and not (isinstance(num_sms, int) and not isinstance(num_sms, bool) and num_sms >= 1):
        raise bad_input(f"num_sms must be a positive integer, got {num_sms!r}",
                        help="leave it unset for the GPU's SM count, or pass how many SMs the kernel may use")
    act = activation_name(activation)
    y_dtype = linear_out_dtype(out_dtype, x)
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise bad_input(f"x must be an array (numpy, torch or cupy), got {type(x).__name__}",
                        help="pass x as a (T, K) array, e.g. np.asarray(x, np.float16)")
    x_shape = tuple(int(s) for s in x.shape)
    x_dtype = str(x.dtype).removeprefix("torch.")
    if len(x_shape) != 2:
        raise bad_input(f"x must be a 2-D (T, K) array, got shape {x_shape}",
                        help="flatten the leading dimensions: x.reshape(-1, K), and y.reshape(*lead, N_out) after")
    from .decode import DECODE_MAX_T, MAX_SPLIT, SP_DECODE, plan_sparse_decode, reduce_mode, wants_decode

    if reduce is not None:
        reduce_mode(reduce)  # checked whichever kernel is planned
    if meta_format not in (None, "sm90"):  # checked whichever kernel is planned
        raise bad_input(f"meta_format must be None or 'sm90', got {meta_format!r}",
                        help="'sm90': raw metadata words in the sm90 format (re-encoded for Blackwell targets)")

    # an explicit split_k is honoured: by the decode kernel up to its MAX_SPLIT, else (kernel unset) by
    # the tiled kernels, which split up to 64
    beyond_decode = type(split_k) is int and split_k > MAX_SPLIT and kernel != "decode"
    if wants_decode(kernel, x_shape[0], tgt) and not beyond_decode:
        return plan_sparse_decode(values, meta, x, bias=bias, activation=activation, scale_x=scale_x,
                                  scale_w=scale_w, out_dtype=out_dtype, out=out, interpret=interpret,
                                  num_sms=num_sms, split_k=split_k, reduce=reduce, pdl=pdl)
    if tgt != "sm_90a":
        from .linear_sm100 import blackwell_operands

        check_split_k(split_k)  # the Blackwell kernel does not split K, but a bad value is not ignored

        choice, values, words, xc, m, t, k, k_padded, k_launch = blackwell_operands(values, meta, x, tgt, interpret,
                                                                                    meta_format)
    else:
        choice = resolve_kernel_choice(values, meta, None, LINEAR_KERNELS, takes_dtype=False)
        op = operand_type(choice.operand)
        # an x of another type than e4m3 for e4m3 weights is not cast: it is refused, or (16-bit x,
        # _quantized_in_kernel) quantized by the decode kernel
        keep = choice.operand == "e4m3" and x_dtype not in E4M3_X_DTYPES
        values, xc, m, t, k, k_values = checked_operands(values, x, choice, op, interpret,
                                                         cast_b=not keep, b_name="x")
        words = kernel_words(meta, values, op, m, k_values, k, interpret)
        k_padded = k_launch = -(-k_values // choice.k_align) * choice.k_align
        values = pad_columns(values, k_padded // 2)
        xc = pad_columns(xc, k if keep else k_padded)
    check_i32_elements((t, m), "y" if not _feature_major else "C", help="run it on fewer tokens at a time: blocks "
                       "of x's rows, joining the results along T")
    if choice.operand == "e4m3":
        check_e4m3_x(x_dtype, scale_x, _quantized_in_kernel and tgt == "sm_90a")
    if is_gated(act) and not _quantized_in_kernel and t > 0:  # (no tokens: an empty y, nothing launched)
        raise bad_input(f"activation {act!r} is fused by the decode kernel only (1 to {DECODE_MAX_T} tokens on "
                        f"sm_90a), not for {t} tokens" + ("" if tgt == "sm_90a" else f" on {tgt}")
                        + (f" with kernel={kernel!r}" if kernel not in (None, "auto") else ""), code=SP_DECODE,
                        help=f"pass activation=None and compute {GATED_ACTIVATIONS[act]}(y[:, :F]) * y[:, F:] of the "
                        "(T, 2F) result (sparsile.torch does this by itself)")
    features = glu_features(m, act) if is_gated(act) else m
    y = linear_output(out, t, features, y_dtype, x, interpret, _feature_major,
                      (values, words, bias, scale_w, scale_x))
    b, bias_mode = bias_or_scale(bias, "bias", m, x, interpret, ("float32", y_dtype))
    sw, sw_mode = bias_or_scale(scale_w, "scale_w", m, x, interpret, ("float32",))
    sx, sx_mode = bias_or_scale(scale_x, "scale_x", t, x, interpret, ("float32",))
    common = (m, t, k, k_padded, values, words, xc, x_shape, x_dtype, y, y_dtype, b, sw, sx, act,
              (min(bias_mode, 1), sw_mode, sx_mode))
    if tgt != "sm_90a":
        from .linear_sm100 import SparseLinearPlanSm100

        workspace = _zero_workspace(x, t, m, k_launch, interpret)
        return SparseLinearPlanSm100(choice, *common, choice.block_n(t), 1, workspace, 0, interpret, target=tgt,
                                     k_launch=k_launch, num_sms=num_sms or planned_sm_count(interpret, tgt))
    tuned = None if num_sms is not None or split_k is not None or not k_padded else \
        tuned_config(choice.operand, m, t, k, interpret, device_ordinal(x))
    bn = choice.block_n(t) if tuned is None else tuned.bn
    sms = num_sms or planned_sm_count(interpret)
    if tuned is not None:
        split = tuned.split_k
    else:
        split = split_k if split_k is not None else choose_split_k(m, t, k_padded, bn, choice, sms)
    check_split_k(split)
    split = split if k_padded else 1
    check_split_workspace(split, t, m, "fewer tokens at a time")
    workspace = _zero_workspace(x, t, m, k_padded, interpret)
    if split > 1:
        workspace = empty_array(x, (split, t, m), "float32", interpret)
    if tuned is not None:
        from .gemm import pair_grid

        pair = pair_grid(m, t, bn, sms) if tuned.pair and split == 1 else 0
        return SparseLinearPlan(choice, *common, bn, split, workspace, pair, interpret, tuned.stages, tuned.group_m)
    pair = pair_ctas(m, t, bn, choice, split, True, sms) if k_padded else 0
    return SparseLinearPlan(choice, *common, bn, split, workspace, pair, interpret, feature_major=_feature_major)


def tuned_config(operand: str, m: int, t: int, k: int, interpret: bool, ordinal: int | None = None) -> Any:
    """The shipped tuned table's choice for this kernel (``linear-<dtype>`` entries of
    stdlib/kernels/tuned/<gpu>.json, written by ``sparsile tune --linear``; docs/autotune.md) at
    (M = out features, N = T tokens, K) on CUDA device ``ordinal`` (x's,
    :func:`~.arrays.device_ordinal`; default the current GPU), or None: in the interpreter, no table
    for this GPU, no entry of this dtype, M and K, or SPARSILE_TUNED_TABLE=0. The lookup is
    ``sparse_matmul``'s (``tuning.find``: the entry with the smallest N at least T, else the
    largest), taken only when that N is below 2T (``nearby``: a config tuned at T = 256 is not
    used at T = 65, whose planned tile is half as wide). The sparse_matmul entries are not used:
    their choices did not carry over (6144 x 1024 x 4096: 86 against 73 µs with the heuristics;
    tenth session, benchmarks/RESULTS.md), the layer storing its tile transposed, with an epilogue."""
    if interpret:
        return None
    from .linear_tuning import LINEAR_PREFIX
    from .tuning import shipped_config

    return shipped_config(LINEAR_PREFIX + operand, m, t, k, nearby=True, ordinal=ordinal)


def _zero_workspace(home: Any, t: int, m: int, k: int, interpret: bool) -> Any:
    """For K = 0 (nothing to multiply; TMA boxes cannot be empty): the zero partial sums that
    splitk_reduce_linear turns into y = act(bias). None otherwise."""
    if k:
        return None
    return zeros_array(home, (1, t, m), "float32", interpret)


def planned_sm_count(interpret: bool, target: str = "sm_90a") -> int:
    """SMs the split-K and CTA-pair choices (Hopper) or the persistent grid (Blackwell) assume."""
    if target == "sm_90a":
        return _hopper_sm_count(interpret)
    from .gemm_sm100 import device_sm_count

    return device_sm_count(interpret)


def sparse_linear(values: Any, meta: Any, x: Any, *, bias: Any = None, activation: str | None = None,
                  scale_x: Any = None, scale_w: Any = None, out_dtype: Any = None, out: Any = None,
                  interpret: bool = False, target: str | None = None, num_sms: int | None = None,
                  split_k: int | None = None, kernel: str | None = None) -> Any:
    """``act((x @ W.T) * scale_w * scale_x + bias)`` for the pruned weight ``W = decompress(values,
    meta)`` (N_out, K): y of shape (T, N_out), row-major, in ``out_dtype`` (default x's dtype for
    f16/bf16/f32 x, bfloat16 for e4m3 x), written into ``out`` when given.

    x: (T, K) of any strides (made contiguous; cast to the weight's type, except that e4m3 weights
    need e4m3 x with its scale_x, SP0852, or, on the decode kernel, an f16 / bf16 x without
    scale_x, which it quantizes per token itself: one launch). bias: (N_out,) f32 or out_dtype.
    activation: None, "relu", "silu", "gelu_tanh", or a gated one, "swiglu" or "geglu" (where the
    decode kernel is planned: the weight's rows are gate rows then up rows, y (T, N_out / 2) =
    silu(gate) * up, or gelu_tanh(gate) * up; bias and
    scale_w cover every row; docs/hopper.md). scale_w: a number, a 0-d / (1,) array, or
    (N_out,) f32; scale_x: a number, 0-d / (1,), or (T,) / (T, 1) f32. numpy arrays and torch CPU
    tensors run in the interpreter (``interpret=True``); CUDA tensors are used in place on the
    current torch stream. ``target``, ``split_k`` (Hopper only) and ``num_sms`` as for
    :func:`~.gemm.sparse_matmul`; ``kernel``: None / "auto" (the decode kernel for T <= 64 on
    sm_90a unless SPARSILE_DECODE_KERNEL=0, the tiled kernels otherwise), "gemm" (the tiled
    kernels), or "decode" (:mod:`.decode`).
    """
    if not interpret:
        from ...backend import runtime
        from ...frontend.diagnostics import LaunchError

        if not runtime.has_gpu():
            raise LaunchError("SP0731", "sparse_linear cannot run: no NVIDIA GPU is available",
                              help="pass interpret=True to run the same kernel in the CPU interpreter")
    plan = plan_sparse_linear(values, meta, x, bias=bias, activation=activation, scale_x=scale_x,
                              scale_w=scale_w, out_dtype=out_dtype, out=out, interpret=interpret, target=target,
                              num_sms=num_sms, split_k=split_k, kernel=kernel)
    plan.run(interpret)
    return deliver_result(plan.out, out, x)


def reference_linear(weight_dense: Any, x: Any, bias: Any = None, activation: str | None = None,
                     scale_x: Any = None, scale_w: Any = None) -> np.ndarray:
    """The float64 result sparse_linear approximates, on the host (for tests and checks)."""
    w = as_host_array(weight_dense, "weight").astype(np.float64)
    y = as_host_array(x, "x").astype(np.float64) @ w.T
    if scale_w is not None:
        y = y * np.asarray(as_host_array(scale_w, "scale_w") if not isinstance(scale_w, (int, float))
                           else scale_w, np.float64).reshape(1, -1)
    if scale_x is not None:
        y = y * np.asarray(as_host_array(scale_x, "scale_x") if not isinstance(scale_x, (int, float))
                           else scale_x, np.float64).reshape(-1, 1)
    if bias is not None:
        y = y + as_host_array(bias, "bias").astype(np.float64).reshape(1, -1)
    act = activation_name(activation)
    if is_gated(act):  # gate rows, then up rows
        f = glu_features(y.shape[1], act)
        return reference_activation(y[:, :f], GATED_ACTIVATIONS[act]) * y[:, f:]
    return reference_activation(y, act)


def reference_activation(y: np.ndarray, act: str) -> np.ndarray:
    """One of :data:`TILED_ACTIVATIONS` of the float64 ``y``."""
    if act == "relu":
        return np.maximum(y, 0.0)
    if act == "silu":  # y sigmoid(y), with sigmoid(y) = (1 + tanh(y / 2)) / 2: no overflow for large |y|
        return y * 0.5 * (1.0 + np.tanh(0.5 * y))
    if act == "gelu_tanh":
        return 0.5 * y * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (y + 0.044715 * y ** 3)))
    return y
