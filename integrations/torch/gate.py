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
from types import BuiltinFunctionType, BuiltinMethodType, CodeType, FunctionType, MethodType, ModuleType
from typing import Any

import torch
from torch import nn

from ...stdlib.kernels.linear import reference_activation
from ._kernels import GATED_ACTIVATIONS
from .compiled_act import compiled_module_of, inlined_callable, untrusted_compiled_call

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
_HALF_PROBES = {dtype: torch.stack([_PROBE, -_PROBE]).to(dtype) for dtype in (torch.bfloat16, torch.float16)}
"""The probe in the 16-bit types a model runs, as (2, n) tensors passed transposed (2-D, not
contiguous), so that a module that computes something else for another type, rank or layout shows."""
HALF_RTOL, HALF_ATOL = 2.0 ** -5, 2.0 ** -8
"""How close the 16-bit probes' outputs must be to the float64 gate activation of the rounded
probe: a few roundings of a formula evaluated op by op in bfloat16 (transformers' Python GELU
formulas lose up to 7 f16 roundings near x = -2.75 by cancellation)."""

COMPILED_CALL = "_compiled_call_impl"
"""The instance attribute ``nn.Module.compile()`` sets: ``torch.compile`` of the module's own
``_call_impl``, which ``module(x)`` then runs (:func:`compiled_own_call`)."""
TORCH_COMPILE_MARK = "_is_torch_compile"
"""The marker torch 2.13's ``OptimizeContext.__call__`` sets on what ``torch.compile`` returns; on an
OptimizedModule its ``__setattr__`` forwards it to the module it wraps, so ``torch.compile(act)``
leaves it (True) in ``act.__dict__``. Dynamo reads it (of a compiled function) to trace nested
compiles; it does not change what the module computes."""
UNCOUNTED_KEYS = (COMPILED_CALL, TORCH_COMPILE_MARK)
"""The instance attributes an act may gain after fusing and still compute what it did: its own
compiled call (``act.compile()``, checked by :func:`compiled_own_call`) and torch.compile's marker
(``torch.compile(act)``)."""
_MODULE_KEYS = frozenset(vars(nn.Module())) | {"_is_hf_initialized", *UNCOUNTED_KEYS}
"""The instance attributes every nn.Module has (or adds itself: its compiled call, checked by
:func:`compiled_own_call`, and torch.compile's marker), and transformers' weight-initialization
marker."""
_CONSTANTS = (int, float, complex, str, bytes, bool, type(None))
_CLASS_MEMBERS = (FunctionType, staticmethod, classmethod, property)
"""What the act's own classes (those between it and nn.Module) may define besides dunder names:
code, not values (a class-level ``beta = 1.0`` is state that could change)."""


def act_attributes(act: nn.Module) -> tuple[str, ...]:
    """The names of ``act``'s instance attributes beyond nn.Module's own (and transformers'
    initialization marker): what :func:`gate_activation` vouched for (``nn.GELU.approximate``, the
    function a ``GELUTanh`` holds), and what a fused gated forward checks is unchanged per call."""
    return tuple(name for name in vars(act) if name not in _MODULE_KEYS)


def compiled_own_call(act: nn.Module, value: Any) -> bool:
    """``value``, ``act``'s ``_compiled_call_impl``, is None (not compiled) or what ``act.compile()``
    stores there: ``torch.compile`` of act's own ``nn.Module._call_impl`` (Dynamo's wrapper keeps the
    callable it compiles as ``_torchdynamo_orig_callable``; with ``disable=True`` the bound method
    itself; in torch 2.14, for torch's own modules, ``wrap_inline`` of that bound method, a frame that
    only calls it: compiled_act.inlined_callable). ``act(x)`` then runs its class's forward through
    Dynamo and the backend, which is trusted, as torch.compile is, to compute what that forward
    computes. Anything else stored there (another function compiled, another module's call) is not
    vouched for, nor a wrapper of the compiled call: ``functools.wraps`` copies
    ``_torchdynamo_orig_callable`` onto it, but its ``__wrapped__`` is the compiled function, where
    Dynamo's own wrapper (a ``functools.wraps`` of the callable it compiles) has that callable itself.
    Its backend must be one torch.compile passes of torch's own (compiled_act.untrusted_backend): a
    backend callable of the user's may compute anything."""
    if value is None:
        return True
    orig = value
    if isinstance(value, FunctionType):
        orig = getattr(value, "_torchdynamo_orig_callable", None)
        if getattr(value, "__wrapped__", None) is not orig or untrusted_compiled_call(value) is not None:
            return False
        orig = inlined_callable(orig)  # (torch 2.14, torch's own modules: wrap_inline of the bound method)
    return isinstance(orig, MethodType) and orig.__self__ is act and orig.__func__ is nn.Module._call_impl


