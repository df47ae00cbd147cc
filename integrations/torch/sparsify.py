"""``sparsify_(model)``: swap the ``nn.Linear`` modules of a model for :class:`.SparseLinear`.

The contract of torchao's ``sparsify_``: in place, ``filter_fn(module, fqn) -> bool`` picks the
modules (default: every ``nn.Linear``). Unlike torchao, a linear the kernel cannot run well is
skipped with its reason in the returned :class:`SparsifyReport` (also logged at INFO on the
``sparsile.torch`` logger), never swapped into a slower or failing layer.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...backend.runtime.arrays import byte_range
from ...stdlib.kernels.gemm_choice import KERNELS
from ..errors import SP_SPARSIFY_ARGUMENTS, SP_TRAIN_LAYER, IntegrationError
from ..sparse24 import LINEAR_CLASSES
from .atomic import restore_modules, swap_modules
from .conv1d import CONV1D_ORIGIN, conv1d_class, conv1d_reason, is_conv1d, linear_of
from .forms import is_plain_linear_forward
from .fuse import DEFAULT_GROUPS, FuseReport, checked_flag, checked_groups, fuse_projections_
from .layer_args import F16_MAX, beyond_f16, checked_model, weight_dtype_name
from .linear import SparseLinear
from .training import SemiSparseLinear
from .unswapped import not_linear_projections
from .wording import counted

LOG = logging.getLogger("sparsile.torch")
GROUP = 4
TRAIN_E4M3 = "sparse training computes in bf16 or f16, not e4m3"


@dataclass
class SparsifyReport:
    """What :func:`sparsify_` did: the swapped modules' names and, for each skipped one, why."""

    swapped: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    fusion: FuseReport | None = None  # with fuse=: what fuse_projections_ did
    layer: str = "SparseLinear"  # the class swapped in: "SemiSparseLinear" with trainable=True
    unfiltered: int = 0  # the nn.Linear and transformers Conv1D modules filter_fn turned down
    already_sparse: int = 0  # the SparseLinear modules the model held already
    # projections that are no nn.Linear (stacked MoE expert weights): name -> what they are and what the user
    # can do; listed when filter_fn is None (a filter sees nn.Linear and transformers Conv1D modules only)
    not_linear: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"sparsify_: {counted(len(self.swapped), 'linear layer')} swapped for {self.layer}, "
                 f"{len(self.skipped)} skipped"]
        lines += [f"  skipped {name or '<root>'}: {why}" for name, why in self.skipped.items()]
        lines += [f"  not an nn.Linear, kept dense {name or '<root>'}: {why}" for name, why in self.not_linear.items()]
        if not self.swapped and not self.skipped and not self.not_linear:
            lines.append("  " + self._why_nothing())
        if self.fusion is not None:
            lines.append(str(self.fusion))
        return "\n".join(lines)

    def _why_nothing(self) -> str:
        """Why a call swapped and skipped nothing (a model of other layer types, a filter that
        refused every linear, a model sparsified already)."""
        if self.unfiltered:
            return (f"filter_fn turned down all {self.unfiltered} linear modules" if self.unfiltered > 1 else
                    "filter_fn turned down the 1 linear module")
        if self.already_sparse:
            return (f"the model's {self.already_sparse} linear layers are sparse already" if self.already_sparse > 1
                    else "the model's 1 linear layer is sparse already")
        return ("the model has no torch.nn.Linear module: sparsify_ swaps nn.Linear and transformers' Conv1D "
                "only (projections of another class are not swapped)")


