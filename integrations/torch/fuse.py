"""``fuse_projections_(model)``: sibling :class:`.SparseLinear` layers that read the same input run as one.

A transformer layer applies several projections to one input: Llama's attention q, k and v, its
MLP gate and up. At decode sizes each is a small, latency-bound kernel launch. Where the
projections of a group are :class:`.SparseLinear` layers of one parent that fit together (same
in_features, weight type, device, out_dtype, no fused activation, bias on all or none, every
out_features a multiple of 16, bias and scale_w one value per row), :func:`fuse_projections_`
builds one fused ``SparseLinear`` whose weight is the row-concatenation of theirs, and makes each
child's buffers row-slice *views* of the fused ones: no weight memory is duplicated, every child
still runs on its own, and ``state_dict()`` is unchanged (the fused layer is not a registered
submodule). Concatenating the "sm90" metadata words of the children gives the metadata of the
concatenated weight because each block of 16 rows is encoded on its own (docs/sparse-metadata.md
§4).

At run time (eager, or while a CUDA graph is captured) the first sibling called with x runs the
fused layer; a sibling called next with the *same tensor object* x (its ``_version`` unchanged)
gets its columns of that result, a view. Each member is served once per fused run; a member called
again, or with another x, runs the fused layer again.

Under torch.compile (or another tracer) each child runs its own custom op, unless the model was
fused with ``traced=True``: then a torch.compile trace holds one fused op per group (torch.export
swaps the buffers, so there each child still runs its own), and siblings are matched by identity
alone (a version check there would break the graph), so an in-place write to the shared input
between sibling calls *inside the compiled region* would not be seen. docs/torch.md ("Fusing
sibling projections") has the details.

The gated activation (``glu=True``): where the fused group is a Llama- or Gemma-style MLP's
gate_proj and up_proj (a SiLU or tanh-approximated GELU act_fn, a down_proj, the reference
forward), the MLP's forward is replaced on the instance by one that runs the fused layer with
SwiGLU or GeGLU in the kernel's epilogue (glu.py; docs/torch.md, "Fusing the gated activation
(SwiGLU, GeGLU)").
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import SP_FUSE_GROUPS, SP_SPARSIFY_ARGUMENTS, IntegrationError
from .glu import LLAMA, MLP_NAMES, PACKED, ROW_ALIGN, MLPForm, glu_of, install_glu, uninstall_glu
from .layer_args import checked_model
from .linear import SparseLinear
from .own_rows import own_rows
from .run_stamp import input_version, run_stamp
from .weight_versions import note_shared_weight
from .wording import counted

LOG = logging.getLogger("sparsile.torch")
DEFAULT_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""The sibling projections fused by default: attention q/k/v and the gated MLP's gate/up (Llama,
Mistral, Qwen and most transformers decoders name them so)."""
PARTIAL_RUNS_LIMIT = 8
"""A group is released after this many fused runs in a row that left members unserved (members fed
different inputs, as in cross-attention: fusing would only multiply the work)."""
_BUFFER_NAMES = ("values", "meta", "bias", "scale_w")
_WATCHED_NAMES = (*_BUFFER_NAMES, "input_scale")
"""The buffers a member must still hold as fused (a static ``input_scale`` given since: none, so that
the member runs unfused, never served a sibling's run quantized per token)."""


