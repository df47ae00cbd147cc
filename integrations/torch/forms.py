"""Forwards recognized by their bytecode: a class whose forward is one of these computes what a
reference computes, whatever its name (transformers copies such forwards into many models).

:func:`code_key` is what two functions must share to compute the same thing; glu.py matches the
gated MLP forwards with it, :func:`is_plain_linear_forward` the ``nn.Linear`` subclasses whose own
forward is the plain linear ``x @ W.T + b`` in other words (Falcon's ``FalconLinear``).
"""

from __future__ import annotations

from types import CodeType, FunctionType
from typing import Any


def code_key(code: CodeType) -> tuple[Any, ...]:
    """What two forwards must share to compute the same thing: bytecode, names, constants, variables."""
    return (code.co_code, code.co_names, code.co_consts, code.co_varnames, code.co_argcount, code.co_freevars)


# (no docstrings: a forward's constants must be the reference's, and transformers' have none)
def _falcon_linear_forward(self: Any, input: Any) -> Any:  # FalconLinear.forward (transformers 4.x and 5.x)
    hidden_states = input @ self.weight.T
    if self.bias is None:
        return hidden_states
    return hidden_states + self.bias


PLAIN_LINEAR_FORWARDS = (_falcon_linear_forward,)
"""``nn.Linear`` subclass forwards that compute ``x @ W.T + b`` (the product, then the bias added:
the same function as ``F.linear``, rounded once more in a 16-bit type, where a SparseLinear rounds
once), so that the subclass can be swapped as an ``nn.Linear``."""

_PLAIN_KEYS = tuple(code_key(f.__code__) for f in PLAIN_LINEAR_FORWARDS)


def has_code_of(forward: Any, keys: Any) -> bool:
    """``forward`` is a plain function whose :func:`code_key` is one of ``keys``."""
    code = getattr(forward, "__code__", None)
    return isinstance(forward, FunctionType) and isinstance(code, CodeType) and code_key(code) in keys


def is_plain_linear_forward(forward: Any) -> bool:
    """``forward`` is a plain function with the bytecode of one of :data:`PLAIN_LINEAR_FORWARDS`."""
    return has_code_of(forward, _PLAIN_KEYS)