def skip_reason(module: nn.Linear, dtype: Any, interpret: bool, min_features: int,
                trainable: bool = False) -> str | None:
    """Why ``module`` should stay dense, or None when it fits the kernel."""
    if isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear):  # (as torchao skips it)
        return "nn.MultiheadAttention reads this out_proj's weight itself (not through its forward)"
    own = own_behaviour(module)
    if own is not None:
        return own
    k, n = module.in_features, module.out_features
    weight = module.weight
    try:
        name = weight_dtype_name(dtype, weight.dtype)
    except IntegrationError as exc:  # (a float32 linear with dtype=None: a dtype converts it)
        return f"{exc.message} (pass dtype='bf16', 'f16' or 'e4m3': the weight is converted)"
    if trainable and name == "e4m3":  # (a float8 linear with dtype=None; dtype="e4m3" is SP0916 before)
        return (f"{TRAIN_E4M3} (the weight is {weight.dtype}: pass dtype='bf16' or 'f16')")
    if k % GROUP:
        return f"in_features = {k} is not a multiple of the 2:4 group ({GROUP})"
    align = KERNELS[name].k_align
    if k % align:
        return (f"in_features = {k} is not a multiple of {align} ({name}): the kernel would copy and pad x on "
                "every call")
    if trainable and n % align:
        return (f"out_features = {n} is not a multiple of {align} ({name}): the input gradient's kernel would "
                "copy and pad dY on every call")
    if min(k, n) < min_features:
        return f"too small to gain from 2:4 ({n} x {k}; min_features = {min_features})"
    if weight.device.type == "meta":
        return "the weight is on the meta device (no values to prune)"
    if module.bias is not None and module.bias.device.type == "meta":
        return "the bias is on the meta device (no values)"
    if weight.device.type == "cpu" and not interpret:
        return "on the CPU: the kernel runs on CUDA GPUs (pass interpret=True to run it in the slow interpreter)"
    if weight.device.type not in ("cpu", "cuda"):
        return f"on a {weight.device.type} device: the kernel runs on CUDA GPUs"
    big = beyond_f16(weight, name)
    if big:
        return f"{big} weights lie beyond ±{F16_MAX:g}, the largest finite float16 (use dtype='bf16')"
    return None


# Parents that read some of their linears' weights themselves instead of calling them, and which.
WEIGHT_READERS: tuple[tuple[type, tuple[str, ...], str], ...] = (
    (nn.TransformerEncoderLayer, ("linear1", "linear2"), "its eval-mode fast path"),
)


def read_by_parent(model: nn.Module) -> dict[int, str]:
    """Why each linear (by ``id``) whose parent reads its weight itself must stay dense: in eval mode
    ``nn.TransformerEncoderLayer`` (and ``nn.TransformerEncoder`` through its first layer) passes
    ``linear1.weight`` and ``linear2.weight`` to its fast path, where a SparseLinear (no ``weight``)
    is an AttributeError from torch and a SemiSparseLinear's dense master weight gives other numbers."""
    reasons: dict[int, str] = {}
    for parent in model.modules():
        for cls, names, where in WEIGHT_READERS:
            if isinstance(parent, cls):
                for name in names:
                    child = getattr(parent, name, None)
                    if isinstance(child, nn.Linear):
                        reasons[id(child)] = (f"nn.{cls.__name__} reads this linear's weight itself ({where}), "
                                              "not through its forward")
    return reasons


def own_behaviour(module: nn.Module, base: type = nn.Linear) -> str | None:
    """Why calling ``module`` may compute something other than ``base``'s forward (``nn.Linear``'s
    ``x @ W.T + b``), or something a new module would not do (None where it computes just that): its
    class's own ``forward`` or ``__call__``, a ``forward`` replaced on the instance, forward or
    backward hooks registered on it. A new ``SparseLinear`` computes the linear alone and holds none
    of them, so swapping it in would change the model's output without a word. An ``nn.Linear``
    subclass whose forward is the plain linear in other words (Falcon's ``FalconLinear``:
    :func:`~.forms.is_plain_linear_forward`) computes just that."""
    cls = type(module)
    plain = base is nn.Linear and cls.__call__ is base.__call__ and is_plain_linear_forward(cls.forward)
    if not plain and (cls.forward is not base.forward or cls.__call__ is not base.__call__):
        which = "forward" if cls.forward is not base.forward else "__call__"
        return (f"{cls.__name__} defines its own {which}: a SparseLinear would compute the plain linear "
                "x @ W.T + b instead")
    if "forward" in vars(module):
        return "its forward is replaced on the instance: a SparseLinear would compute the plain linear x @ W.T + b"
    hooks = [kind for kind, held in (("forward pre-hooks", module._forward_pre_hooks),
                                     ("forward hooks", module._forward_hooks),
                                     ("backward pre-hooks", module._backward_pre_hooks),
                                     ("backward hooks", module._backward_hooks)) if held]
    if hooks:
        return (f"it has {' and '.join(hooks)}, which a SparseLinear in its place would not run (remove them, "
                "then register them on the SparseLinear)")
    return None


