"""``torch.nn.utils.parametrize`` on the tensors of a sparse layer it cannot take (SP0925).

``register_parametrization(layer, name, P)`` moves the tensor ``name`` into ``layer.parametrizations``,
a ``ModuleDict``, under the key ``name``. Two kinds of name cannot be taken:

* ``values`` (a ``SparseLinear``'s and a ``SemiSparseLinear``'s compressed weight): ``ModuleDict.values``
  is a method, and torch's ``add_module`` refuses a name the ``ModuleDict`` has as an attribute: a
  ``KeyError: "attribute 'values' already exists"`` raised after torch had deleted the buffer and
  swapped the layer's class, so the layer was left without its weight (its next call a ``KeyError``
  from inside sparsile).
* the compressions of a ``SemiSparseLinear`` (``values``, ``meta``, ``values_t``, ``meta_t``): they
  are computed from the master weight and the mask and written in place by each re-compression
  (after an optimizer step, a re-prune); a parametrized one is a new tensor on each access, so the
  write went into a copy thrown away after, and the layer computed with the compressions from before
  (x's gradient from the old ``values_t`` after every optimizer step, the outputs from the old
  ``meta`` after a re-prune), without a word.

The refusal comes before torch changes anything: the layer's class has a ``parametrizations``
property (:func:`guarded_parametrizations`), which ``register_parametrization`` reads first, through
``is_parametrized(module, name)``. The property sees that call (its caller's code object, and the
name it checks) and raises SP0925 there; every other read is the ``ModuleDict`` torch stored (an
``AttributeError`` before there is one, as without the property). A parametrization's
``right_inverse`` would otherwise already have rewritten the tensor before any later point could
refuse. While dynamo traces (a compiled forward reading a parametrized bias through the property) it
looks at no frames: ``sys._getframe`` is a function dynamo skips, a graph break that stopped
``fullgraph=True``. If torch reached the property otherwise, the refusal would not come and torch's own error
would: tests/integrations/test_torch_parametrize_guard.py pins it for the torch installed.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.nn.utils import parametrize

from ..errors import SP_PARAMETRIZE, IntegrationError

_CHECKS = parametrize.is_parametrized.__code__
_REGISTERS = parametrize.register_parametrization.__code__


def _name_registered() -> str | None:
    """The tensor name ``register_parametrization`` is about to parametrize, where the property's reader
    (two frames up) is its ``is_parametrized(module, tensor_name)`` call; else None."""
    if torch.compiler.is_compiling():  # (dynamo traces a parametrized tensor's reads: no frames, registers nothing)
        return None
    try:
        frame = sys._getframe(2)
    except ValueError:  # (read from C with no Python caller)
        return None
    caller = frame.f_back
    if frame.f_code is not _CHECKS or caller is None or caller.f_code is not _REGISTERS:
        return None
    name = frame.f_locals.get("tensor_name")
    return name if isinstance(name, str) else None


def guarded_parametrizations(refused: dict[str, str]) -> property:
    """The ``parametrizations`` property of a sparse layer class: the ``ModuleDict`` torch stored, and
    SP0925 where ``register_parametrization`` asks for a name of ``refused`` (name -> the help's
    advice)."""

    def read(layer: Any) -> Any:
        name = _name_registered()
        if name in refused:
            raise _refusal(layer, name, refused[name])
        modules = layer.__dict__["_modules"]
        if "parametrizations" not in modules:
            raise AttributeError(f"'{type(layer).__name__}' object has no attribute 'parametrizations'")
        return modules["parametrizations"]

    return property(read, doc="torch.nn.utils.parametrize's ModuleDict (parametrize_guard.py)")


def _refusal(layer: Any, name: str, advice: str) -> IntegrationError:
    kind = parametrize.type_before_parametrizations(layer).__name__
    if name == "values":
        why = ("torch keeps parametrizations in a ModuleDict, whose method ModuleDict.values takes the name (torch "
               "would stop at \"attribute 'values' already exists\" after deleting the buffer, leaving the layer "
               "without its weight)")
    else:
        why = ("it is a compression of the master weight, written in place by each re-compression (after an "
               "optimizer step or a re-prune): a parametrized one is a copy on each access, so the layer would "
               "compute with the compression from before")
    return IntegrationError(SP_PARAMETRIZE, f"torch.nn.utils.parametrize cannot take the {kind}'s {name}: {why}",
                            help=advice)
