"""What ``torch.compile(module)`` makes of a gated MLP's ``act_fn``: Dynamo's ``OptimizedModule``.

``mlp.act_fn = torch.compile(mlp.act_fn)`` replaces the child with an ``OptimizedModule`` that wraps
the original (its ``_orig_mod``). :func:`compiled_module_of` says whether an act_fn is exactly what
torch.compile makes of a module, so that gate.py takes it as the module it wraps: the compile
backend is trusted, as for ``act.compile()`` (gate.compiled_own_call), to compute what that
module's forward computes.

What torch.compile makes (torch/_dynamo/eval_frame.py, read in torch 2.13, and the same in 2.14; the earlier versions
in the code index, one with ``_super_module_initialized`` but no ``_torchdynamo_wrapper_id``, have
the same ``compile_wrapper`` and ``wrap_inline`` structure; torch 2.11 itself was not run, and a
version without them is refused, not misread):
``_TorchDynamoContext.__call__(module)`` returns ``OptimizedModule(module, ctx)`` with instance
attributes ``_torchdynamo_orig_callable`` (the module's forward), ``get_compiler_config`` and (2.13)
``_torchdynamo_wrapper_id``; ``OptimizedModule.__init__`` adds ``_super_module_initialized``,
``dynamo_ctx`` (an ``OptimizeContext`` for torch.compile, a ``DisableContext`` for
``torch._dynamo.disable``) and registers the module as its child ``_orig_mod``; ``_initialize``
sets the instance ``forward`` to ``ctx(external_utils.wrap_inline(module))`` (torch's own modules,
which trace_rules skips) or ``ctx(module.__call__)``. ``ctx(fn)`` is ``compile_wrapper``, a closure
over ``fn`` and the context (``self``) that runs ``fn`` with Dynamo's frame callback set. Calling
the wrapper runs nn.Module's call on it (its hooks) and then that forward; nothing else it holds is
read. ``torch.compile(module, disable=True)`` returns the module itself.

The backend is trusted only where it is one of torch's own that compute what the graph they are
given computes (:data:`TRUSTED_BACKENDS`, as ``torch.compile`` passes them: its
``_TorchCompileInductorWrapper``, or its ``_TorchCompileWrapper`` of the function torch's registry
holds under that name), found at the end of the wrapper's ``callback`` chain
(``_torchdynamo_orig_backend``, ``_torchdynamo_orig_callable`` in older versions): a backend
callable of the user's (or a backend registered by name, or one of torch's testing backends that
change the graph) may compute anything, which the fused kernel would not; refused
(:func:`untrusted_backend`). Whatever is not of the expected structure is refused, never raised.
"""

from __future__ import annotations

import functools
import sys
from types import CodeType, FunctionType, MethodType, ModuleType
from typing import Any

import torch
from torch import nn

DYNAMO_MODULE = "torch._dynamo.eval_frame"
"""Where OptimizedModule lives; looked up in ``sys.modules`` only (an act_fn cannot be one unless
Dynamo is imported, and importing it costs seconds)."""
WRAPPER_KEYS = frozenset({"dynamo_ctx", "forward", "_torchdynamo_orig_callable", "_torchdynamo_wrapper_id",
                          "get_compiler_config", "_super_module_initialized"})
"""The instance attributes, beyond nn.Module's own, that torch.compile gives an OptimizedModule (in
one torch version or another: a subset is expected). ``_forward`` (a lazy module's) is not among them."""
_MODULE_KEYS = frozenset(vars(nn.Module()))
TRUSTED_BACKENDS = ("inductor", "eager", "aot_eager", "aot_eager_decomp_partition", "cudagraphs")
"""The torch.compile backends trusted to compute what the graph Dynamo gives them computes (any mode,
options or ``dynamic``): Inductor, and torch's own that run the graph as it is (after AOTAutograd's
decompositions, or replayed as a CUDA graph). Not torch's testing or debugging backends
(``relu_accuracy_error_TESTING_ONLY`` changes the graph), nor third-party ones."""
REGISTRY_MODULE = "torch._dynamo.backends.registry"
_CHAIN_LIMIT = 16
"""How many wrappers deep the backend may be in a compiled call's callback (three in torch 2.13)."""