def _span(t: torch.Tensor) -> tuple[Any, int, int] | None:
    """(t's device and storage, its first byte, one past its last byte) in memory, or None (no memory:
    the meta device, no elements, a tensor subclass without a storage: then identity alone counts)."""
    try:
        if t.is_meta or t.numel() == 0:
            return None
        item = t.element_size()
        first, end = byte_range(t.data_ptr(), t.shape, [stride * item for stride in t.stride()], item)
        return (t.device, t.untyped_storage().data_ptr()), first, end
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class TiedTensors:
    """Every parameter and buffer of a model by the module that holds it, to find the tensors a
    linear shares with another module (the same tensor object, or overlapping memory): a tied weight,
    as transformers ties lm_head.weight to embed_tokens.weight (``tie_word_embeddings``)."""

    def __init__(self, model: nn.Module):
        self.by_id: dict[int, list[tuple[nn.Module, str]]] = {}
        self.by_storage: dict[Any, list[tuple[int, int, nn.Module, str]]] = {}
        for fqn, module in model.named_modules(remove_duplicate=False):
            for tensors in (module._parameters, module._buffers):
                for name, t in tensors.items():
                    if not isinstance(t, torch.Tensor):
                        continue
                    held = (module, f"{fqn}.{name}" if fqn else name)
                    self.by_id.setdefault(id(t), []).append(held)
                    span = _span(t)
                    if span is not None:
                        self.by_storage.setdefault(span[0], []).append((span[1], span[2], *held))
        self.head = None  # a transformers model's output embeddings, tied by its config
        if getattr(getattr(model, "config", None), "tie_word_embeddings", False) is True:
            try:
                self.head = model.get_output_embeddings()
            except (AttributeError, NotImplementedError):  # (no such method: the reason without the config)
                self.head = None

    def others(self, module: nn.Module, t: torch.Tensor) -> list[str]:
        """The names of the tensors of modules other than ``module`` that are ``t`` or overlap its memory."""
        held = list(self.by_id.get(id(t), ()))
        span = _span(t)
        if span is not None:
            held += [(owner, name) for start, end, owner, name in self.by_storage.get(span[0], ())
                     if start < span[2] and span[1] < end]
        names: list[str] = []
        for owner, name in held:
            if owner is not module and name not in names:
                names.append(name)
        return names

    def tie(self, module: nn.Module) -> tuple[str, str] | None:
        """("weight" or "bias", the names of the other modules' tensors it is tied to, shown) for the
        first of ``module``'s weight and bias that is tied, or None."""
        for what in ("weight", "bias"):
            t = getattr(module, what, None)
            others = self.others(module, t) if isinstance(t, torch.Tensor) else []
            if others:
                return what, ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return None

    def reason(self, module: nn.Linear) -> str | None:
        """Why ``module`` stays dense because its weight (or bias) is tied to another module's tensor, or None."""
        tie = self.tie(module)
        if tie is None:
            return None
        what, shown = tie
        config = ("set model.config.tie_word_embeddings = False, so that tie_weights() does not tie them "
                  "again, and " if module is self.head else "")
        return (f"its {what} is tied to {shown}: a SparseLinear in its place would hold a pruned copy of its "
                f"own, untying them without a word (to sparsify it, untie them first: {config}give it a copy "
                f"of its own, module.{what} = nn.Parameter(module.{what}.detach().clone()))")


def conv1d_skip_reason(module: nn.Module, dtype: Any, interpret: bool, min_features: int,
                       trainable: bool = False) -> str | None:
    """Why the transformers ``Conv1D`` ``module`` should stay dense (its class's own forward or
    hooks, a bias it cannot run without, or what :func:`skip_reason` says of the linear it equals),
    or None."""
    own = own_behaviour(module, conv1d_class())
    if own is not None:
        return own.replace("x @ W.T + b", "x @ W + b")  # (its weight is stored (in, out))
    return conv1d_reason(module) or skip_reason(linear_of(module), dtype, interpret, min_features, trainable)


