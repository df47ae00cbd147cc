"""Which gate activation an MLP's ``act_fn`` computes: "silu", "gelu_tanh" or neither (None).

The fused gated epilogue (docs/torch.md, "Fusing the gated activation (SwiGLU, GeGLU)") replaces a
gated MLP's ``act_fn(gate_proj(x)) * up_proj(x)`` by the kernel's own silu or gelu_tanh, so it is
installed only where ``act_fn`` is known to compute exactly that function. :func:`gate_activation`
decides it from what the module *is* (torch's own modules, by class) or, for other modules, from
what it holds (nothing that could change what it computes) and what it computes on a probe.
"""

from __future__ import annotations

import dis
import functools
from types import BuiltinFunctionType, BuiltinMethodType, FunctionType, MethodType, ModuleType
from typing import Any

import torch
from torch import nn

from ...stdlib.kernels.linear import reference_activation
from ._kernels import GATED_ACTIVATIONS

_WIDE = (8.0, 10.0, 16.0, 32.0, 100.0, 1e3, 1e4)
_PROBE = torch.cat([torch.linspace(-6.0, 6.0, 49, dtype=torch.float32),
                    torch.tensor([*_WIDE, *(-v for v in _WIDE)], dtype=torch.float32)])
"""What a candidate act_fn is run on: 49 points of -6..6, where the activations bend, and the
magnitudes up to 1e4 a gate can reach, where a clamp or a cut-off would show."""
_GATE_REFERENCES = {gate: torch.from_numpy(reference_activation(_PROBE.double().numpy(), gate))
                    for gate in GATED_ACTIVATIONS.values()}
"""The gate activations on the probe in float64 (stdlib/kernels/linear.py's reference_activation, the
tests' reference for the kernel)."""
PROBE_RTOL, PROBE_ATOL = 1e-5, 1e-6
"""How close a candidate's float32 output on the probe must be to a float64 gate activation: the
float32 evaluations of ``F.silu``, ``F.gelu(approximate="tanh")`` and transformers' Python
formulas stay within 4e-7 of it there (under 1e-7 |y|), while exact (erf) GELU is up to 5e-4 away
from the tanh approximation (and SiLU far more)."""
BF16_RTOL, BF16_ATOL = 2.0 ** -5, 2.0 ** -8
"""The same probe in bfloat16 (the type a model runs it in), against the float64 reference: a few
bf16 roundings of a formula evaluated op by op, so that a module computing something else for bf16
inputs is refused."""

_MODULE_KEYS = frozenset(vars(nn.Module())) | {"_is_hf_initialized"}
"""The instance attributes every nn.Module has, and transformers' weight-initialization marker."""
_CONSTANTS = (int, float, complex, str, bytes, bool, type(None))
_CLASS_MEMBERS = (FunctionType, staticmethod, classmethod, property)
"""What the act's own classes (those between it and nn.Module) may define besides dunder names:
code, not values (a class-level ``beta = 1.0`` is state that could change)."""


def _constant(value: Any) -> bool:
    return isinstance(value, _CONSTANTS) or (type(value) is tuple and all(_constant(v) for v in value))


