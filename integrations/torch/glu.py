"""The gated activation (SwiGLU, GeGLU) fused into a sparse gated MLP: the forward
``fuse_projections_(glu=True)`` installs on a Llama- or Gemma-style MLP.

A Llama, Mistral or Qwen MLP computes ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU
(SwiGLU), a Gemma MLP the same with the tanh-approximated GELU (GeGLU). Once
:func:`~.fuse.fuse_projections_` runs gate_proj and up_proj as one fused layer over the
row-concatenated weight [gate; up], the kernel's epilogue can apply the gated activation itself:
y (..., F) = act(gate) * up in float32, rounded once, instead of two column views of the fused
output and torch's activation and ``mul`` (two elementwise kernels per layer). :func:`install_glu`
puts a :class:`GatedForward`'s bound ``forward`` on the MLP instance (``parent.__dict__["forward"]``:
a method, so that torch.export finds its code) where the parent matches (:func:`glu_of`): an
``act_fn`` that :func:`gate_activation` recognizes (SiLU: activation "swiglu"; GELU with the tanh
approximation: "geglu"), a ``down_proj`` child, and a class forward with the bytecode of one of
the reference forms below. Anything else keeps the class's forward.

The epilogue applies it where the decode kernel runs (1 to 64 tokens, Hopper or the CPU
interpreter: ``_kernels.glu_in_kernel``); elsewhere the fused layer computes the pre-activations
in its output type and torch applies ``F.silu`` (or ``F.gelu(approximate="tanh")``) and the
product, as the unfused MLP does (the same cost; the same bits where its act_fn computes exactly
that torch function). docs/torch.md, "Fusing the gated activation (SwiGLU, GeGLU)".

A Phi-3 MLP holds gate and up packed in one linear, ``gate_up_proj`` (rows [gate; up], the layout
of a fused gate/up group), and computes ``gate, up = gate_up_proj(x).chunk(2, dim=-1)``,
``down_proj(up * activation_fn(gate))``: :data:`PACKED` describes it (:class:`MLPForm`), and
``fuse_projections_`` runs its gate_up_proj as a group of one member, so that the same forward applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import FunctionType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.modules.module as _mm
from torch import nn

from ._kernels import GATED_ACTIVATIONS, OP_ACTIVATIONS, glu_in_kernel, glu_unfused
from .act_state import act_modules, act_states
from .autograd import LayerWithInputGrad, needs_autograd
from .compiled_act import compiled_module_of
from .forms import code_key, has_code_of
from .gate import gate_activation
from .linear import SparseLinear, tensors_of, tracing

if TYPE_CHECKING:
    from .projection_group import ProjectionGroup

MLP_NAMES = ("gate_proj", "up_proj")
"""The projection group whose fusion may take the gated activation, in this order (the fused rows:
gate's, then up's)."""
ROW_ALIGN = 16
"""Each fused member's out_features (and each half of a packed gate_up_proj) must be a multiple of
this: the sm90 metadata encodes blocks of 16 rows on their own, so a member's words are a row slice
of the fused words (docs/sparse-metadata.md §4)."""
GLU_OF_GATE = {gate: glu for glu, gate in GATED_ACTIVATIONS.items()}
"""The gated activation ("swiglu", "geglu") of each gate activation ("silu", "gelu_tanh")."""


# (no docstrings: a forward's constants must be the reference's, and transformers' have none)
def _llama_mlp_forward(self: Any, x: Any) -> Any:  # LlamaMLP / MistralMLP / Qwen2MLP / Qwen3MLP / GemmaMLP.forward
    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    return down_proj


def _plain_mlp_forward(self: Any, x: Any) -> Any:
    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _phi3_mlp_forward(self: Any, hidden_states: Any) -> Any:  # Phi3MLP.forward
    up_states = self.gate_up_proj(hidden_states)

    gate, up_states = up_states.chunk(2, dim=-1)
    up_states = up_states * self.activation_fn(gate)

    return self.down_proj(up_states)


REFERENCE_FORWARDS = (_llama_mlp_forward, _plain_mlp_forward)
"""The MLP forwards the gated activation is fused into: a parent class's forward must have one's bytecode."""


@dataclass(frozen=True)
class MLPForm:
    """A gated MLP's layout: the children a group fuses (``members``: gate_proj and up_proj, or one
    packed gate_up_proj whose rows are [gate; up]), its activation module's name, its reference
    forwards (the parent class's forward must have one's bytecode) and how the report writes them."""

    members: tuple[str, ...]
    act: str
    forwards: tuple[FunctionType, ...]
    written: str

    def keys(self) -> tuple[tuple[Any, ...], ...]:
        return tuple(code_key(f.__code__) for f in self.forwards)


LLAMA = MLPForm(MLP_NAMES, "act_fn", REFERENCE_FORWARDS,
                "down_proj(act_fn(gate_proj(x)) * up_proj(x)) as Llama's MLP writes it")
PACKED = MLPForm(("gate_up_proj",), "activation_fn", (_phi3_mlp_forward,),
                 "gate, up = gate_up_proj(x).chunk(2, dim=-1); down_proj(up * activation_fn(gate)) as Phi-3's MLP "
                 "writes it")
"""Phi-3's MLP (Phi-3, Phi-3.5-mini, Phi-4-mini): one gate_up_proj linear, then the gated activation."""


