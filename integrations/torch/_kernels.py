"""How ``sparsile.torch`` runs the fused sparse linear kernel (``stdlib/kernels/linear.py``).

Two paths, one kernel:

* **CUDA tensors, eager**: a :class:`LaunchRecord` per (tokens T, x dtype, device, output dtype) —
  and per stream (and per CUDA-graph capture: capture_keys.py) when the plan owns a split-K
  workspace or the record quantizes x into buffers of its own. It is built once: ``plan_sparse_linear``
  with the weight's values, metadata, bias and scales bound, then each launch of the plan prepared
  (``kernel[grid].prepare(...)``). A call only allocates y (``torch.empty_like``) and calls the prepared
  launches with the new x, y (and per-token scale) on torch's current stream (from native code,
  the split-K reduction's second launch included, unless ``SPARSILE_TORCH_NATIVE=0``: ``native.py``).
  Without ``prepare``
  it falls back to ``plan.rebind(x, y).run(stream=...)``. Where the decode kernel splits K (up to
  16 tokens) an eager call launches its one-launch variant (the partial sums added in the kernel)
  and a call captured into a CUDA graph the two-launch plan (:data:`EAGER_REDUCE_MAX_T`). An eager
  e4m3 call of few tokens (:func:`quantizes_in_kernel`) launches the decode kernel that quantizes x
  itself, a captured one the quantizer and the GEMM.
* **CPU tensors**: the same kernel in sparsile's interpreter (``interpret=True``): exact, slow.

Everything here takes 2-D, contiguous x already in the kernel's operand type; the module and the
custom op (``linear.py``, ``ops.py``) shape and check the arguments.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ...stdlib.kernels.decode import DECODE_MAX_T, DECODE_REDUCE_ENV, wants_decode
from ...stdlib.kernels.linear_args import GATED_ACTIVATIONS
from ...stdlib.sparsity.errors import SparsityError
from .graph_pools import outside_graph_pools, planned_buffers, used_on
from .native import native_launch, report_failure
from .noted_streams import lasting
from .quantize import quantize_per_token, quantize_with_scale
from .stream_waits import wait_for_streams
from .weight import Weight, same_bytes, same_memory, storage_key, tracked_tensors, weight_versions

OUT_DTYPES: dict[torch.dtype, str] = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
"""The output dtypes the kernel's epilogue stores, by the name the kernel API takes."""
ACTIVATIONS = (None, "relu", "silu", "gelu_tanh")
"""The activations a :class:`~.linear.SparseLinear` applies to its own outputs."""
OP_ACTIVATIONS = (*ACTIVATIONS, *GATED_ACTIVATIONS)
"""The activations ``torch.ops.sparsile.sparse_linear`` takes: a layer's own, and the gated ones
(``GATED_ACTIVATIONS`` of stdlib/kernels/linear_args.py, name -> gate activation):
y (T, F) = act(z[:, :F]) * z[:, F:] for the 2F pre-activations z of the row-concatenated [gate; up]
weight, act silu for "swiglu", gelu_tanh for "geglu" (docs/torch.md, "Fusing the gated activation
(SwiGLU, GeGLU)")."""
TORCH_GATES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch.nn.functional.silu,
    "gelu_tanh": functools.partial(torch.nn.functional.gelu, approximate="tanh"),
}
"""The torch function of each gate activation of ``GATED_ACTIVATIONS`` (what :func:`glu_unfused` applies)."""
EAGER_REDUCE_MAX_T = 16
"""Up to this many tokens an eager call of the decode kernel with split-K adds the partial sums in
the kernel (plan_sparse_decode's reduce="kernel": one launch, 5-11 µs less host time per call on
the H200, where a bare cuLaunchKernel costs 4-7 µs) and a call captured into a CUDA graph in a
second launch (0.5-3 µs less GPU time there); both give the same bits. Beyond 16 tokens the
in-kernel reduction costs more GPU time than the launch it saves: at T = 64 on a 4096 x 4096 weight
its kernel took 26.4 µs against 11.2 µs for the two launches replayed from a graph (tenth session,
benchmarks/RESULTS.md), so T = 17-64 keeps the two launches (both native). SPARSILE_DECODE_REDUCE
set picks one mode for both."""
PDL_ENV = "SPARSILE_PDL"
"""``SPARSILE_PDL=1``: :class:`SparseLinear` launches its decode kernels with programmatic dependent
launch (docs/torch.md). Off by default: on the H200 it changed consecutive decode calls replayed from
a CUDA graph by -7 % to +8 % (eleventh session, benchmarks/bench_pdl.py), no gain worth its rule
that the weight is not written while a call may run."""


@functools.cache
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def pdl_wanted(device: torch.device) -> bool:
    """Whether a constant-weight record on ``device`` launches with PDL: asked for, on sm_90+."""
    return device.type == "cuda" and os.environ.get(PDL_ENV, "0") == "1" and _capability_major(device.index or 0) >= 9