def _nested_code(code: CodeType, name: str) -> CodeType | None:
    """The code object named ``name`` nested in ``code`` (its functions' and their functions')."""
    for const in code.co_consts:
        if isinstance(const, CodeType):
            found = const if const.co_name == name else _nested_code(const, name)
            if found is not None:
                return found
    return None


@functools.cache
def _dynamo_codes(eval_frame: ModuleType) -> tuple[CodeType | None, CodeType | None]:
    """(the code of Dynamo's ``compile_wrapper``, nested in ``_TorchDynamoContext.__call__``; the code of
    ``external_utils.wrap_inline``'s ``inner``), or None where this torch version has no such code."""
    context = getattr(eval_frame, "_TorchDynamoContext", None)
    wrap_inline = getattr(getattr(eval_frame, "external_utils", None), "wrap_inline", None)
    call = getattr(vars(context).get("__call__") if isinstance(context, type) else None, "__code__", None)
    inline = getattr(wrap_inline, "__code__", None)
    return (_nested_code(call, "compile_wrapper") if isinstance(call, CodeType) else None,
            _nested_code(inline, "inner") if isinstance(inline, CodeType) else None)


def _cell(fn: FunctionType, name: str) -> Any:
    """The value of ``fn``'s closure variable ``name`` (LookupError where it has none)."""
    names = fn.__code__.co_freevars
    if name not in names or fn.__closure__ is None:
        raise LookupError(name)
    try:
        return fn.__closure__[names.index(name)].cell_contents
    except ValueError:  # an empty cell
        raise LookupError(name) from None


def _calls(fn: Any, module: nn.Module, inline: CodeType | None) -> bool:
    """``fn`` is ``module.__call__`` (nn.Module's, bound to it) or ``wrap_inline(module)``."""
    if isinstance(fn, MethodType):
        return fn.__self__ is module and fn.__func__ is nn.Module.__call__
    return isinstance(fn, FunctionType) and inline is not None and fn.__code__ is inline and \
        _cell(fn, "fn") is module


def inlined_callable(fn: Any) -> Any:
    """The callable ``fn`` calls where ``fn`` is Dynamo's ``external_utils.wrap_inline`` of it (the
    closure variable ``fn`` of that ``inner``, never its ``__wrapped__``, which anyone may set), else
    ``fn`` itself. torch 2.14's ``act.compile()`` of torch's own modules compiles
    ``wrap_inline(act._call_impl)``, where 2.13 compiled ``act._call_impl`` (gate.compiled_own_call)."""
    inline = _dynamo_codes(sys.modules[DYNAMO_MODULE])[1] if DYNAMO_MODULE in sys.modules else None
    if isinstance(fn, FunctionType) and inline is not None and fn.__code__ is inline:
        try:
            return _cell(fn, "fn")
        except LookupError:
            return fn
    return fn


def _torch_compile_backend(callback: Any) -> Any:
    """The backend object torch.compile made (``_TorchCompileInductorWrapper`` or
    ``_TorchCompileWrapper``) at the end of ``callback``'s chain of Dynamo's wrappers, or None."""
    wrappers = tuple(t for t in (getattr(torch, "_TorchCompileInductorWrapper", None),
                                 getattr(torch, "_TorchCompileWrapper", None)) if isinstance(t, type))
    fn = callback
    for _ in range(_CHAIN_LIMIT):
        if type(fn) in wrappers:
            return fn
        if not str(getattr(type(fn), "__module__", "")).startswith("torch._dynamo."):
            return None  # (a link of the user's)
        inner = getattr(fn, "_torchdynamo_orig_backend", None)
        fn = getattr(fn, "_torchdynamo_orig_callable", None) if inner is None else inner
    return None


def untrusted_backend(callback: Any) -> str | None:
    """None where ``callback``, the one a Dynamo compiled call (``compile_wrapper``) sets, runs one of
    :data:`TRUSTED_BACKENDS` as torch.compile passes it; else the backend's name, as far as known
    (refused: it may compute something else than the graph it is given)."""
    try:
        backend = _torch_compile_backend(callback)
        if backend is None:
            return "not torch.compile's"
        if type(backend) is getattr(torch, "_TorchCompileInductorWrapper", None):
            return None
        name = getattr(backend, "compiler_name", None)
        registry = sys.modules.get(REGISTRY_MODULE)
        if isinstance(name, str) and name in TRUSTED_BACKENDS and registry is not None and \
                backend.compiler_fn is registry.lookup_backend(name):
            return None
        return name if isinstance(name, str) else "unnamed"
    except Exception:  # (another torch version's structure: refused)
        return "not recognized"