_REFERENCE_KEYS = {LLAMA: LLAMA.keys(), PACKED: PACKED.keys()}


def is_gated_mlp_forward(forward: Any, form: MLPForm = LLAMA) -> bool:
    """``forward`` is a plain function with the bytecode of one of ``form``'s reference forwards
    (:data:`REFERENCE_FORWARDS` for Llama's form)."""
    return has_code_of(forward, _REFERENCE_KEYS[form])


def _describe(act: nn.Module) -> str:
    return f"{type(act).__name__}, approximate={act.approximate!r}" if isinstance(act, nn.GELU) \
        else type(act).__name__


def _why_not_a_gate(act: nn.Module, act_name: str = "act_fn") -> str:
    """Why ``act``, which gate_activation refused, is not fused: exact GELU, not a torch.compile
    wrapper as torch.compile makes it, or neither SiLU nor tanh GELU (of the module a wrapper wraps)."""
    wrapped, why_not = compiled_module_of(act)
    if why_not is not None:
        return f"its {act_name} ({type(act).__name__}) is not what torch.compile(module) makes: {why_not}"
    module = act if wrapped is None else wrapped
    name = _describe(module) if wrapped is None else f"torch.compile of {_describe(module)}"
    if isinstance(module, nn.GELU) and type(module).forward is nn.GELU.forward and \
            vars(module).get("approximate") != "tanh":
        return f"its {act_name} ({name}) is exact GELU, not the tanh approximation the kernel applies"
    return f"its {act_name} ({name}) is neither SiLU nor GELU with the tanh approximation"


def _rows_reason(members: Sequence[nn.Module]) -> str | None:
    """Why the gate and up rows of ``members`` (gate_proj and up_proj, or one packed gate_up_proj)
    are not halves the gated kernel pairs, or None."""
    if len(members) == 2:
        gate, up = members
        if gate.out_features != up.out_features:
            return f"gate_proj has {gate.out_features} out_features but up_proj has {up.out_features}"
        return None
    n = members[0].out_features
    if n % 2 or (n // 2) % ROW_ALIGN:
        return (f"gate_up_proj has out_features = {n}: its halves (gate, up) are not multiples of {ROW_ALIGN} rows "
                "(the metadata's blocks)")
    return None


def glu_of(parent: nn.Module, members: Sequence[nn.Module], form: MLPForm = LLAMA) -> tuple[str | None, str | None]:
    """(the gated activation, "swiglu" or "geglu", fused into ``parent`` whose gate and up rows
    ``members`` hold (a fused group's: gate_proj and up_proj, or Phi-3's gate_up_proj); None) or
    (None, why not)."""
    rows = _rows_reason(members)
    if rows is not None:
        return None, rows
    if "down_proj" not in parent._modules:
        return None, "the module has no down_proj"
    act = parent._modules.get(form.act)
    if act is None:
        return None, f"the module has no {form.act} module"
    gate_act = gate_activation(act)
    if gate_act is None:
        return None, _why_not_a_gate(act, form.act)
    own = parent.__dict__.get("forward")
    if own is not None and not isinstance(getattr(own, "__self__", None), GatedForward):
        return None, "its forward is replaced on the instance"
    if not is_gated_mlp_forward(getattr(type(parent), "forward", None), form):
        return None, f"{type(parent).__name__}.forward is not {form.written}"
    return GLU_OF_GATE[gate_act], None


def _hooked(*modules: nn.Module) -> bool:
    """Any forward or backward hook, global or on one of ``modules``: the fused forward would skip it
    (a backward hook on act_fn that changes its grad_input, say, would leave the gradients wrong)."""
    return bool(_mm._global_forward_hooks or _mm._global_forward_pre_hooks or _mm._global_backward_hooks
                or _mm._global_backward_pre_hooks
                or any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                       for m in modules))


