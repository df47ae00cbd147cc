"""Type constructors usable in annotations and constant expressions: ``ptr[f32]``,
``tensor[f16, 2]``, and the plain scalar types (registered by :mod:`builtins`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import types as T
from .builtins import ROOT
from .values import Const


@dataclass(frozen=True)
class TypeCtor:
    """A generic type awaiting its parameters (``ptr``, ``tensor``)."""

    name: str

    def apply(self, params: tuple[object, ...]) -> T.Type | str:
        """The type, or an error message."""
        if self.name == "ptr":
            if len(params) != 1 or not isinstance(params[0], T.ScalarType):
                return "`ptr[...]` takes one scalar element type, e.g. `ptr[f32]`"
            return T.PointerType(params[0])
        if self.name == "tensor":
            if len(params) != 2 or not isinstance(params[0], T.ScalarType) or not isinstance(params[1], int):
                return "`tensor[...]` takes an element type and a rank, e.g. `tensor[f16, 2]`"
            if not 1 <= params[1] <= 5:
                return f"a tensor's rank must be 1 to 5 (the TMA limit), found {params[1]}"
            return T.TensorType(params[0], params[1])
        return f"`{self.name}` takes no parameters"

    def __getitem__(self, params: object) -> T.Type:
        """``ptr[f32]`` evaluated by Python itself (annotations of @jit functions)."""
        t = self.apply(params if isinstance(params, tuple) else (params,))
        if isinstance(t, str):
            raise TypeError(t)
        return t

    def __str__(self) -> str:
        return self.name


ROOT.members["ptr"] = Const(TypeCtor("ptr"))
ROOT.members["tensor"] = Const(TypeCtor("tensor"))