@dataclass
class FuseReport:
    """What :func:`fuse_projections_` did: the fused groups (``"parent.q_proj+k_proj+v_proj"``)
    and, for each group it could not fuse, why."""

    fused: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)  # fused before, by an earlier call, and left so
    glu: dict[str, str] = field(default_factory=dict)  # gate_proj+up_proj group -> the gated activation its
    # MLP runs in the kernel ("swiglu", "geglu")
    no_glu: dict[str, str] = field(default_factory=dict)  # gate_proj+up_proj groups fused without it, and why
    glu_asked: bool = False  # fuse_projections_(glu=True)
    glu_removed: list[str] = field(default_factory=list)  # MLPs given their own forward back (glu=False)

    def __str__(self) -> str:
        glu = ""
        if self.glu_asked:
            kinds = sorted(set(self.glu.values()))
            named = kinds[0] if len(kinds) == 1 else ", ".join(
                f"{sum(a == kind for a in self.glu.values())} {kind}" for kind in kinds)
            glu = f"; gated activation fused into {counted(len(self.glu), 'MLP')}" + (f" ({named})" if kinds else "")
        if self.glu_removed:
            glu += f"; gated activation removed from {counted(len(self.glu_removed), 'MLP')} (glu=False)"
        lines = [f"fuse_projections_: {counted(len(self.fused), 'projection group')} fused, {len(self.kept)} already "
                 f"fused, {len(self.skipped)} skipped{glu}"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        lines += [f"  no gated activation for {name}: {why}" for name, why in self.no_glu.items()]
        return "\n".join(lines)


class ProjectionGroup:
    """The fused layer of one group of sibling :class:`.SparseLinear` layers and the run it last
    made. Each member holds ``(group, index)`` in its ``__dict__["_fused"]``; its ``forward`` (when
    not tracing) calls :meth:`run`."""

    def __init__(self, fused: SparseLinear, members: Sequence[SparseLinear], traced: bool = False):
        self.fused = fused
        self.traced = traced  # also fuse in torch.compile traces (identity-matched there)
        self.members = tuple(members)
        starts = [0]
        for m in self.members:
            starts.append(starts[-1] + m.out_features)
        self.rows = tuple(itertools.pairwise(starts))
        self.sizes = tuple(m.out_features for m in self.members)
        self.cuts = tuple(a for a, _ in self.rows[1:])  # where each member's columns after the first start
        self.full = (1 << len(self.members)) - 1
        self.expect = self._expected()
        self.held = self._held()
        self.params = tuple(m._parameters for m in self.members)  # (where a buffer made an nn.Parameter goes)
        self.pending: list[Any] | None = None  # [x, x's version, y's column views, bitmask of the members served,
        # the run's run_stamp]
        self.checked = True  # the views were verified since the last _invalidate of a member
        self.runs = 0  # fused launches (tests count them)
        self.partial = 0  # fused runs in a row that ended with members unserved
        self.glu: Any = None  # the parent MLP's glu.GatedForward, where its gated activation is fused

    def attach(self) -> None:
        for i, m in enumerate(self.members):
            m.__dict__["_fused"] = (self, i)

    def release(self, own: bool = False) -> None:
        """Stop fusing: every member runs on its own again. Its buffers are left as they are, or, with
        ``own`` (a release at run time), those still views of the fused copy are copied, so that a write
        to one member no longer counts for its siblings (own_rows.py)."""
        for m in self.members:
            if m.__dict__.get("_fused", (None,))[0] is self:
                del m.__dict__["_fused"]
        self.pending = None
        uninstall_glu(self)  # the parent MLP's own forward again
        fused, self.fused = self.fused, None  # its memory is freed once no member holds a view of it
        if own and fused is not None:
            own_rows(fused, self.members, _BUFFER_NAMES)

    def layers(self) -> tuple[SparseLinear, ...]:
        """The layers over the fused buffers (the fused layer, and the gated forward's): their
        launch records are brought up to in-place writes and rebuilt with the fused layer's."""
        fused = self.fused
        if fused is None:
            return ()
        return (fused, *(() if self.glu is None else self.glu.layers()))

    def invalidate(self) -> None:
        """A member's buffers may have changed (``SparseLinear._invalidate``): verify before the next run."""
        self.checked = False
        self.pending = None

    def settle(self) -> None:
        """Verify the members now (after a member's ``_apply``): release the group when one no longer
        holds its views (moved, replaced), so that its fused copy is freed even if the model then
        only runs traced; else the group stays verified."""
        if self.fused is not None and not self.intact():
            LOG.info("fused projections: a member was moved or its buffers replaced; running the group "
                     "unfused (call fuse_projections_ again to fuse it)")
            self.release()

    def _expected(self) -> tuple[tuple[dict, str, torch.Tensor | None, int], ...]:
        """(a member's buffer dict, buffer name, the view it must still hold, that view's address), for
        every member and buffer: what each fused run checks (``layer._buffers[name] = t`` and
        ``layer.values.data = t`` bypass ``SparseLinear.__setattr__``, so nothing else reports them)."""
        return tuple((m._buffers, name, view, 0 if view is None else view.data_ptr())
                     for m in self.members for name in _WATCHED_NAMES for view in (m._buffers.get(name),))

    def intact(self) -> bool:
        """Each member still holds the views this group made, at their addresses, and (after an
        invalidation, a copy or an unpickling) each view still lies where it should in the fused
        buffers and no member has an activation or an out_dtype the fused layer does not apply (set
        after fusing)."""
        checked = self.checked  # (else the addresses are verified below, against the fused buffers)
        if self._parameter_made():
            return False
        for buffers, name, view, ptr in self.expect:
            if buffers.get(name) is not view or (checked and ptr and view.data_ptr() != ptr):
                return False
            if ptr and view.requires_grad:  # made trainable (a bias) since: the fused layer's buffers are other
                return False  # tensors, its gradient would not reach the member's (unfused, it does; or SP0922)
        if not checked:
            for m in self.members:  # set after fusing (SparseLinear.__setattr__ invalidates): the fused
                # layer has no activation and one out_dtype, so such a member runs unfused
                if m.activation is not None or m.out_dtype != self.fused.out_dtype:
                    return False
            for m, (a, b) in zip(self.members, self.rows):
                for name in _BUFFER_NAMES:
                    whole, part = self.fused._buffers.get(name), m._buffers.get(name)
                    if whole is None or part is None:
                        if whole is not part:
                            return False
                        continue
                    expected = whole[a:b]
                    if not (part.device == whole.device and part.dtype == whole.dtype
                            and part.shape == expected.shape and part.stride() == expected.stride()
                            and part.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
                            and part.data_ptr() == expected.data_ptr()):
                        return False
            self._reviewed()
            for layer in self.layers():  # as a member's own records, the fused layers' are rebuilt after a change
                layer._invalidate()
            self.expect = self._expected()  # (a copy's views are at addresses of its own)
            self.held = self._held()
            self.checked = True
        return True

    def _reviewed(self) -> None:
        """Make each member's buffer that lies where it should in a fused buffer but is no view of it a
        view of it again (called by :meth:`intact` once the layout is verified). ``copy.deepcopy`` and
        ``torch.load`` keep the shared storage but give each tensor a version counter of its own, so a
        write to a member's weight moved none of the fused layer's counters: the fused run's backward
        computed x's gradient with the written rows without a word (weight_versions.py), and a sibling
        was served a run from before the write. Views share their base's counter."""
        with torch.no_grad():
            for m, (a, b) in zip(self.members, self.rows):
                replaced = False
                for name in _BUFFER_NAMES:
                    whole, part = self.fused._buffers.get(name), m._buffers.get(name)
                    if whole is None or part is None or whole.is_inference():  # (an inference tensor keeps no counter)
                        continue
                    base = whole._base if whole._is_view() else whole
                    if part._base is not base:
                        m._buffers[name] = whole[a:b]  # (the same memory: verified by intact)
                        replaced = True
                if replaced:
                    m._invalidate()  # (its records hold the tensors it had)

    def run(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Member ``index``'s output for x: its columns of the fused run that the previous sibling
        started with this same x, or of a new fused run."""
        p = self.pending
        fused = self.fused  # read once: another thread may release the group
        if (p is not None and p[0] is x and not (p[3] >> index) & 1 and p[1] == input_version(x)
                and fused is not None and p[4] == run_stamp(fused, x) and self._holds(index)):
            return self._serve(p, index)
        if fused is None or not self.intact():
            LOG.info("fused projections: a member's buffers were replaced, moved or made parameters, or require "
                     "grad; running them unfused (call fuse_projections_ again to fuse them)")
            self.release(own=True)
            return self.members[index].forward(x)
        # a run that left siblings unserved: they read another input (cross-attention's k and v read the
        # encoder's states, q the decoder's), so fusing only multiplies the work: give up after a few
        self.partial = self.partial + 1 if p is not None else 0
        self.pending = None
        if self.partial >= PARTIAL_RUNS_LIMIT:
            LOG.info("fused projections: the members of a group keep reading different inputs "
                     "(cross-attention?); running them unfused")
            self.release(own=True)
            return self.members[index].forward(x)
        version, stamp = input_version(x), run_stamp(fused, x)
        parts = self._columns(fused.forward(x), stamp[0])
        self.runs += 1
        return self._start(x, version, parts, index, stamp)

    def run_traced(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """:meth:`run` while torch.compile traces the model (``traced=True``): the fused
        custom op once per group in the trace, siblings matched by identity (no version counter in a
        trace). A member whose views are not verified (replaced, moved, loaded) runs its own op."""
        p = self.pending
        if p is not None and p[0] is x and not (p[3] >> index) & 1:
            return self._serve(p, index)
        self.pending = None
        fused = self.fused
        if fused is None or not self.traced_intact():
            return self.members[index]._forward_op(x)
        return self._start(x, -1, self._columns(fused._forward_op(x), True), index)

    def _held(self) -> tuple[tuple[dict, tuple[tuple[str, torch.Tensor | None, int], ...]], ...]:
        """Per member, (its buffer dict, (name, the view it must hold, that view's address) for each
        buffer): :attr:`expect` by member, for :meth:`_holds`."""
        n = len(_WATCHED_NAMES)
        return tuple((self.expect[i * n][0], tuple((name, view, ptr) for _, name, view, ptr in
                                                   self.expect[i * n:i * n + n]))
                     for i in range(len(self.members)))

    def _holds(self, index: int) -> bool:
        """Member ``index`` still holds its views, none requiring grad nor made a parameter: what
        :meth:`intact` checks of it, checked again before it is served a sibling's run (in between, a
        forward pre-hook may have made its bias trainable, or ``torch.func.functional_call`` on the
        member alone put a substitute in its ``_buffers``: served, it got columns off the graph, or
        made with the tensor it no longer holds, without a word), each view still at its address
        (``member.bias.data = t`` keeps the object and gives it other memory: served, the member got
        the columns of its old bias). Else the caller's :meth:`intact` releases the group, and the
        member runs unfused. (About 0.4 us a served call on a slow host.)"""
        params = self.params[index]
        if params and not params.keys().isdisjoint(_WATCHED_NAMES):
            return False
        buffers, views = self.held[index]
        for name, view, ptr in views:
            if buffers.get(name) is not view or (view is not None and (view.requires_grad or view.data_ptr() != ptr)):
                return False
        return True

    def _parameter_made(self) -> bool:
        """A member's values, meta, bias or scale_w was made an ``nn.Parameter`` since it was fused
        (``m.bias = nn.Parameter(b)``: torch moves the name out of ``_buffers``, so a member fused without
        a bias would still look intact, and its new bias be dropped)."""
        for params in self.params:
            if params and not params.keys().isdisjoint(_WATCHED_NAMES):
                return True
        return False

    def traced_intact(self) -> bool:
        """What a trace checks of :meth:`intact`: the members' views verified since their last change
        and still in place (torch.export swaps the buffers), none requiring grad or made a parameter."""
        return self.checked and not self._parameter_made() and all(
            buffers.get(name) is view and (view is None or not view.requires_grad)
            for buffers, name, view, _ in self.expect)

    def _columns(self, y: torch.Tensor, grad_mode: bool) -> Sequence[torch.Tensor]:
        """The members' column views of the fused output y. With grad mode on (and in traces), one
        slice each (``tensor_split``): a member's output may then be written in place, as an unfused
        member's may (a forward hook editing it, ``q.view(...).mul_(s)``); ``split_with_sizes``' views
        are the outputs of one multi-output view op, which autograd refuses to write in place (a
        RuntimeError the unfused model did not raise, also where only the written operand requires
        grad). Otherwise ``split_with_sizes`` (one call for every member's view, about 1 us less on a
        slow host: the decode loop under ``torch.no_grad()`` / ``inference_mode``; there torch allows
        in-place writes to either view)."""
        if grad_mode:
            return y.tensor_split(self.cuts, -1)
        return y.split_with_sizes(self.sizes, -1)

    def _serve(self, p: list[Any], index: int) -> torch.Tensor:
        """Member ``index``'s columns of the pending run ``p`` (matched by the caller), marked
        served; the run is dropped once every member was served."""
        served = p[3] | (1 << index)
        if served == self.full:
            self.pending = None
        else:
            p[3] = served
        return p[2][index]

    def _start(self, x: torch.Tensor, version: int, parts: Sequence[torch.Tensor], index: int,
               stamp: tuple[Any, ...] = ()) -> torch.Tensor:
        """Member ``index``'s columns of a new fused run, kept for the siblings still owed theirs
        (``stamp``: the run's :func:`.run_stamp.run_stamp`, eager runs only)."""
        if self.full != 1 << index:
            self.pending = [x, version, parts, 1 << index, stamp]
        return parts[index]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "cuts" not in state:  # (a group pickled before the members' columns were sliced)
            self.cuts = tuple(a for a, _ in self.rows[1:])
        self.held = self._held()  # (a group pickled before a served member's views were checked, or their addresses)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["pending"], state["runs"] = None, 0
        state["checked"] = False  # a copy may not share the fused storage (plain pickle does not)
        return state


def checked_groups(groups: Any) -> tuple[tuple[str, ...], ...]:
    """``groups`` as a tuple of name tuples, or SP0944 when it is not a sequence of groups of at
    least two distinct child names."""
    help_ = "pass a sequence of name tuples, e.g. [('q_proj', 'k_proj', 'v_proj'), ('gate_proj', 'up_proj')]"
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence) or not groups:
        raise IntegrationError(SP_FUSE_GROUPS, f"groups must be a non-empty sequence of name tuples, got {groups!r}",
                               help=help_)
    out = []
    for group in groups:
        if isinstance(group, (str, bytes)) or not isinstance(group, Sequence) or len(group) < 2 \
                or not all(isinstance(n, str) and n and "." not in n for n in group) or len(set(group)) != len(group):
            raise IntegrationError(SP_FUSE_GROUPS, f"projection group {group!r} is not a tuple of two or more distinct "
                                   "child module names", help=help_)
        out.append(tuple(group))
    return tuple(out)


def mismatch(children: Sequence[tuple[str, nn.Module]]) -> str | None:
    """Why these named children cannot be fused, or None."""
    seen: dict[int, str] = {}
    for name, m in children:
        if id(m) in seen:
            return f"{name} is the same module as {seen[id(m)]}"
        seen[id(m)] = name
        if type(m) is not SparseLinear:
            return f"{name} is a {type(m).__name__}, not a SparseLinear"
        if m.activation is not None:
            return f"{name} fuses activation {m.activation!r}"
        if m._buffers.get("input_scale") is not None:
            return (f"{name} has a static input scale (input_scale; the fused layer quantizes x per token, or with "
                    "one scale for all its rows)")
        if m.out_features % ROW_ALIGN:
            return (f"{name} has out_features = {m.out_features}, not a multiple of {ROW_ALIGN} (its metadata rows "
                    "would not be a slice of the fused layer's)")
        if "_fused" in m.__dict__:
            return f"{name} is already fused"
        if m.values.device.type == "meta":
            return f"{name} is on the meta device (no weights yet)"
        other = next((what for what in _BUFFER_NAMES[1:] if getattr(m, what) is not None
                      and getattr(m, what).device != m.values.device), None)
        if other is not None:  # (a model loaded or moved in part: the concatenation would raise midway)
            return f"{name} has its {other} on {getattr(m, other).device} but its values on {m.values.device}"
        if not all(t is None or t.is_contiguous() for t in (m.values, m.meta, m.bias, m.scale_w)):
            return f"{name} has non-contiguous buffers"
        trained = [what for what in _BUFFER_NAMES if getattr(m, what) is not None and getattr(m, what).requires_grad]
        if trained:
            return (f"{name}'s {trained[0]} requires grad (the fused layer's buffers are other tensors: its gradient "
                    "would not reach it)")
        made = [what for what in _BUFFER_NAMES if what in m._parameters]
        if made:
            return (f"{name}'s {made[0]} is an nn.Parameter (the fused layer's buffers are other tensors: fusing "
                    "would replace it by a view of them, which a parameter cannot be)")
        for what, vector in (("bias", m.bias), ("scale_w", m.scale_w)):  # a per-tensor scale_w (1,) is no row
            if vector is not None and tuple(vector.shape) != (m.out_features,):  # slice of a concatenation
                return (f"{name} has {what} of shape {tuple(vector.shape)}, not one value per output feature "
                        f"({m.out_features},)")
    (first_name, first), rest = children[0], children[1:]
    for name, m in rest:
        for what, a, b in (("in_features", m.in_features, first.in_features),
                           ("weight dtype", m.weight_dtype, first.weight_dtype),
                           ("device", m.values.device, first.values.device),
                           ("out_dtype", m.out_dtype, first.out_dtype),
                           ("bias", m.bias is not None, first.bias is not None)):
            if a != b:
                return f"{name} has {what} {a} but {first_name} has {b}"
    return None


def mark_static(fused: SparseLinear) -> None:
    """The fused buffers belong to no registered module: tell torch.compile's CUDA graph trees their
    addresses are fixed (else reduce-overhead would copy the weight into the graph on every replay)."""
    for name in _BUFFER_NAMES:
        if getattr(fused, name) is not None:
            torch._dynamo.mark_static_address(getattr(fused, name))


def fused_buffers(members: Sequence[SparseLinear]) -> dict[str, torch.Tensor]:
    """The row-concatenation of ``members``' buffers (values, meta, bias, scale_w where they have them)."""
    with torch.no_grad():
        return {name: torch.cat([getattr(m, name) for m in members]) for name in _BUFFER_NAMES
                if getattr(members[0], name) is not None}


def fuse_group(members: Sequence[SparseLinear], traced: bool = False, names: Sequence[str] = ()) -> ProjectionGroup:
    """Fuse ``members`` (checked by :func:`mismatch`): the fused layer, the members' buffers made
    views of its buffers, the members attached. ``names``: the members' paths in the model, which the
    backward's refusal of a weight written since the forward names (weight_versions.py: the views share
    one version counter, so a write to one member counts for every member and the fused layer)."""
    first = members[0]
    n = sum(m.out_features for m in members)
    fused = SparseLinear(first.in_features, n, first.bias is not None, dtype=first.weight_dtype,
                         out_dtype=first.out_dtype, device="meta")
    buffers = fused_buffers(members)  # (the one step that allocates: before any member changes)
    with torch.no_grad():
        for name, whole in buffers.items():
            setattr(fused, name, whole)
        start = 0
        for m in members:
            end = start + m.out_features
            for name in _BUFFER_NAMES:
                whole = getattr(fused, name)
                if whole is not None:
                    setattr(m, name, whole[start:end])  # a view; SparseLinear.__setattr__ drops its launch records
            start = end
    if names:
        note_shared_weight(fused, tuple(names), None)
        for i, m in enumerate(members):
            note_shared_weight(m, tuple(names), i)
    if traced:
        mark_static(fused)
    group = ProjectionGroup(fused, members, traced)
    group.attach()
    return group


def fuse_projections_(model: nn.Module, groups: Any = DEFAULT_GROUPS, *, traced: bool = False,
                      glu: bool = True) -> FuseReport:
    """For every module of ``model`` whose children named by a group (default
    :data:`DEFAULT_GROUPS`) fit together, run them as one fused :class:`.SparseLinear` (in place).

    A module that has every child of a group is a candidate; its group is fused when all are
    ``SparseLinear`` with the same in_features, weight dtype, device and out_dtype, no fused
    activation, a bias on all or none, out_features multiples of 16, and a bias and scale_w of one
    value per output feature (not a per-tensor scale_w); otherwise it is skipped,
    with the reason in the returned :class:`FuseReport` (logged at INFO on ``sparsile.torch``).
    Call it again after moving the model (``model.to(device)``): a moved or replaced member makes
    its group fall back to unfused runs, never to stale weights. Bad ``groups``: SP0944.

    ``traced=True`` fuses inside torch.compile traces too (one fused custom op per group in
    the graph); siblings are matched there by identity alone, so the model must not write in place
    to a group's shared input between the sibling calls (transformers' decoders do not).

    ``glu=True`` (the default): where a fused ``("gate_proj", "up_proj")`` group belongs to a Llama-
    or Gemma-style MLP (glu.py: a ``down_proj``, Llama's forward, and an ``act_fn`` that
    :func:`~.gate.gate_activation` recognizes as SiLU or tanh-approximated GELU), the MLP runs
    SwiGLU or GeGLU in the fused kernel's epilogue (``report.glu``: group -> "swiglu" or "geglu";
    ``report.no_glu`` says why not elsewhere; docs/torch.md, "Fusing the gated activation (SwiGLU,
    GeGLU)"). ``glu=False`` keeps (or makes again) the MLP's own forward (``report.glu_removed``).

    A call that raises midway (a device out of memory at a group's concatenation) is undone: the
    groups it fused released (their members keep their weights, as views of the fused copy), the
    gated forwards it installed removed, the kept groups as they were (docs/torch.md, "When a call
    raises").
    """
    checked_model(model, "fuse_projections_")
    groups = checked_groups(groups)
    checked_flag(glu, "glu", "fuse_projections_")
    checked_flag(traced, "traced", "fuse_projections_")
    report = FuseReport(glu_asked=glu)
    undo: list[Callable[[], None]] = []  # what this call did, undone (last first) if it raises
    try:
        _fuse_groups(model, groups, traced, glu, report, undo)
        if MLP_NAMES in groups:  # (the gate/up group, which Phi-3's MLP holds packed in one gate_up_proj)
            _fuse_packed(model, traced, glu, report, undo)
    except BaseException:
        for step in reversed(undo):
            step()
        raise
    LOG.info("%s", report)
    return report


def _fuse_groups(model: nn.Module, groups: tuple[tuple[str, ...], ...], traced: bool, glu: bool, report: FuseReport,
                 undo: list[Callable[[], None]]) -> None:
    """:func:`fuse_projections_`'s work, each edit of the model with its undo step in ``undo``."""
    for fqn, parent in list(model.named_modules()):
        children = parent._modules  # named_children() would hide a module registered under two names
        for group in groups:
            if not all(name in children for name in group):
                continue
            key = f"{fqn + '.' if fqn else ''}{'+'.join(group)}"
            named = [(name, children[name]) for name in group]
            for _, m in named:  # a stale group (its members moved or replaced) is released first
                held = m.__dict__.get("_fused") if isinstance(m, SparseLinear) else None
                if held is not None and not held[0].intact():
                    held[0].release()
            same = fused_group_of(named[0][1]) if isinstance(named[0][1], SparseLinear) else None
            if same is not None and same.members == tuple(m for _, m in named):  # fused already: kept,
                if traced and not same.traced:  # and fused in traces too if asked now
                    mark_static(same.fused)
                    same.traced = True
                    undo.append(functools.partial(setattr, same, "traced", False))
                report.kept.append(key)
                _fuse_glu(parent, same, group, glu, key, report, undo)
                continue
            reason = mismatch(named)
            if reason is not None:
                report.skipped[key] = reason
                continue
            fused = fuse_group([m for _, m in named], traced, [f"{fqn + '.' if fqn else ''}{name}" for name in group])
            # (undone by release: the members run unfused again, their weights in views of the fused copy; their
            # own tensors were freed as it was made, so that fusing costs the memory of one group at a time)
            undo.append(fused.release)
            report.fused.append(key)
            _fuse_glu(parent, fused, group, glu, key, report, undo)


def _fuse_packed(model: nn.Module, traced: bool, glu: bool, report: FuseReport,
                 undo: list[Callable[[], None]]) -> None:
    """The gated activation of each Phi-3-style MLP (glu.PACKED: a SparseLinear ``gate_up_proj``
    whose rows are [gate; up], an ``activation_fn``, a ``down_proj``, Phi-3's forward) fused into
    its forward where ``glu``: its gate_up_proj runs as a group of one member (fuse_group copies its
    buffers once, the member's become views of them), so that the gated forward of glu.py, its
    checks and launch records apply as to a fused gate/up pair. ``report.glu`` names it
    ``parent.gate_up_proj``; ``report.no_glu`` says why not for a SparseLinear gate_up_proj next to
    a down_proj that does not fit."""
    for fqn, parent in list(model.named_modules()):
        member = parent._modules.get("gate_up_proj")
        if not isinstance(member, SparseLinear) or "down_proj" not in parent._modules:
            continue
        key = f"{fqn + '.' if fqn else ''}gate_up_proj"
        held = fused_group_of(member)
        if held is not None and not held.intact():
            held.release()
            held = None
        if held is not None and held.members != (member,):
            continue  # (fused with siblings by a group of the caller's: not Phi-3's packed form)
        if held is not None:
            report.kept.append(key)
            if traced and not held.traced:
                mark_static(held.fused)
                held.traced = True
                undo.append(functools.partial(setattr, held, "traced", False))
            _fuse_glu(parent, held, MLP_NAMES, glu, key, report, undo, PACKED)
            continue
        if not glu:
            continue
        _, reason = glu_of(parent, (member,), PACKED)
        reason = reason or mismatch([("gate_up_proj", member)])
        if reason is not None:
            report.no_glu[key] = reason
            continue
        group = fuse_group([member], traced, [key])
        undo.append(group.release)
        _fuse_glu(parent, group, MLP_NAMES, glu, key, report, undo, PACKED)
        if group.glu is None:  # (not installed, the reason in report.no_glu: the group of one would serve nothing)
            group.release()


def _glu_back(group: ProjectionGroup, held: Any, installed: bool) -> None:
    """Undo step: ``group``'s gated forward as it was (``held``, installed on its MLP or not)."""
    if group.glu is not held and group.glu is not None:
        group.glu.uninstall()
    group.glu = held
    if held is not None and installed and not held.installed():
        held.parent.__dict__["forward"] = held.forward


def _fuse_glu(parent: nn.Module, group: ProjectionGroup, names: tuple[str, ...], wanted: bool, key: str,
              report: FuseReport, undo: list[Callable[[], None]], form: MLPForm = LLAMA) -> None:
    """The gated activation fused into ``parent``'s forward (glu.py) where ``wanted`` and ``names``
    are the gated MLP's gate_proj and up_proj, noted in ``report``; ``wanted`` False: the parent's
    own forward."""
    if names != MLP_NAMES:
        return
    undo.append(functools.partial(_glu_back, group, group.glu, group.glu is not None and group.glu.installed()))
    if not wanted:
        if group.glu is not None and group.glu.installed():
            report.glu_removed.append(key)
        uninstall_glu(group)
        return
    reason = install_glu(parent, group, form)
    if reason is None:
        report.glu[key] = group.glu.activation
    else:
        report.no_glu[key] = reason


def checked_flag(value: Any, name: str, where: str) -> None:
    """SP0907 unless ``value`` is True or False (a truthy string would turn an option on)."""
    if not isinstance(value, bool):
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, f"{where}: {name} must be True or False, got {value!r}",
                               help=f"pass {name}=True or {name}=False")


def fused_group_of(layer: nn.Module) -> ProjectionGroup | None:
    """The group ``layer`` runs in, or None (not fused, or fusion was given up)."""
    held = layer.__dict__.get("_fused")
    return None if held is None else held[0]