class GatedLinear(SparseLinear):
    """The fused [gate; up] weight of a group run with a gated activation ("swiglu", "geglu"):
    y (..., F) = act(x @ Wg.T + bg) * (x @ Wu.T + bu), F = half the rows. Its buffers are the
    group's fused layer's own tensors; not a registered module. Its eager forward applies the gated
    activation in the kernel where ``glu_in_kernel``, else through its twin ``_pre`` (activation
    None, the same output type) and torch (``glu_unfused``)."""

    _activations = OP_ACTIVATIONS
    _user_name = "SparseLinear"  # (the user built SparseLinear layers; this one is fuse_projections_')

    @classmethod
    def over(cls, fused: SparseLinear, activation: str) -> GatedLinear:
        layer = cls(fused.in_features, fused.out_features // 2, fused.bias is not None, dtype=fused.weight_dtype,
                    activation=activation, out_dtype=fused.out_dtype, device="meta")
        pre = SparseLinear(fused.in_features, fused.out_features, fused.bias is not None, dtype=fused.weight_dtype,
                           out_dtype=fused.out_dtype, device="meta")
        for name in ("values", "meta", "bias", "scale_w"):
            for target in (layer, pre):
                setattr(target, name, getattr(fused, name))  # the same tensors: no copy
        layer.__dict__["_pre"] = pre
        return layer

    def to_dense(self) -> torch.Tensor:
        """The pruned dense [gate; up] weight (2F, K) its buffers hold (the twin's)."""
        return self.__dict__["_pre"].to_dense()

    def check_metadata(self, words: torch.Tensor | None = None) -> None:
        """The metadata of the 2F rows (the twin's check), then both layers' records dropped."""
        self.__dict__["_pre"].check_metadata(words)
        self._invalidate()

    def _invalidate(self) -> None:
        super()._invalidate()
        pre = self.__dict__.get("_pre")
        if pre is not None:
            pre._invalidate()

    def _forward_eager(self, x: torch.Tensor) -> torch.Tensor:
        if needs_autograd(x, tensors_of(self.__dict__)):  # x's gradient through the frozen weight (autograd.py)
            return LayerWithInputGrad.apply(x, self.bias, self, self.values, self.meta, self.scale_w)
        last = self.__dict__["_last"]
        if last is not None:  # the steady state of a decode loop: the last call's record, launched directly
            y = last(x)
            if y is not None:
                return y
        tokens = x.numel() // self.in_features if x.dim() else 0
        if glu_in_kernel(tokens, x.device):
            return super()._forward_eager(x)
        # (..., 2F) pre-activations (the twin checks x), then torch
        return glu_unfused(self.__dict__["_pre"]._forward_eager(x), self.activation)