def _check_arguments(model: Any, filter_fn: Any, dtype: Any, min_features: Any, trainable: bool) -> None:
    """SP0907 for arguments of the wrong kind; SP0903 for a ``dtype`` no layer could take (rather
    than every linear skipped for it), SP0916 for e4m3 with ``trainable``."""
    checked_model(model, "sparsify_")
    if filter_fn is not None and not callable(filter_fn):
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, f"filter_fn must be None or a function (module, fqn) -> bool, "
                               f"got {type(filter_fn).__name__}", help="leave it unset to swap every linear")
    if not isinstance(min_features, numbers.Integral) or isinstance(min_features, bool) or min_features < 0:
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, f"min_features must be a non-negative integer, got "
                               f"{min_features!r}", help="layers with fewer in or out features stay dense "
                               "(default 128)")
    if dtype is not None and weight_dtype_name(dtype) == "e4m3" and trainable is True:
        raise IntegrationError(SP_TRAIN_LAYER, TRAIN_E4M3, help="train with dtype='bf16', then convert: "
                               "layer.to_sparse_linear() keeps bf16")


def _accepts(filter_fn: Callable[[nn.Module, str], Any], module: nn.Module, fqn: str) -> bool:
    """``filter_fn(module, fqn)`` as a bool (its truth value, as torchao takes it); SP0907 for a
    result that has none (an array or a tensor of several elements)."""
    kept = filter_fn(module, fqn)
    try:
        return bool(kept)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, f"filter_fn returned a {type(kept).__name__} for {fqn!r}, "
                               f"which is neither true nor false: {exc}",
                               help="return True to swap the module, False to keep it dense") from None


def _built(module: nn.Module, dtype: Any, trainable: bool) -> SparseLinear | SemiSparseLinear:
    """The sparse layer of the chosen linear or transformers Conv1D ``module`` (that of its weight
    W.T); one made from a Conv1D knows it (``transposed_from``): a trainable one refuses a Conv1D's
    dense state dict, whose weight is (in, out), rather than load it transposed, and
    ``save_sparse24_checkpoint`` writes either in the Conv1D's layout (in, out). One made from a
    module of other classes than nn.Linear's keeps their names (``source_classes``: a config group
    targeting ``FalconLinear`` or ``Conv1D`` still matches it, as it matches the dense model's)."""
    if not is_conv1d(module):
        layer = SparseLinear.from_dense(module, dtype, trainable=trainable)
    else:
        layer = SparseLinear.from_dense(linear_of(module, contiguous=True), dtype, trainable=trainable)
        layer.transposed_from = CONV1D_ORIGIN
    classes = class_names(module)
    if classes != LINEAR_CLASSES:  # (a FalconLinear, a Conv1D: config groups may target its class by name)
        layer.source_classes = classes
    return layer


def class_names(module: nn.Module) -> tuple[str, ...]:
    """The names of the module classes of ``module``'s MRO, in order (``FalconLinear``, ``Linear``,
    ``Module``): what compressed-tensors matches a config group's class targets against."""
    return tuple(cls.__name__ for cls in type(module).__mro__ if issubclass(cls, nn.Module))