def _constant(value: Any) -> bool:
    return isinstance(value, _CONSTANTS) or (type(value) is tuple and all(_constant(v) for v in value))


def _loaded_globals(code: CodeType) -> set[str]:
    """The global names ``code`` and the code objects nested in it (lambdas, comprehensions) load."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _loaded_globals(const)
    return names


def _stateful(value: Any) -> bool:
    """A module, a tensor, or a container (dict, list, set) holding one at its top level."""
    if isinstance(value, (dict, list, set)):
        return any(_stateful(v) for v in (value.values() if isinstance(value, dict) else value))
    return isinstance(value, (nn.Module, torch.Tensor))


def _plain_function(fn: FunctionType, seen: set[int]) -> bool:
    """A Python function whose closure cells and default arguments are constants or plain callables,
    whose attributes are none, and whose loaded globals (its nested code's included) hold no module,
    tensor or container of them and are plain where they are functions (``seen``: the functions
    being checked, so that recursion ends)."""
    if id(fn) in seen:
        return True
    seen.add(id(fn))
    if vars(fn):  # function attributes: state (fn.beta = 1.0)
        return False
    try:
        cells = [c.cell_contents for c in fn.__closure__ or ()]
    except ValueError:  # an empty cell (a variable not yet bound): not a function to vouch for
        return False
    defaults = [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
    if not all(_constant(v) or (callable(v) and _plain_callable(v, None, seen)) for v in (*cells, *defaults)):
        return False
    for name in _loaded_globals(fn.__code__):
        value = fn.__globals__.get(name)
        if _stateful(value) or (isinstance(value, FunctionType) and not _plain_function(value, seen)):
            return False
    return True


def _plain_callable(value: Any, owner: nn.Module | None, seen: set[int]) -> bool:
    """``value`` is a callable without state that could change what ``owner`` computes, and no module or
    tensor: a plain function (:func:`_plain_function`), a builtin function (of a Python module, as
    ``torch.nn.functional.gelu``), a method bound to ``owner`` itself (whose state is checked with
    it), or a ``functools.partial`` of one of these with constant arguments (numbers, strings, None):
    transformers' ``GELUTanh.act``."""
    if isinstance(value, (nn.Module, torch.Tensor)):
        return False
    if isinstance(value, FunctionType):
        return _plain_function(value, seen)
    if isinstance(value, (BuiltinFunctionType, BuiltinMethodType)):
        bound = getattr(value, "__self__", None)
        return bound is None or isinstance(bound, ModuleType)  # not a method of a mutable object
    if isinstance(value, MethodType):
        return owner is not None and value.__self__ is owner and isinstance(value.__func__, FunctionType) \
            and _plain_function(value.__func__, seen)
    if type(value) is functools.partial:
        return _plain_callable(value.func, owner, seen) and \
            all(_constant(a) for a in (*value.args, *value.keywords.values()))
    return False


def _member_functions(member: Any) -> list[Any]:
    """The functions a class member runs: itself, a static or class method's, a property's accessors."""
    if isinstance(member, (staticmethod, classmethod)):
        return [member.__func__]
    if isinstance(member, property):
        return [f for f in (member.fget, member.fset, member.fdel) if f is not None]
    return [member]


def _plain_class(cls: type) -> bool:
    """The act's classes below nn.Module define only code (:data:`_CLASS_MEMBERS`) whose functions
    are plain (:func:`_plain_function`), and strings (transformers' hub decorator names a class
    ``kernel_layer_name``); no number or tensor even under a dunder name; nn.Module's ``__call__``
    and ``_call_impl`` kept."""
    seen: set[int] = set()
    for klass in cls.__mro__:
        if klass is nn.Module:
            return True
        for name, member in vars(klass).items():
            if name in ("__call__", "_call_impl", "_compiled_call_impl", "__getattribute__", "__getattr__"):
                return False
            if name.startswith("__") and name.endswith("__"):
                if isinstance(member, (int, float, complex, torch.Tensor)) or _stateful(member):
                    return False
                continue
            if isinstance(member, (str, type(None))):
                continue
            if not isinstance(member, _CLASS_MEMBERS):
                return False
            if not all(isinstance(f, FunctionType) and _plain_function(f, seen) for f in _member_functions(member)):
                return False
    return False  # (not an nn.Module: the caller checked)


def _matches(got: Any, want: torch.Tensor, dtype: torch.dtype, rtol: float, atol: float) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == dtype and \
        got.layout == torch.strided and torch.allclose(got.double(), want, rtol=rtol, atol=atol)


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
        and within :data:`HALF_RTOL` / :data:`HALF_ATOL` in bfloat16 and float16 (2-D, not
        contiguous: :data:`_HALF_PROBES`), the same one in all three.
      This takes transformers' ``SiLUActivation``, ``GELUTanh`` (either form of its ``act``),
      ``NewGELUActivation``, ``FastGELUActivation``, a hand-written x * sigmoid(x).

    Never: a module whose ``forward`` is replaced on the instance, a class with its own
    ``__call__``, a module with forward hooks, an nn.SiLU or nn.GELU subclass with its own forward,
    a Swish with a ``beta`` (a parameter, an instance or class attribute, a default argument), one
    that raises on the probe, a function that is not a module, a compiled call on the instance that
    is not the module's own. A module compiled by ``act.compile()`` is taken as the module it
    compiles (:func:`compiled_own_call`), and so is what ``torch.compile(act)`` makes, Dynamo's
    ``OptimizedModule`` wrapping it, where it is exactly that (compiled_act.compiled_module_of:
    its forward Dynamo's compiled call of the module it wraps, nothing added, no hooks). What is
    checked is the module as it is when fused; its instance attributes (:func:`act_attributes`:
    ``nn.GELU.approximate`` included; a wrapper's and the wrapped module's) are compared with those
    it had at each call of the fused forward (glu.py, act_state.py), but a global rebound is not
    checked again, as a class forward monkeypatched afterwards is not."""
    try:
        return _gate_of(act)
    except Exception:  # inspecting or probing it raised (a recursion, a module never initialized, a meta
        return None    # output): no gate activation to vouch for


def _calls_its_class_forward(act: nn.Module) -> bool:
    """``act(x)`` runs ``type(act).forward`` through nn.Module's own call path: no forward or call
    implementation on the instance, no compiled call but its own (``act.compile()``:
    :func:`compiled_own_call`), nn.Module's ``__call__``, ``_call_impl`` and attribute lookup on the
    class, no metaclass, no forward hooks."""
    own = vars(act)
    if act._forward_hooks or act._forward_pre_hooks or "forward" in own or "_call_impl" in own or \
            not compiled_own_call(act, own.get(COMPILED_CALL)):
        return False
    cls = type(act)
    return type(cls) is type and cls.__call__ is nn.Module.__call__ and cls._call_impl is nn.Module._call_impl and \
        cls.__getattribute__ is object.__getattribute__ and cls.__getattr__ is nn.Module.__getattr__


def _gate_of(act: Any) -> str | None:
    wrapped, why_not = compiled_module_of(act)
    if why_not is not None:
        return None
    if wrapped is not None:  # torch.compile(module): that module's own call through Dynamo
        act = wrapped
    if not isinstance(act, nn.Module) or not _calls_its_class_forward(act):
        return None
    forward = type(act).forward
    if isinstance(act, nn.SiLU) and forward is nn.SiLU.forward:
        return "silu"
    if isinstance(act, nn.GELU) and forward is nn.GELU.forward:
        return "gelu_tanh" if vars(act).get("approximate") == "tanh" else None
    if act._parameters or act._buffers or act._modules or not _plain_class(type(act)):
        return None
    seen: set[int] = set()
    if not all(_plain_callable(value, act, seen) for name, value in vars(act).items() if name not in _MODULE_KEYS):
        return None
    # (its own call without a compiled one: act.compile()'s runs the same, but would compile for the probe)
    run = act._call_impl
    with torch.no_grad():
        got = run(_PROBE.clone())
        gate = next((g for g, want in _GATE_REFERENCES.items()
                     if _matches(got, want, torch.float32, PROBE_RTOL, PROBE_ATOL)), None)
        if gate is None:
            return None
        for dtype, probe in _HALF_PROBES.items():
            want = torch.from_numpy(reference_activation(probe.double().numpy(), gate))
            if not _matches(run(probe.clone().t()), want.t(), dtype, HALF_RTOL, HALF_ATOL):
                return None
    return gate
