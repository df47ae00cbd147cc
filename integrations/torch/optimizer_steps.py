"""Optimizer steps that bump no version counter: global step hooks of ``torch.optim`` for the layers
and launch records that watch their tensors through ``Tensor._version`` (docs/torch.md, "A weight
written in place"; docs/training.md, "Master weight and re-compression").

torch's fused optimizers (``fused=True``: transformers' default ``adamw_torch_fused``) write every
parameter of a step in one kernel, without bumping the parameters' version counters, so a cache that
compares the counters misses the step. Each *watcher* (:func:`watch_optimizer_steps`) is given the
parameters an optimizer is about to step and returns what to do once the step is over (or None).
Two hooks are registered, once, on the first watcher, for every optimizer of the process."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

AfterStep = Callable[[], None]
Watcher = Callable[[list[torch.Tensor]], AfterStep | None]
"""Given the parameters an optimizer is about to step: what to call after the step, or None."""

_WATCHERS: list[Watcher] = []
_PENDING: weakref.WeakKeyDictionary[Any, list[AfterStep]] = weakref.WeakKeyDictionary()
"""An optimizer in its step -> what its watchers asked to call after it."""
_HOOKS: list[Any] = []


def watch_optimizer_steps(watcher: Watcher) -> None:
    """Call ``watcher`` before every optimizer step from now on (once, however often it is given),
    and what it returns after the step; registers the global step hooks on the first call."""
    if watcher not in _WATCHERS:
        _WATCHERS.append(watcher)
    if not _HOOKS:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        _HOOKS.append(register_optimizer_step_pre_hook(_before_step))
        _HOOKS.append(register_optimizer_step_post_hook(_after_step))


def _before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    after = [a for a in (watcher(params) for watcher in tuple(_WATCHERS)) if a is not None]
    if after:
        _PENDING[optimizer] = after
    else:
        _PENDING.pop(optimizer, None)  # (a step that raised left its entry)


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """(After the optimizer's own post hooks: a ``SparseTrainer``'s has run.)"""
    for after in _PENDING.pop(optimizer, ()):
        after()


def bump_unless_written(tensors: list[torch.Tensor]) -> AfterStep | None:
    """What to call after a step that updates ``tensors`` (parameters with a gradient): bump the version
    counter of each one the step did not bump itself (a fused step), as an in-place write through torch
    does, so that the caches comparing counters see it; None for no tensors."""
    if not tensors:
        return None
    noted = [(t, t._version) for t in tensors]

    def after() -> None:
        for t, version in noted:
            if t._version == version:
                torch.autograd.graph.increment_version(t)

    return after