def sparsify_(model: nn.Module, filter_fn: Callable[[nn.Module, str], bool] | None = None, dtype: Any = None, *,
              interpret: bool = False, min_features: int = 128, trainable: bool = False,
              fuse: Any = False, traced: bool = False, glu: bool | None = None) -> SparsifyReport:
    """Replace, in place, each ``nn.Linear`` of ``model`` that ``filter_fn(module, fqn)`` accepts
    (default: all) and the kernel fits by ``SparseLinear.from_dense(linear, dtype)`` (magnitude
    pruning to 2:4). ``dtype``: "bf16", "f16", "e4m3" or None (each linear's own dtype).
    transformers' ``Conv1D`` (GPT-2: ``x @ W + b``, W stored (in, out)) counts as the linear of
    weight ``W.T`` (conv1d.py: pruned along its inputs, its bias kept; ``filter_fn`` sees it too),
    and Falcon's ``FalconLinear`` as an ``nn.Linear`` (its forward is the plain linear: forms.py).

    Skipped, with the reason in the report: a K (in_features) that is not a multiple of 4, or of
    the kernel's TMA row alignment (16 for bf16/f16, 32 for e4m3); a layer smaller than
    ``min_features`` on either side; a weight dtype without a kernel (float32 with dtype=None);
    weights on the CPU unless ``interpret=True`` (the interpreter is exact but slow), or on
    another device; the root module itself (it cannot be replaced in place); the ``out_proj`` of an
    ``nn.MultiheadAttention`` (a ``NonDynamicallyQuantizableLinear``: its parent reads the weight),
    and ``linear1`` / ``linear2`` of an ``nn.TransformerEncoderLayer`` (read by its fast path:
    :func:`read_by_parent`); a linear whose call does more than the linear (its class's own
    forward, a forward replaced on the instance, forward or backward hooks: :func:`own_behaviour`);
    a linear whose weight (or bias) is tied to another module's tensor (the same tensor or memory,
    as transformers ties lm_head to the input embeddings: :class:`TiedTensors`; a pruned copy would
    untie them); a bias on the meta device; a float8 weight with ``trainable=True``. Modules the
    filter rejects are not reported. Without a ``filter_fn``, projections that are no ``nn.Linear``
    (stacked MoE expert weights) are listed in ``report.not_linear`` (unswapped.py).
    ``trainable=True`` swaps in trainable :class:`~.training.SemiSparseLinear` layers instead
    (docs/training.md; e4m3 is refused, SP0916).

    ``fuse=True`` then calls :func:`~.fuse.fuse_projections_` (sibling projections such as q/k/v run
    as one kernel; docs/torch.md), ``fuse=groups`` with those groups; its report is ``report.fusion``;
    ``traced=True`` fuses inside torch.compile traces too (``fuse_projections_(traced=True)``);
    ``glu`` (default: True where ``fuse`` is set) runs the gated activation (SwiGLU, GeGLU) in the
    fused gate/up kernel of Llama- and Gemma-style MLPs (``fuse_projections_(glu=True)``);
    ``glu=False`` keeps the MLPs' own activation and product.

    All or nothing: every ``filter_fn`` call (a result with no truth value is SP0907), skip reason
    and sparse layer comes before the first swap, and a fusion that raises puts the model's linears
    back (docs/torch.md, "When a call raises").
    """
    _check_arguments(model, filter_fn, dtype, min_features, trainable)
    checked_flag(interpret, "interpret", "sparsify_")
    checked_flag(trainable, "trainable", "sparsify_")
    fusing = not (fuse is False or fuse is None)
    if glu is None:  # the default: the gated activation in the kernel wherever gate/up are fused
        glu = fusing
    checked_flag(glu, "glu", "sparsify_")
    checked_flag(traced, "traced", "sparsify_")
    if glu and not fusing:
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, "sparsify_: glu=True applies to fused gate/up projections, "
                               "but fuse is not set", help="pass fuse=True with glu=True")
    groups = None if not fusing else DEFAULT_GROUPS if fuse is True else checked_groups(fuse)
    report = SparsifyReport(layer="SemiSparseLinear" if trainable else "SparseLinear")
    if filter_fn is None:  # (a filter sees nn.Linear modules only: it chose which layers matter)
        report.not_linear = not_linear_projections(model)
    chosen = []  # every filter_fn call and skip reason first: an exception there leaves the model as it was
    tied = TiedTensors(model)
    read = read_by_parent(model)
    for fqn, module in list(model.named_modules()):
        if isinstance(module, (SparseLinear, SemiSparseLinear)):
            report.already_sparse += 1
            continue
        conv = not isinstance(module, nn.Linear) and is_conv1d(module)
        if not isinstance(module, nn.Linear) and not conv:
            continue
        if filter_fn is not None and not _accepts(filter_fn, module, fqn):
            report.unfiltered += 1
            continue
        check = conv1d_skip_reason if conv else skip_reason
        reason = (read.get(id(module)) or tied.reason(module)
                  or check(module, dtype, interpret, min_features, trainable))
        if reason is None and not fqn:
            reason = "the root module cannot be replaced in place: use SparseLinear.from_dense(model)"
        if reason is not None:
            report.skipped[fqn] = reason
            continue
        chosen.append((fqn, module))
    paths: dict[int, list[str]] = {}  # a module registered under several names (tied): every name swapped
    for fqn, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(fqn)
    # every layer built before the first swap (a build that raises leaves the model as it was; the dense
    # layers stay alive until the call returns either way: peak memory is the dense model and its sparse layers)
    built = [(module, _built(module, dtype, trainable)) for _, module in chosen]
    swaps = [(fqn, sparse) for module, sparse in built for fqn in paths[id(module)]]
    undo = swap_modules(model, swaps)
    report.swapped = [fqn for fqn, _ in swaps]
    if groups is not None:
        try:
            report.fusion = fuse_projections_(model, groups, traced=traced, glu=glu)
        except BaseException:  # (fuse_projections_ undid its own edits): the model's linears back
            restore_modules(undo)
            raise
    LOG.info("%s", report)
    return report
