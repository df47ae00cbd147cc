"""A fused group of ``fuse_projections_`` (fuse.py) at run time: :class:`ProjectionGroup` serves
each member its columns of one fused run and verifies, before it does, that the members still hold
the views of the fused buffers that group_build.py gave them.

At run time (eager, or while a CUDA graph is captured) the first sibling called with x runs the
fused layer; a sibling called next with the *same tensor object* x (its ``_version`` unchanged, and
the run's stamp the same: run_stamp.py) gets its columns of that result, a view. Each member is
served once per fused run; a member called again, or with another x, runs the fused layer again.
A group whose members no longer hold their views (moved, replaced, made parameters or trainable),
or whose members keep reading different inputs, is released: its members run on their own, given
copies of their rows (own_rows.py).

Under torch.compile (or another tracer) each child runs its own custom op, unless the model was
fused with ``traced=True``: then a torch.compile trace holds one fused op per group (torch.export
swaps the buffers, so there each child still runs its own), and siblings are matched by identity
alone (a version check there would break the graph), so an in-place write to the shared input
between sibling calls *inside the compiled region* would not be seen. docs/torch.md ("Fusing
sibling projections") has the details.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .glu import uninstall_glu
from .linear import SparseLinear
from .own_rows import keep_replayed, own_rows
from .run_stamp import counter, run_stamp

LOG = logging.getLogger("sparsile.torch")
PARTIAL_RUNS_LIMIT = 8
"""A group is released after this many fused runs in a row that left members unserved (members fed
different inputs, as in cross-attention: fusing would only multiply the work)."""
BUFFER_NAMES = ("values", "meta", "bias", "scale_w")
"""A member's buffers that are row views of the fused layer's."""
WATCHED_NAMES = (*BUFFER_NAMES, "input_scale")
"""The buffers a member must still hold as fused (a static ``input_scale`` given since: none, so that
the member runs unfused, never served a sibling's run quantized per token)."""


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
        to one member no longer counts for its siblings (own_rows.py). Where a CUDA graph captured a launch
        of the group's layers, the members that still view the fused buffers keep those layers, whose
        records the graph replays, and sync them at their next ``load_state_dict`` (own_rows.keep_replayed)."""
        layers = self.layers()  # (before the gated forward goes: a graph may have captured its layer)
        for m in self.members:
            if m.__dict__.get("_fused", (None,))[0] is self:
                del m.__dict__["_fused"]
        self.pending = None
        uninstall_glu(self)  # the parent MLP's own forward again
        fused, self.fused = self.fused, None  # its memory is freed once no member holds a view of it
        if own and fused is not None:
            own_rows(fused, self.members, BUFFER_NAMES, layers)
        if fused is not None:  # (a graph that replays a fused launch: its records live on with the members)
            keep_replayed(fused, self.members, layers)

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
                     for m in self.members for name in WATCHED_NAMES for view in (m._buffers.get(name),))

    def intact(self) -> bool:
        """Each member still holds the views this group made, at their addresses, and (after an
        invalidation, a copy or an unpickling) each view still lies where it should in the fused
        buffers, no member has an activation or an out_dtype the fused layer does not apply (set
        after fusing), and the fused buffers are no inference tensors (a copy made under
        ``torch.inference_mode()``: they keep no version counter, group_build.counted)."""
        checked = self.checked  # (else the addresses are verified below, against the fused buffers)
        fused = self.fused  # (read once: another thread's release sets it to None)
        if fused is None or self._parameter_made():
            return False
        for buffers, name, view, ptr in self.expect:
            if buffers.get(name) is not view or (checked and ptr and view.data_ptr() != ptr):
                return False
            if ptr and view.requires_grad:  # made trainable (a bias) since: the fused layer's buffers are other
                return False  # tensors, its gradient would not reach the member's (unfused, it does; or SP0922)
        if not checked:
            if any(t is not None and t.is_inference() for t in fused._buffers.values()):
                return False  # (a copy made under inference_mode: no version counters, so no write would be seen
                # between sibling calls; its members run unfused, each with its weight as it is: group_build.counted)
            for m in self.members:  # set after fusing (SparseLinear.__setattr__ invalidates): the fused
                # layer has no activation and one out_dtype, so such a member runs unfused
                if m.activation is not None or m.out_dtype != fused.out_dtype:
                    return False
            for m, (a, b) in zip(self.members, self.rows):
                for name in BUFFER_NAMES:
                    whole, part = fused._buffers.get(name), m._buffers.get(name)
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
                for name in BUFFER_NAMES:
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
        if (p is not None and p[0] is x and not (p[3] >> index) & 1 and p[1] == counter(x)
                and fused is not None and p[4] == run_stamp(fused, x) and self._holds(index)):
            return self._serve(p, index)
        if fused is None or not self.intact():
            LOG.info("fused projections: a member's buffers were replaced, moved or made parameters, or require "
                     "grad; running them unfused (or the group was copied under inference_mode: no version "
                     "counters; call fuse_projections_ again to fuse them)")
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
        version, stamp = counter(x), run_stamp(fused, x)
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
        n = len(WATCHED_NAMES)
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
        if params and not params.keys().isdisjoint(WATCHED_NAMES):
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
            if params and not params.keys().isdisjoint(WATCHED_NAMES):
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


def fused_group_of(layer: nn.Module) -> ProjectionGroup | None:
    """The group ``layer`` runs in, or None (not fused, or fusion was given up)."""
    held = layer.__dict__.get("_fused")
    return None if held is None else held[0]