def untrusted_compiled_call(fn: Any) -> str | None:
    """None where ``fn`` (a Dynamo ``compile_wrapper``: ``act.compile()``'s compiled call) runs a
    trusted backend (:func:`untrusted_backend` of its ``callback``); else why not."""
    try:
        return untrusted_backend(_cell(fn, "callback")) if isinstance(fn, FunctionType) else "not a function"
    except Exception:  # (no such closure variable: another structure)
        return "not recognized"


def compiled_module_of(act: Any) -> tuple[nn.Module | None, str | None]:
    """(the module ``act`` wraps, None) where ``act`` is exactly what ``torch.compile(module)`` makes,
    with a trusted backend, else (None, why not), or (None, None) where ``act`` is no OptimizedModule
    (:func:`_compiled_module_of`); never raises (a structure it cannot inspect: refused)."""
    try:
        return _compiled_module_of(act)
    except Exception as error:  # (another torch version's structure)
        return None, f"it could not be inspected ({type(error).__name__})"


def _compiled_module_of(act: Any) -> tuple[nn.Module | None, str | None]:
    """(the module ``act`` wraps, None) where ``act`` is exactly what ``torch.compile(module)`` makes:
    an ``OptimizedModule`` (not a subclass) holding no instance attribute beyond nn.Module's own and
    :data:`WRAPPER_KEYS`, no parameter, buffer or child but ``_orig_mod``, no forward hooks, an
    ``OptimizeContext``, and as its instance ``forward`` Dynamo's ``compile_wrapper`` made by that
    context, whose callable is ``_orig_mod``'s own ``__call__`` or ``wrap_inline(_orig_mod)`` and
    whose backend is trusted (:func:`untrusted_backend`).
    (None, why not) for another OptimizedModule; (None, None) for anything else. What the module
    it wraps computes is not checked here (gate.gate_activation)."""
    eval_frame = sys.modules.get(DYNAMO_MODULE)
    wrapper_type = getattr(eval_frame, "OptimizedModule", None)
    if wrapper_type is None or not isinstance(act, wrapper_type):
        return None, None
    if type(act) is not wrapper_type:
        return None, "a subclass of OptimizedModule"
    own = vars(act)
    extra = sorted(set(own) - _MODULE_KEYS - WRAPPER_KEYS)
    if extra:
        return None, f"it holds state torch.compile does not give it: {', '.join(extra)}"
    inner = act._modules.get("_orig_mod")
    if act._parameters or act._buffers or list(act._modules) != ["_orig_mod"] or not isinstance(inner, nn.Module):
        return None, "it holds parameters, buffers or modules besides the module it wraps"
    if act._forward_hooks or act._forward_pre_hooks:
        return None, "it has forward hooks"
    ctx = own.get("dynamo_ctx")
    if type(ctx) is not getattr(eval_frame, "OptimizeContext", None):
        return None, f"its Dynamo context is {type(ctx).__name__}, not torch.compile's OptimizeContext"
    compile_wrapper, inline = _dynamo_codes(eval_frame)
    forward = own.get("forward")
    try:
        if not isinstance(forward, FunctionType) or compile_wrapper is None or \
                forward.__code__ is not compile_wrapper or _cell(forward, "self") is not ctx:
            return None, "its forward is not Dynamo's compiled call of the module it wraps"
        if not _calls(_cell(forward, "fn"), inner, inline):
            return None, "its forward compiles another module's call than the one it wraps"
        backend = untrusted_backend(_cell(forward, "callback"))
        if backend is not None:
            return None, f"its compile backend ({backend}) is not one of {', '.join(TRUSTED_BACKENDS)}"
    except LookupError:
        return None, "its forward is not Dynamo's compiled call of the module it wraps"
    return inner, None