@functools.cache
def kernel_api() -> SimpleNamespace:
    """``sparse_linear``, ``plan_sparse_linear`` and ``quantize_per_token_e4m3`` of
    stdlib/kernels/linear.py (looked up through here so that tests can stand in for them)."""
    from ...stdlib.kernels import linear

    return SimpleNamespace(sparse_linear=linear.sparse_linear, plan_sparse_linear=linear.plan_sparse_linear,
                           quantize=linear.quantize_per_token_e4m3,
                           prepare_quantize=linear.prepare_quantize_per_token_e4m3,
                           prepare_quantize_static=linear.prepare_quantize_static_e4m3)


@functools.cache
def stream_getter(index: int) -> Callable[[], int]:
    """A function of no arguments returning torch's current stream on CUDA device ``index`` as an
    int handle (the backend's, bound to torch's raw-stream accessor: no Stream object per call)."""
    from ...driver.prepared import torch_stream_getter

    return torch_stream_getter(index)


def as_torch(result: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The kernel API's result as a torch tensor of ``dtype`` on ``device`` (numpy is converted)."""
    if isinstance(result, torch.Tensor):
        return result if result.dtype == dtype and result.device == device else result.to(device, dtype)
    host = np.ascontiguousarray(result)
    bits = {1: np.uint8, 2: np.int16, 4: np.int32}[host.itemsize]
    tensor = torch.from_numpy(host.view(bits)).view(getattr(torch, host.dtype.name))
    return tensor.to(device, dtype)


def glu_in_kernel(tokens: int, device: torch.device) -> bool:
    """Whether the kernel applies a gated activation ("swiglu", "geglu") itself to a call of
    ``tokens`` tokens on ``device``: where the decode kernel is planned (1 to 64 tokens,
    ``SPARSILE_DECODE_KERNEL`` not "0"), in the interpreter or on a Hopper GPU. Elsewhere (more
    tokens, Blackwell) the caller computes the pre-activations in the output type and applies the
    gated activation with torch, as the unfused MLP does (:func:`glu_unfused`; docs/torch.md,
    "Fusing the gated activation (SwiGLU, GeGLU)")."""
    if device.type == "cuda" and _capability_major(device.index if device.index is not None
                                                   else torch.cuda.current_device()) != 9:
        return False
    return wants_decode(None, tokens, "sm_90a")


def glu_unfused(z: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up of the pre-activations z (..., 2F) = [gate, up] in their own type, for the
    gated ``activation``: ``F.silu(gate) * up`` ("swiglu") or ``F.gelu(gate, approximate="tanh") *
    up`` ("geglu"). What a Llama or Gemma MLP computes from its gate_proj and up_proj outputs, with
    the same torch ops (the same bits where its act_fn computes exactly that torch function:
    ``nn.SiLU``, ``nn.GELU(approximate="tanh")``, transformers' ``SiLUActivation`` and default
    ``GELUTanh``; not a formula written out, as ``GELUTanh(use_gelu_tanh_python=True)``) and cost
    (an f32 z would double the bytes a prefill writes and reads)."""
    f = z.shape[-1] // 2
    return TORCH_GATES[GATED_ACTIVATIONS[activation]](z[..., :f]) * z[..., f:]


@torch.compiler.disable
def run_interpreted(x: torch.Tensor, w: Weight, scale_x: torch.Tensor | None, out_dtype: torch.dtype
                    ) -> torch.Tensor:
    """y (T, N) = epilogue(x @ W.T) with the kernel in sparsile's CPU interpreter. Never compiled by
    dynamo (host code it has nothing to trace): a frame that fell back to eager under ``torch.compile``
    (a graph break) has dynamo compile every frame it calls, and under ``torch.func.jvp`` its fake
    tensors of the interpreter's wrapped arrays stopped at torch's internal assert (``_fw_primal``)
    before the layer's SP0922."""
    y = kernel_api().sparse_linear(w.values, w.meta, x, bias=w.bias, activation=w.activation, scale_x=scale_x,
                                   scale_w=w.scale_w, out_dtype=OUT_DTYPES[out_dtype], interpret=True)
    return as_torch(y, x.device, out_dtype)


def _current_stream(device: torch.device) -> int | None:
    """torch's current stream on ``device`` as an int handle (None off CUDA)."""
    return stream_getter(device.index or 0)() if device.type == "cuda" else None


def _spec(t: torch.Tensor | None) -> tuple[torch.Size, torch.dtype, torch.device] | None:
    """``t``'s shape, type and device (for a template of it: :meth:`LaunchRecord.refresh_copies`)."""
    return None if t is None else (t.shape, t.dtype, t.device)


def passes_through(launches: list[Any], *tensors: torch.Tensor | None) -> bool:
    """Whether the plan's ``launches`` take each of ``tensors`` (None: not looked for) as it is, not
    a copy the plan made (padded, cast, a host copy): where a record can prepare its launches with
    x and y per call (:meth:`LaunchRecord._prepare`) and read its own quantized x and scales."""
    args = [a for _, _, launch_args, _ in launches for a in launch_args]
    return all(any(same_memory(a, t) for a in args) for t in tensors if t is not None)


def _reads_the_quantized_x(launches: list[Any], xq: torch.Tensor, sx: torch.Tensor) -> bool:
    """Whether the plan's launches read the record's own quantized x and scales (not a padded copy
    of x made when the plan was built, which the record's quantizer would never write)."""
    return passes_through(launches, xq, sx)


SM90_WORDS = {"meta_format": "sm90"}
"""How the records plan a layer's metadata: raw "sm90" words, the format of ``meta`` whatever the
GPU (a Blackwell plan re-encodes them as "tcgen05" words; docs/sparse-metadata.md)."""

EAGER_QUANTIZE_IN_KERNEL_MAX = 1 << 26
"""An eager e4m3 call (a quantizing record, T <= 64) whose T x N x K is at most this, or whose T
and T x N x K are within :data:`EAGER_QUANTIZE_IN_KERNEL_SMALL`, launches the decode kernel that
quantizes x itself (``sparse_decode_e4m3_qx``): one launch instead of two, 5-10 µs less host
time on the H200 (:func:`quantizes_in_kernel`), unless its resident x needs more K shares than the
two-launch plan. A CUDA-graph capture keeps the quantizer and the GEMM: each CTA of the one launch
reads all of x before its first MMA, which costs GPU time as T grows. GPU time on the H200, one
launch against two (docs/hopper.md; benchmarks/RESULTS.md, eighteenth session): at T = 1 0.90-1.02x
up to 28672 x 4096 (57344 x 8192 1.02x, left out; 8192 x 28672 needs two K shares, 1.22x); at
T = 4 1.3-4.0 µs more up to N x K = 2^26, less than the launch saves a host-bound call (5-10 µs of
host time); at T = 16 1.5-2.5x (left out but for N x K <= 2^22, and for the weights of
:data:`EAGER_QUANTIZE_IN_KERNEL_SMALL_WEIGHT`, where eager calls are host-bound)."""
EAGER_QUANTIZE_IN_KERNEL_SMALL = (4, 1 << 28)
"""(T, T x N x K) up to which an eager e4m3 call also takes the one launch: T = 1 up to
N x K = 2^28, T = 4 up to 2^26 (8192 x 8192, 4096 x 14336)."""
EAGER_QUANTIZE_IN_KERNEL_SMALL_WEIGHT = (16, 1 << 25)
"""(T, N x K) up to which an eager e4m3 call also takes the one launch: T <= 16 on weights up to
N x K = 2^25 (Llama-3 8B qkv 6144 x 4096 and o 4096 x 4096). There the one launch's GPU time at
T = 16 (16.0-16.6 µs on the H200, 2.0-2.1x two launches') stays under what the second launch's host
time costs an eager call: eager calls took 16.5-17.2 µs in one launch against 21.8-31.0 µs in two,
dense bf16 ``F.linear`` 18.5-40.6 µs (benchmarks/RESULTS.md, twenty-seventh session). Not on
4096 x 14336 (43 µs in one launch against 17) or 28672 x 4096 (35 against 23), whose eager calls
the one launch did not make faster (4096 x 14336: 32.5 µs against 29.1-32.8) or made slower
(28672 x 4096: 37.0-37.3 against 25.9-31.6)."""


def quantizes_in_kernel(t: int, n: int, k: int) -> bool:
    """Whether an eager e4m3 call of ``t`` tokens through an ``n`` x ``k`` weight is one launch of the
    kernel that quantizes x itself (:data:`EAGER_QUANTIZE_IN_KERNEL_MAX`,
    :data:`EAGER_QUANTIZE_IN_KERNEL_SMALL`, :data:`EAGER_QUANTIZE_IN_KERNEL_SMALL_WEIGHT`)."""
    small_t, small_tnk = EAGER_QUANTIZE_IN_KERNEL_SMALL
    weight_t, weight_nk = EAGER_QUANTIZE_IN_KERNEL_SMALL_WEIGHT
    return (t * n * k <= EAGER_QUANTIZE_IN_KERNEL_MAX or (t <= small_t and t * n * k <= small_tnk)
            or (t <= weight_t and n * k <= weight_nk))


RECORD_QUANTIZE_MAX_T = 64
"""Up to this many tokens an eager e4m3 call quantizes x inside its launch record (buffers the
record owns: T x K bytes, per stream and per T). Larger T, where the call's host time hides behind
its kernel, quantize into fresh buffers per call, so that records of prefill lengths do not pin a
copy of x each."""


class LaunchRecord:
    """A planned sparse linear for one (T, x dtype, device, out dtype): the plan and its prepared
    launches, with the positions where a call's x, y and per-token scale go. ``quantize`` (e4m3
    weights, eager calls): x is the 16-bit input, and the record's first launch quantizes it per
    token into an e4m3 copy and scales the record owns, which the GEMM reads (so a call is one
    native call for both kernels; the record is per stream and per CUDA-graph capture, as one with a
    split-K workspace: capture_keys.py). Where
    :func:`quantizes_in_kernel` an eager call is instead one launch of the decode
    kernel that quantizes x itself (``eager``; the copy and scales are then left untouched), and
    only a capture runs the quantizer and the GEMM. ``static`` (with ``quantize``): a layer's static
    per-tensor input scale (1,) float32, fixed in the record (it pins its memory): the first launch
    quantizes x with it (the static quantizer, which reads the scale's memory on each launch: a write
    in place is taken by the next call and by CUDA graph replays) and the GEMM reads it as its
    per-tensor scale_x; never the one-launch kernel (it quantizes per token)."""

    def __init__(self, x: torch.Tensor, w: Weight, scale_x: torch.Tensor | None, out_dtype: torch.dtype,
                 off_pool: bool = False, stream: int | None = None, quantize: bool = False, pdl: bool = False,
                 static: torch.Tensor | None = None):
        api = kernel_api()
        self.quantize = quantize
        self.static = None if static is None else static.detach()
        # the weight as aliases: the record pins the memory its launches read, not the caller's tensor
        # objects, whose weak reference tells when the layer is gone (RecordCache drops the record then)
        w = Weight(*(None if t is None else t.detach() for t in (w.values, w.meta, w.bias, w.scale_w)), w.activation)
        self.weight = w
        self.storage = storage_key(w.values)  # (RecordCache.sync finds the records of a weight by it)
        # the aliases share the version counters of the caller's tensors: RecordCache.run compares them
        self.tracked = tracked_tensors(w)
        self.versions = weight_versions(self.tracked)
        # PDL (RecordCache(pdl=True)): the decode kernel reads the weight before it waits for the kernel
        # before it, so writes to the weight must be complete (weight_written): not for a weight whose
        # writes cannot be seen (inference tensors)
        self.pdl = pdl and self.tracked is not None
        self.owner: Callable[[], Any] = _NO_OWNER  # RecordCache: a weak reference to the caller's values tensor
        self.captured = False  # set once a CUDA graph captured a call: the cache then never drops it
        # set once the cache dropped it for good, its graph destroyed (RecordCache.release): a clear or a
        # replacement on another thread that retires it after that takes it back out (record_cache.py)
        self.released = False
        self.key: tuple = ()  # where a RecordCache stores it
        self.shape = (int(x.shape[0]), w.out_features)  # (T, N): y's shape (N = rows / 2, gated)
        self.out_dtype = out_dtype
        y = torch.empty(self.shape, dtype=out_dtype, device=x.device)  # this call's output
        kept: list[Any] = []  # what the launches keep (workspace, counters, padded copies): see used_on
        if off_pool:  # the workspace, counters and y template outlive the call (see outside_graph_pools)
            outside_graph_pools(x.device, functools.partial(self._plan, api, x, y, w, scale_x, out_dtype, kept),
                                stream, capturing())
        else:
            self._plan(api, x, y, w, scale_x, out_dtype, kept)
        # the streams it launched on (their handles), and those of them somebody else owns, which may be
        # destroyed once a call returns: never named to the driver from here (noted_streams.py)
        self.foreign: set[int | None] = set() if lasting(stream, x.device.index or 0) else {stream}
        self.waited: frozenset[int | None] = frozenset()  # with PDL: the streams the last write's wait named
        self.kept, self.streams = kept, {stream}
        # every stream its buffers are marked used on (each it launched on, each a refresh of its copies ran
        # on), forgotten or not: torch's free of them names each (an event there), graph_life.frees_captured asks
        self.marked: set[int | None] = {stream}
        if self.prepared is not None:
            self.plan = None  # it holds the first call's x and y; the prepared launches take them per call
        if self.pdl:
            self.weight_written(self.versions)
        # planned inside a CUDA-graph capture, the kernels that fill its copies of the weight (and zero
        # its counters) were captured, not run: they run at the graph's first replay. The cache's next
        # call outside a capture (of any of its records) fills them first, or replaces this record
        # (RecordCache._fill). Until then only the capture that planned it uses it: another capture
        # plans a record of its own (RecordCache.run compares capture ids)
        self.unfilled = capturing() and (self.copies_weight or self.has_counters)
        self.capture = capture_id(stream) if self.unfilled else None  # the capture whose replay fills it

    def _plan(self, api: Any, x: torch.Tensor, y: torch.Tensor, w: Weight, scale_x: torch.Tensor | None,
              out_dtype: torch.dtype, kept: list[Any]) -> list[Any]:
        """Plan and prepare the launches (the one-launch eager variant too, where there is one);
        the arguments the prepared launches keep (workspace, counters, padded copies, the weight)."""
        quantizer: list[Any] = []
        gemm_x, per_call_x = x, x
        if self.quantize:  # x quantized by the record's first launch into buffers it owns
            t, k = (int(s) for s in x.shape)
            self.xq = gemm_x = torch.empty((t, k), dtype=torch.float8_e4m3fn, device=x.device)
            per_call_x = None  # the GEMM's x and scale are fixed: the quantizer's outputs (or the static scale)
            trigger = {"trigger": True} if self.pdl else {}  # the quantizer lets the PDL GEMM start at once
            if self.static is not None:
                self.sx = scale_x = self.static
                quantize = api.prepare_quantize_static(x, self.xq, self.static, per_call=("X",), **trigger)
            else:
                self.sx = scale_x = torch.empty((t,), dtype=torch.float32, device=x.device)
                quantize = api.prepare_quantize(x, self.xq, self.sx, per_call=("X",), **trigger)
            quantizer = [(quantize.run, _picker((0,)))]
        self.plan = api.plan_sparse_linear(w.values, w.meta, gemm_x, bias=w.bias, activation=w.activation,
                                           scale_x=scale_x, scale_w=w.scale_w,
                                           out_dtype=OUT_DTYPES[out_dtype], out=y, **SM90_WORDS, **self._pdl())
        # planning again for refresh_copies, on one token: the weight's operands depend on the kernel
        # (decode at T <= 64, else tiled: kept with kernel="gemm") and its dtype, not on T, so the plan
        # allocates a one-token y and x template instead of the call's (the quantizing record's own
        # first rows; else templates, allocated then). A per-token scale_x of one token is one value.
        self.plan_inputs = (gemm_x[:1], None if scale_x is None else scale_x.reshape(-1)[:1]) if self.quantize \
            else (_spec(x[:1]), _spec(None if scale_x is None else scale_x.reshape(-1)[:1]))
        self.refresh_kernel = {"kernel": "gemm"} if int(x.shape[0]) > DECODE_MAX_T else {}
        self.operands = [getattr(self.plan, "weight_operands", None)]  # the copies refresh_copies writes
        # the decode kernel's in-kernel reduction (SPARSILE_DECODE_REDUCE=kernel): arrival counters the
        # plan zeroes once (the kernel re-zeroes them)
        self.has_counters = getattr(self.plan, "counters", None) is not None
        self.first: tuple[torch.Tensor, torch.Tensor] | None = (x, y)  # the call the plan was built for
        # a one-element tensor broadcast to y's shape: empty_like of it allocates a contiguous y
        # with one tensor argument to parse (about half of torch.empty's host time)
        self.y_like = torch.empty((1,), dtype=out_dtype, device=x.device).expand(self.shape)
        launches = self.plan.launches()
        # split-K: a workspace (and with the decode kernel's in-kernel reduction, arrival counters)
        # that two streams must not share; so are the quantized copy of x and its scales
        self.owns_workspace = len(launches) > 1 or getattr(self.plan, "workspace", None) is not None or self.quantize
        per_call_scale = None if self.quantize else scale_x
        prepared = self._prepare(launches, per_call_x, y, per_call_scale)
        if self.quantize and not _reads_the_quantized_x(launches, self.xq, self.sx):
            prepared = None  # a padded plan reads a copy of xq made now: calls quantize and rebind instead
        self.prepared = None if prepared is None else quantizer + prepared
        self.eager = None  # one launch for eager calls, where the plan takes two (split-K; quantizer + GEMM)
        read = [launches]  # the launches of each plan the record keeps (their weight arguments: copied)
        one_launch = None  # (plan, its one launch, the eager launches or None) where the plan takes two
        # split-K partial sums added in the kernel by eager calls (EAGER_REDUCE_MAX_T)
        reduce_eagerly = self.shape[0] <= EAGER_REDUCE_MAX_T and os.environ.get(DECODE_REDUCE_ENV) is None
        if self.prepared is not None and not capturing():
            if self.quantize and self.static is None and quantizes_in_kernel(self.shape[0], int(w.values.shape[0]),
                                                                             int(x.shape[1])):
                one_launch = self._quantizing_eager(api, x, y, w, out_dtype, reduce_eagerly)  # x quantized in it
            if one_launch is None and len(launches) > 1 and reduce_eagerly and hasattr(self.plan, "reduces_in_kernel"):
                # a decode plan (the tiled kernels always reduce in a second launch): split-K reduced in the kernel
                one_launch = self._reducing_eager(api, gemm_x, per_call_x, y, w, scale_x, per_call_scale,
                                                  out_dtype, quantizer)
        if one_launch is not None:
            plan_one, one, self.eager = one_launch
            self.operands.append(getattr(plan_one, "weight_operands", None))
            read.append(one)
        # the eager launches from native code (unless SPARSILE_TORCH_NATIVE=0)
        self.native = native_launch(self.eager if self.eager is not None else self.prepared, x, y, scale_x)
        self.native_error = 0  # the CUresult of a failed native launch (the record keeps to prepared ones then)
        # a plan that pads or re-encodes the weight (or converts its bias or scale_w) reads copies made
        # now: a write to the weight reaches its launches only through refreshed copies or a new record
        # (RecordCache.run). Per tensor: each copy is made from its own tensor only (padded, tiled,
        # re-encoded, converted), so a write to a tensor every plan reads in place (a bias) leaves the
        # copies as they are
        copied = [t for t in (w.values, w.meta, w.bias, w.scale_w) if t is not None
                  and not all(any(same_bytes(a, t) for _, _, launch_args, _ in plan for a in launch_args)
                              for plan in read)]
        self.copies_weight = bool(copied)
        self.copied = None if self.tracked is None else tuple(any(t is c for c in copied) for t in self.tracked)
        kept += planned_buffers(self.prepared, self.eager, launches, (w.values, w.meta, w.bias, w.scale_w, x, y,
                                                                      per_call_scale))
        return kept

    def _reducing_eager(self, api: Any, gemm_x: torch.Tensor, per_call_x: torch.Tensor | None, y: torch.Tensor,
                        w: Weight, scale_x: torch.Tensor | None, per_call_scale: torch.Tensor | None,
                        out_dtype: torch.dtype, quantizer: list[Any]) -> tuple[Any, list[Any], list[Any] | None] | None:
        """(plan, its launches, the eager launches or None where they cannot be prepared) of the
        decode plan with split-K reduced in the kernel (one launch; a quantizing record's quantizer
        first), or None where that plan still takes more than one launch."""
        plan = api.plan_sparse_linear(w.values, w.meta, gemm_x, bias=w.bias, activation=w.activation, scale_x=scale_x,
                                      scale_w=w.scale_w, out_dtype=OUT_DTYPES[out_dtype], out=y, reduce="kernel",
                                      **SM90_WORDS, **self._pdl())
        one = plan.launches()
        if len(one) != 1:
            return None
        eager = self._prepare(one, per_call_x, y, per_call_scale)
        if self.quantize and not _reads_the_quantized_x(one, self.xq, self.sx):
            eager = None
        return plan, one, None if eager is None else quantizer + eager

    def _quantizing_eager(self, api: Any, x: torch.Tensor, y: torch.Tensor, w: Weight, out_dtype: torch.dtype,
                          reduce_eagerly: bool) -> tuple[Any, list[Any], list[Any]] | None:
        """(plan, its launches, the prepared launches) of the decode kernel that quantizes the 16-bit x
        itself (``sparse_decode_e4m3_qx``, docs/hopper.md) in one launch, split-K reduced in the
        kernel up to EAGER_REDUCE_MAX_T tokens; None where it is not planned (no decode kernel for this
        target or T, the resident x does not fit in shared memory, a split plan beyond
        EAGER_REDUCE_MAX_T tokens or with SPARSILE_DECODE_REDUCE=launch, more K shares than the
        two-launch plan's) or reads a copy of x."""
        reduce = {"reduce": "kernel"} if reduce_eagerly else {}
        try:
            plan = api.plan_sparse_linear(w.values, w.meta, x, bias=w.bias, activation=w.activation, scale_w=w.scale_w,
                                          out_dtype=OUT_DTYPES[out_dtype], out=y, **reduce, **SM90_WORDS,
                                          **self._pdl())
        except SparsityError:
            return None
        one = plan.launches()
        if not getattr(plan, "quantizes_x", False) or len(one) != 1 or k_shares(plan) > k_shares(self.plan):
            return None  # (more K shares: the resident x did not fit at the two-launch plan's split)
        prepared = self._prepare(one, x, y, None)
        return None if prepared is None else (plan, one, prepared)

    def planned_in(self, capture: int | None) -> bool:
        """Whether this record was planned inside the capture of id ``capture`` (False where either
        id is unknown: a record of an unknown capture serves no other capture)."""
        return capture is not None and capture == self.capture

    def _pdl(self) -> dict[str, bool]:  # only where asked: test doubles of the kernel API lack it
        return {"pdl": True} if self.pdl else {}

    def refresh_copies(self) -> bool:
        """After an in-place write of the weight: copy what a plan made from the weight as it is now
        (padded, re-encoded, converted) into the copies this record's launches read, on torch's
        current stream, so that the record, and every CUDA graph that captured it, computes with
        the new weight. False (nothing written) where a plan does not list its operands or the new
        ones differ in shape or type (the caller builds a new record then)."""
        if any(operands is None for operands in self.operands):
            return False
        w = self.weight
        gemm_x, scale_x = (torch.empty(t[0], dtype=t[1], device=t[2]) if isinstance(t, tuple) else t
                           for t in self.plan_inputs)
        fresh = getattr(kernel_api().plan_sparse_linear(w.values, w.meta, gemm_x, bias=w.bias, activation=w.activation,
                                                        scale_x=scale_x, scale_w=w.scale_w,
                                                        out_dtype=OUT_DTYPES[self.out_dtype], out=None,
                                                        **SM90_WORDS, **self.refresh_kernel),
                        "weight_operands", None)
        if fresh is None:
            return False
        pairs = []
        for operands in self.operands:
            for source, old, new in zip((w.values, w.meta, w.bias, w.scale_w), operands, fresh, strict=True):
                if source is None or old is None or same_bytes(old, source):
                    continue  # not given, or read in place
                if new is None or old.shape != new.shape or old.dtype != new.dtype:
                    return False
                pairs.append((old, new))
        with torch.inference_mode():  # (copies planned under inference_mode are inference tensors)
            for old, new in pairs:
                old.copy_(new)
        # the copies are written on the current stream: a stream this record may never have run on,
        # whose copy must be done before the allocator hands their memory out again (see used_on)
        stream = _current_stream(w.values.device)
        if pairs and stream is not None and stream not in self.streams:
            self.marked.add(stream)
            used_on([old for old, _ in pairs], stream)
        return True

    def copies_stale(self, versions: tuple[int, ...]) -> bool:
        """Whether the weight's version counters now (``versions``, of ``tracked``) show a write to a
        tensor this record reads through a copy (a write to a tensor read in place needs no refresh)."""
        copied = self.copied or ()
        return any(c and now != then for c, now, then in zip(copied, versions, self.versions, strict=True))

    def weight_written(self, versions: tuple[int, ...] | None) -> None:
        """The weight was written (``versions``: its version counters now): with PDL, wait until the
        writes queued so far on the streams this record's kernels launch on are complete (torch's
        current stream, where the write was queued or the call launches, and each stream the record
        launched on), since the kernel reads the weight before it waits for the kernel before it. One
        ``cuStreamSynchronize`` per stream in thread-local capture mode, never a device-wide
        synchronize (another thread's CUDA graph capture stays valid); nothing while this thread's
        current stream captures, and a stream capturing now is skipped (stream_waits.py).

        A stream somebody else owns (``foreign``: its owner may have destroyed it since) is named
        only where it is the current stream; any other is forgotten instead (taken out of
        ``streams``, not out of ``marked``: torch's free of the buffers marked used there names it,
        and :func:`~.graph_life.frees_captured` asks it first), so that the record's next launch
        there, with that stream current and alive, is a first launch on it, which waits for it
        (:meth:`_launches_on`)."""
        if self.pdl and not capturing():
            device = self.weight.values.device
            current = _current_stream(device)
            foreign = self.foreign  # (a stream is put there before it is put into streams: a snapshot of
            streams = tuple(self.streams)  # streams finds each foreign one of it there)
            self.streams.difference_update([s for s in streams if s in foreign and s != current])
            named = (current, *(s for s in streams if s not in foreign))
            wait_for_streams(named, device.index or 0)
            self.waited = frozenset(named)
        self.versions = versions

    def _launches_on(self, stream: int, in_capture: bool) -> None:
        """The first launch on ``stream`` since the record was built or forgot it (:meth:`weight_written`):
        noted (and whether somebody else owns it), its buffers marked used there (``used_on``); with
        PDL, outside a capture, the writes queued there so far waited for, unless the last write's
        wait named it (``waited``): a write to the weight queued there before, whose version change
        an earlier call on another stream saw and waited for without naming this stream."""
        ordinal = self.weight.values.device.index or 0
        if lasting(stream, ordinal):
            self.foreign.discard(stream)
        else:
            self.foreign.add(stream)
        self.marked.add(stream)  # (before the mark: a free on another thread meanwhile asks it)
        self.streams.add(stream)
        used_on(self.kept, stream)
        if self.pdl and not in_capture and stream not in self.waited:
            wait_for_streams((stream,), ordinal)
            self.waited = self.waited | {stream}

    @staticmethod
    def _prepare(launches: list[Any], x: torch.Tensor | None, y: torch.Tensor, scale_x: torch.Tensor | None
                 ) -> list[Any] | None:
        """[(a prepared launch's ``run``, a function picking what it takes per call from (x, y,
        scale_x), in order)], or None when
        ``prepare`` is missing or the plan does not pass x and y through unchanged (a padded copy).
        x or scale_x None: fixed in the launches (a quantizing record's own buffers).
        Every other argument (the weight, its metadata, bias, scales, sizes) is fixed when the
        launch is prepared (``per_call=``), so a call checks and writes only its own tensors."""
        prepared = []
        for kernel, grid, args, constexprs in launches:
            launcher = kernel[grid]
            if not hasattr(launcher, "prepare"):
                return None
            slots = [(i, which) for i, a in enumerate(args) for which, t in enumerate((x, y, scale_x))
                     if t is not None and same_memory(a, t)]
            names = [p.name for p in kernel.params]
            fixed = {names[i]: a for i, a in enumerate(args)}  # the weight, bias, scales, sizes: checked once
            per_call = tuple(names[i] for i, _ in slots)
            launch = launcher.prepare(**fixed, **constexprs, per_call=per_call)
            prepared.append((launch.run, _picker(tuple(which for _, which in slots))))
        return prepared if passes_through(launches, x, y, scale_x) else None

    def after_native(self, status: int, done: int, call: tuple[Any, ...], stream: int) -> None:
        """The native launch of an eager call (x, y, scale_x) = ``call`` returned ``status`` (nonzero)
        after ``done`` launches: the prepared launches run the rest (outside a capture: the eager
        ones). A failed launch (``status`` > 0) is reported, and this record keeps to its prepared
        launches from now on; one the native code declined (< 0: a misaligned buffer) is not."""
        if status > 0:
            self.native, self.native_error = None, status
            report_failure(status)
        launches = self.eager if self.eager is not None else self.prepared
        for run, which in launches[done:]:
            run(which(call), stream)

    def __call__(self, x: torch.Tensor, scale_x: torch.Tensor | None, stream: int,
                 in_capture: bool | None = None) -> torch.Tensor:
        """y for x (and a per-call scale_x) on ``stream``; ``in_capture``: :func:`capturing`, where
        the caller asked it already (None: asked here)."""
        if in_capture is None:
            in_capture = capturing()
        if stream not in self.streams:  # a record without a workspace serves every stream
            self._launches_on(stream, in_capture)
        first, self.first = self.first, None
        if first is not None and first[0] is x:
            y = first[1]
        else:
            y = torch.empty_like(self.y_like, memory_format=torch.contiguous_format)
        if in_capture:
            self.captured = True  # a graph holds this record's workspace addresses now
        if self.prepared is not None:
            native = self.native
            if native is not None and not in_capture:
                status, done = native.launch(x.data_ptr(), y.data_ptr(),
                                             0 if scale_x is None else scale_x.data_ptr(), stream)
                if status:
                    self.after_native(status, done, (x, y, scale_x), stream)
                return y
            launches = self.eager if self.eager is not None and not in_capture else self.prepared
            call = (x, y, scale_x)
            for run, which in launches:
                run(which(call), stream)
            return y
        if self.quantize:  # no prepared launches (a padded plan): quantize, then the plan on the copy
            xq, scale_x = quantize_per_token(x) if self.static is None else \
                (quantize_with_scale(x, self.static), self.static)
            self.plan.rebind(xq, y, scale_x=scale_x).run(stream=stream)
            return y
        if first is not None and first[0] is x:  # the call the plan was built for
            self.plan.run(stream=stream)
            return y
        self.plan.rebind(x, y, scale_x=scale_x).run(stream=stream)  # scale_x None keeps the plan's
        return y


def k_shares(plan: Any) -> int:
    """The K split of a plan: a decode plan's ``config.split_k``, a tiled plan's ``split_k``, else 1."""
    split = getattr(getattr(plan, "config", None), "split_k", None) or getattr(plan, "split_k", None)
    return int(split or 1)


def _NO_OWNER() -> None:
    """The owner of a record not (yet) in a :class:`RecordCache`: none."""


def capturing() -> bool:
    """torch's current CUDA stream is capturing a graph."""
    return _IS_CAPTURING()


def _cuda_capturing() -> bool:
    """torch's current CUDA stream is capturing (False before torch has initialized CUDA: nothing
    can be capturing then, and asking must not initialize it)."""
    return torch.cuda.is_initialized() and torch._C._cuda_isCurrentStreamCapturing()


_IS_CAPTURING: Callable[[], bool] = _cuda_capturing


def capture_id(stream: int | None) -> int | None:
    """The id of the CUDA-graph capture ``stream`` is recording (unique in the process), or None
    (not capturing, or not known). Ask only while :func:`capturing`. The legacy default stream (0)
    is never asked: during a capture that query is an implicit synchronization, which invalidates
    the capture."""
    return _CAPTURE_ID(stream) if stream else None


def cuda_capture_info(stream: int) -> tuple[int, int] | None:
    """(capture id, ``CUgraph`` handle) of the capture ``stream`` records (``cuStreamGetCaptureInfo``),
    or None; asked only while torch says its current stream captures (a handle that is no CUstream,
    as a CPU test's fake stream under a faked :func:`capturing`, would crash the process inside the
    driver). The capture id for :func:`capture_id`, the graph for graph_life.py."""
    if not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        return None
    from cuda.bindings import driver

    err, status, cid, graph, *_ = driver.cuStreamGetCaptureInfo(driver.CUstream(stream))
    active = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
    return (int(cid), int(graph)) if err == driver.CUresult.CUDA_SUCCESS and status == active else None


def _cuda_capture_id(stream: int | None) -> int | None:
    info = cuda_capture_info(stream or 0)
    return None if info is None else info[0]


_CAPTURE_ID: Callable[[int | None], int | None] = _cuda_capture_id


def _picker(which: tuple[int, ...]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """A function of (x, y, scale_x) giving the members at ``which``, as a tuple."""
    if not which:  # a launch taking nothing per call (a quantizing record's split-K GEMM: x and y are its own)
        return lambda call: ()
    if len(which) == 1:
        (only,) = which
        return lambda call: (call[only],)
    return operator.itemgetter(*which)
