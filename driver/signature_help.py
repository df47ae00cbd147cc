"""SP0740, an ahead-of-time compile whose signature lacks a parameter the source does not type:
the message, and a help with an example signature fitted to how the kernel uses each parameter."""

from __future__ import annotations

from typing import Any

from ..frontend.ir import types as T
from ..frontend.sema.specialize import ParamInfo
from ..frontend.syntax import ast as A
from .param_roles import param_roles

SP_SIGNATURE_MISSING = "SP0740"
"""An ahead-of-time compile whose signature lacks an unannotated run-time parameter or a constexpr
without a default (everything else comes from the source)."""


def missing_signature_message(kernel: str, missing: list[ParamInfo]) -> str:
    """SP0740's message: each missing parameter and why the source does not give it."""
    parts = [f"`{p.name}` ({'constexpr without a default' if p.annotation is T.CONSTEXPR else 'no annotation'})"
             for p in missing]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"the signature of `{kernel}` must give {listed}"


def signature_as_text(signature: dict[str, Any]) -> str:
    """A dict signature in the text form ``compile`` also takes (``"x=ptr[f32], BLOCK=32"``)."""
    return ", ".join(f"{name}={value}" for name, value in signature.items())


def missing_signature_help(fn: A.FunctionDef, params: list[ParamInfo], missing: list[ParamInfo]) -> str:
    """SP0740's help: an example signature for the ``missing`` parameters of kernel ``fn`` that fits
    how its body uses each (driver/param_roles.py): a pointer ``x=ptr[f32]`` (the element type of
    the annotated pointers when they agree), a scalar ``n=i32``, a constexpr ``BLOCK=64``; one the
    body does not show is written as a pointer, and the help says so and gives the scalar form."""
    runtime = [p.name for p in missing if p.annotation is not T.CONSTEXPR]
    maybe = [p.name for p in params if p.annotation is None or isinstance(p.annotation, T.PointerType)]
    roles = param_roles(fn, runtime, maybe)
    elems = {str(p.annotation.elem) for p in params if isinstance(p.annotation, T.PointerType)}
    elem = elems.pop() if len(elems) == 1 else "f32"
    example = ", ".join(f"{p.name}=64" if p.annotation is T.CONSTEXPR else
                        f"{p.name}=i32" if roles[p.name] == "scalar" else f"{p.name}=ptr[{elem}]" for p in missing)
    unknown = [n for n in runtime if roles[n] is None]
    text = f"give them with --signature (Kernel.compile: signature=), e.g. \"{example}\""
    if unknown:
        names = ", ".join(f"`{n}`" for n in unknown)
        text += (f" ({names}: the kernel does not show whether {'it is' if len(unknown) == 1 else 'each is'} a "
                 f"pointer or a scalar; a scalar is written {unknown[0]}=i32 or {unknown[0]}=f32)")
    return text + "; annotated run-time parameters and defaulted constexprs need nothing"