class GatedForward:
    """The forward of a gated MLP whose gate_proj and up_proj run in ``group``: ``down_proj(y)`` with
    y = the gated ``activation`` ("swiglu", "geglu") of the fused layer (:class:`GatedLinear`).
    Its :meth:`forward` is installed as ``parent.__dict__["forward"]``; it runs the class's own
    forward (gate_proj and up_proj as fused siblings) where the fused one would not compute the
    same: other arguments, hooks on gate_proj / up_proj / act_fn (or the module a torch.compile
    wrapper act_fn wraps), a replaced child, an act_fn changed (:mod:`.act_state`), a group given
    up (then uninstalled). Traced: the custom op with the gated activation where the group fuses in
    traces (``traced=True``), else the class's forward."""

    def __init__(self, parent: nn.Module, group: ProjectionGroup, activation: str, form: MLPForm = LLAMA):
        self.parent, self.group, self.form = parent, group, form
        self.act = parent._modules[form.act]
        self.linear = GatedLinear.over(group.fused, activation)
        # the act's own attributes as gate_activation saw them (act_unchanged): a reassigned one
        # (nn.GELU.approximate = "none") may compute another function than the kernel's; a
        # torch.compile wrapper's and the module's it wraps
        self._act_states = act_states(self.act)
        self._act_modules = act_modules(self._act_states)
        self._compiled_act = len(self._act_states) > 1  # act_fn is torch.compile(module) (compiled_act)

    def act_unchanged(self) -> bool:
        """act_fn (and the module it wraps, where it is what torch.compile makes) holds the attributes
        it held when this forward was made (the same objects, or equal strings and numbers), none
        added or removed, and no compiled call but its own (``act_fn.compile()``, before or after
        fusing, runs the same forward): :meth:`.act_state.ActState.unchanged` of each (a loop, not
        a generator, for the tracers)."""
        for state in self._act_states:
            if not state.unchanged():
                return False
        return True

    @property
    def activation(self) -> str:
        """The gated activation its layer applies ("swiglu", "geglu")."""
        return self.linear.activation

    def own_forward(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.parent).forward(self.parent, *args, **kwargs)

    def layers(self) -> tuple[SparseLinear, ...]:
        """The layers over the group's fused buffers that this forward runs (their records synced with it)."""
        return self.linear, self.linear.__dict__["_pre"]

    def _children_hold(self) -> bool:
        """gate_proj, up_proj (or gate_up_proj) and act_fn (activation_fn) are still the parent's
        children this forward was made for, without forward hooks."""
        modules = self.parent._modules
        members = self.group.members
        form = self.form
        for name, member in zip(form.members, members):  # (a loop, not a generator, for the tracers)
            if modules.get(name) is not member:
                return False
        return (modules.get(form.act) is self.act and not _hooked(*members, *self._act_modules)
                and self.act_unchanged())

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(x, torch.Tensor):
            return self.own_forward(x, *args, **kwargs)
        if tracing(x):
            return self._traced(x)
        group = self.group
        if group.fused is None or not self._children_hold():
            return self.own_forward(x)
        if not group.intact():
            group.release(own=True)  # (uninstalls this forward; the members run on their own weights)
            return self.own_forward(x)
        return self.parent._modules["down_proj"](self.linear._forward_eager(x))

    def _traced(self, x: torch.Tensor) -> Any:
        group = self.group
        if self._compiled_act and torch.compiler.is_compiling():
            # Dynamo traces a torch.compile wrapper as the module it wraps (VariableBuilder.wrap_module)
            # and, reaching act_fn here through two sources (the parent's child, this forward's), fails
            # an internal assertion (torch 2.13: "already tracked for mutation"): the class forward,
            # which calls act_fn once (gate and up as the group's traced siblings)
            return self.own_forward(x)
        if not group.traced or not group.traced_intact() or not self._children_hold():
            return self.own_forward(x)
        return self.parent._modules["down_proj"](self.linear._forward_op(x))

    def installed(self) -> bool:
        """This forward is the parent's (``parent.__dict__["forward"]``, a bound method of this object)."""
        return getattr(self.parent.__dict__.get("forward"), "__self__", None) is self

    def uninstall(self) -> None:
        """The parent's own forward again."""
        if self.installed():
            del self.parent.__dict__["forward"]


def install_glu(parent: nn.Module, group: ProjectionGroup, form: MLPForm = LLAMA) -> str | None:
    """Fuse the gated activation of ``parent``'s act_fn into its forward (its gate_proj and up_proj
    fused by ``group``), or say why not (:func:`glu_of`; the forward installed before then
    removed); one installed before for the same act_fn and still in place is kept (with its launch
    records). The activation is ``group.glu.activation``."""
    activation, reason = glu_of(parent, group.members, form)
    if reason is not None:
        uninstall_glu(group)
        return reason
    held = group.glu
    if held is not None and held.installed() and held.activation == activation \
            and held.act is parent._modules[form.act] and held.act_unchanged():
        return None
    uninstall_glu(group)
    glu = GatedForward(parent, group, activation, form)
    parent.__dict__["forward"] = glu.forward
    group.glu = glu
    return None


def uninstall_glu(group: ProjectionGroup) -> None:
    """Run ``group``'s MLP with its class's forward again (``fuse_projections_(glu=False)``)."""
    if group.glu is not None:
        group.glu.uninstall()
        group.glu = None
