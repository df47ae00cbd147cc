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

At run time the first sibling called with x runs the fused layer and a sibling called next with the
same x gets its columns of that result (projection_group.py, which also says what torch.compile
traces do with a group). Which layers fit together and how the fused layer is built:
group_build.py. This module is the public call, its checks of its arguments and its report.

The gated activation (``glu=True``): where the fused group is a Llama- or Gemma-style MLP's
gate_proj and up_proj (a SiLU or tanh-approximated GELU act_fn, a down_proj, the reference
forward), the MLP's forward is replaced on the instance by one that runs the fused layer with
SwiGLU or GeGLU in the kernel's epilogue (glu.py; docs/torch.md, "Fusing the gated activation
(SwiGLU, GeGLU)").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import SP_FUSE_GROUPS, SP_SPARSIFY_ARGUMENTS, IntegrationError
from .glu import LLAMA, MLP_NAMES, PACKED, MLPForm, glu_of, install_glu, uninstall_glu
from .group_build import fuse_group, mark_static, mismatch
from .layer_args import checked_model
from .linear import SparseLinear
from .projection_group import ProjectionGroup, fused_group_of  # (old pickles name fuse.ProjectionGroup)
from .wording import counted

LOG = logging.getLogger("sparsile.torch")
DEFAULT_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""The sibling projections fused by default: attention q/k/v and the gated MLP's gate/up (Llama,
Mistral, Qwen and most transformers decoders name them so)."""


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