def _plain_function(fn: FunctionType) -> bool:
    """A Python function whose closure cells and default arguments are constants or plain callables
    and whose globals hold no module or tensor under a name its code reads."""
    try:
        cells = [c.cell_contents for c in fn.__closure__ or ()]
    except ValueError:  # an empty cell (a variable not yet bound): not a function to vouch for
        return False
    defaults = [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
    if not all(_constant(v) or (callable(v) and _plain_callable(v, None)) for v in (*cells, *defaults)):
        return False
    names = {ins.argval for ins in dis.get_instructions(fn) if ins.opname == "LOAD_GLOBAL"}
    return not any(isinstance(fn.__globals__.get(n), (nn.Module, torch.Tensor)) for n in names)


def _plain_callable(value: Any, owner: nn.Module | None) -> bool:
    """``value`` is a callable without state that could change what ``owner`` computes, and no module or
    tensor: a plain function (:func:`_plain_function`), a builtin function (of a Python module, as
    ``torch.nn.functional.gelu``), a method bound to ``owner`` itself (whose state is checked with
    it), or a ``functools.partial`` of one of these with constant arguments (numbers, strings, None):
    transformers' ``GELUTanh.act``."""
    if isinstance(value, (nn.Module, torch.Tensor)):
        return False
    if isinstance(value, FunctionType):
        return _plain_function(value)
    if isinstance(value, (BuiltinFunctionType, BuiltinMethodType)):
        bound = getattr(value, "__self__", None)
        return bound is None or isinstance(bound, ModuleType)  # not a method of a mutable object
    if isinstance(value, MethodType):
        return owner is not None and value.__self__ is owner and isinstance(value.__func__, FunctionType) \
            and _plain_function(value.__func__)
    if type(value) is functools.partial:
        return _plain_callable(value.func, owner) and all(_constant(a) for a in (*value.args, *value.keywords.values()))
    return False


def _plain_class(cls: type) -> bool:
    """The act's classes below nn.Module define only code (:data:`_CLASS_MEMBERS`), whose functions
    are plain (:func:`_plain_function`), and keep nn.Module's ``__call__``."""
    for klass in cls.__mro__:
        if klass is nn.Module:
            return True
        for name, member in vars(klass).items():
            if name.startswith("__") and name.endswith("__") and name != "__call__":
                continue
            if name == "__call__" or not isinstance(member, _CLASS_MEMBERS):
                return False
            if isinstance(member, FunctionType) and not _plain_function(member):
                return False
    return False  # (not an nn.Module: the caller checked)


def _matches(got: Any, want: torch.Tensor, dtype: torch.dtype, rtol: float, atol: float) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == dtype and \
        torch.allclose(got.double(), want, rtol=rtol, atol=atol)


def gate_activation(act: Any) -> str | None:
    """The gate activation ``act`` computes, "silu" or "gelu_tanh" (the tanh approximation of GELU,
    torch's ``F.gelu(x, approximate="tanh")``), or None: what it takes to fuse it into the kernel.

    * An ``nn.SiLU`` whose class keeps ``nn.SiLU.forward``: "silu".
    * An ``nn.GELU`` whose class keeps ``nn.GELU.forward``: "gelu_tanh" where its ``approximate``
      is "tanh"; exact GELU (approximate "none") differs by up to 5e-4: None.
    * Any other module without parameters, buffers or submodules
      - whose instance attributes beyond nn.Module's own (and transformers' ``_is_hf_initialized``)
        are all plain callables (:func:`_plain_callable`: functions whose closures, defaults and
        the globals they read hold no module or tensor, builtins, methods bound to the module
        itself, ``functools.partial`` of those with constant arguments),
      - whose classes below nn.Module define only methods and properties (no class-level values
        such as a ``beta``; :func:`_plain_class`), so that nothing it holds could change what it
        computes,
      - and whose output on a CPU probe (-6 to 6, and magnitudes up to 1e4) equals silu or
        gelu_tanh evaluated in float64: within :data:`PROBE_RTOL` / :data:`PROBE_ATOL` in float32,
        and within :data:`BF16_RTOL` / :data:`BF16_ATOL` in bfloat16, the same one in both.
      This takes transformers' ``SiLUActivation``, ``GELUTanh`` (either form of its ``act``),
      ``NewGELUActivation``, ``FastGELUActivation``, a hand-written x * sigmoid(x).

    Never: a module whose ``forward`` is replaced on the instance, a class with its own
    ``__call__``, a module with forward hooks, an nn.SiLU or nn.GELU subclass with its own forward,
    a Swish with a ``beta`` (a parameter, an instance or class attribute, a default argument), one
    that raises on the probe, a function that is not a module. What is checked is the module as it
    is when fused: an attribute reassigned afterwards (``nn.GELU.approximate`` included), or a
    global rebound, is not checked again, as a class forward monkeypatched afterwards is not."""
    if not isinstance(act, nn.Module) or act._forward_hooks or act._forward_pre_hooks:
        return None
    if "forward" in vars(act) or type(act).__call__ is not nn.Module.__call__ or \
            type(act)._call_impl is not nn.Module._call_impl:
        return None  # nn.Module.__call__ would run another forward than the class's
    forward = type(act).forward
    if isinstance(act, nn.SiLU) and forward is nn.SiLU.forward:
        return "silu"
    if isinstance(act, nn.GELU) and forward is nn.GELU.forward:
        return "gelu_tanh" if act.approximate == "tanh" else None
    if act._parameters or act._buffers or act._modules or not _plain_class(type(act)):
        return None
    if not all(_plain_callable(value, act) for name, value in vars(act).items() if name not in _MODULE_KEYS):
        return None
    try:
        with torch.no_grad():
            got = act(_PROBE.clone())
            got16 = act(_PROBE.to(torch.bfloat16))
    except Exception:  # a module that cannot run on the probe is no gate activation
        return None
    for gate, want in _GATE_REFERENCES.items():
        if _matches(got, want, torch.float32, PROBE_RTOL, PROBE_ATOL):
            want16 = torch.from_numpy(reference_activation(_PROBE.to(torch.bfloat16).double().numpy(), gate))
            return gate if _matches(got16, want16, torch.bfloat16, BF16_RTOL, BF16_ATOL) else None
    return None
