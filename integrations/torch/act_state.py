"""What a fused gated forward (glu.py) checks of its MLP's ``act_fn`` on each call: that the module
gate.gate_activation vouched for still holds what it held then.

An act_fn is one module, or what ``torch.compile(module)`` makes of one (compiled_act): then both
the wrapper (its forward, its Dynamo context, still wrapping the same module) and the module it
wraps (``approximate``, its compiled call) are checked, each by an :class:`ActState`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .compiled_act import compiled_module_of
from .gate import COMPILED_CALL, TORCH_COMPILE_MARK, act_attributes, compiled_own_call


def _counted(d: dict[str, Any]) -> int:
    """The number of a module's instance attributes, less those it may gain (gate.UNCOUNTED_KEYS:
    its compiled call and torch.compile's marker), spelled out (a generator per call cost 0.3 us)."""
    return len(d) - (COMPILED_CALL in d) - (TORCH_COMPILE_MARK in d)


class ActState:
    """A module's instance attributes beyond nn.Module's own (gate.act_attributes) as they were when
    the fused forward was made, and its compiled call (``act.compile()``: gate.compiled_own_call),
    not counted, so that it may be compiled (again) after fusing (nor is torch.compile's marker:
    gate.UNCOUNTED_KEYS). ``wraps``: the module a torch.compile wrapper wraps (then it must still
    be its ``_orig_mod``, and the wrapper's own compiled call, which compiled_act refuses, stays
    absent)."""

    def __init__(self, module: nn.Module, wraps: nn.Module | None = None):
        d = module.__dict__
        self.module, self.wraps = module, wraps
        self.names = act_attributes(module)
        self.values = tuple(map(d.get, self.names))
        self.size = _counted(d)
        self.compiled = d.get(COMPILED_CALL)  # the one vouched for (None: not compiled)

    def unchanged(self) -> bool:
        """The module holds the attributes it held (the same objects, or equal strings and numbers),
        none added or removed, and no compiled call but its own: a dict size, a lookup per
        attribute, one for the compiled call (and the wrapped module), and a tuple compare."""
        module = self.module
        if torch.compiler.is_compiling():
            # traced: Dynamo (torch 2.11) cannot trace len() of a module's __dict__; it guards the
            # attributes read here, so a later change recompiles (an added one goes unseen there; the
            # traced forward runs the op, not act_fn, whatever its compiled call). A torch.compile
            # wrapper: not vouched for there (glu.GatedForward._traced runs the class forward first)
            if self.wraps is not None:
                return False
            return tuple(getattr(module, name, None) for name in self.names) == self.values
        d = module.__dict__
        compiled = d.get(COMPILED_CALL)
        if compiled is not self.compiled:  # compiled (again) since: vouched for once per new one
            if self.wraps is not None or not compiled_own_call(module, compiled):
                return False
            self.compiled = compiled
        if self.wraps is not None and module._modules.get("_orig_mod") is not self.wraps:
            return False
        try:
            return _counted(d) == self.size and tuple(map(d.get, self.names)) == self.values
        except Exception:  # (an attribute whose == has no truth value: changed)
            return False


def act_states(act: nn.Module) -> tuple[ActState, ...]:
    """The states to check of an act_fn gate_activation took: its own, and where it is a
    torch.compile wrapper, the wrapped module's."""
    wrapped, _ = compiled_module_of(act)
    return (ActState(act),) if wrapped is None else (ActState(act, wraps=wrapped), ActState(wrapped))


def act_modules(states: tuple[ActState, ...]) -> tuple[Any, ...]:
    """The modules ``states`` check (the act_fn, and the module a torch.compile wrapper wraps)."""
    return tuple(state.module for state in states)
