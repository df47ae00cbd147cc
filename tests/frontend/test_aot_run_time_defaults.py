"""An ahead-of-time signature that leaves out a run-time parameter with a default (docs/language.md,
"Specialization and launching"): an annotated one takes its annotation, as one without a default
does; an unannotated one the type a launch that leaves it out gives it (``k(x, out)`` is
``k(x, out, a=<the default>)``).

History: ``signature_bindings`` took the default's value as the signature's entry, so
``a: sp.f32 = 2.0`` (or ``a=3``, ``a=np.float16(1.5)``) left out of ``k.compile({...})`` was SP0724
"the signature gives `a` = 2.0; a run-time parameter needs a type", naming a value the signature
never gave.
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.ir import types as T
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import numpy as np
import sparsile as sp


@sp.jit
def annotated(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], a: sp.f32 = 2.0):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * a)


@sp.jit
def unannotated(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], a={default}):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * a)
'''

POINTERS = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32]}


def _launch_binding(kernel, name: str):
    x, out = np.ones(8, np.float32), np.empty(8, np.float32)
    return kernel.bind((x, out), {})[1][name]


def test_an_annotated_run_time_default_takes_its_annotation(tmp_path) -> None:
    module = import_source(SOURCE.format(default="3"), tmp_path, "aot_default")
    k = module.annotated
    implicit = k.signature_bindings(dict(POINTERS))
    assert implicit == k.signature_bindings({**POINTERS, "a": sp.f32})
    assert implicit[0]["a"].type == T.f32 == _launch_binding(k, "a").type
    assert "mul" in k.compile(dict(POINTERS), stop_after="ir").ir


SPK = """\
@kernel
def k(x: ptr[f32], out: ptr[f32], a: f32 = 2.0):
    i = arange(0, 8)
    store(out + i, load(x + i) * a)
"""


def test_an_annotated_run_time_default_of_a_spk_kernel_takes_its_annotation() -> None:
    k = sp.loads(SPK, "aot_default.spk").kernels["k"]
    assert k.signature_bindings({}) == k.signature_bindings({"a": sp.f32})
    k.compile(stop_after="ir")


@pytest.mark.parametrize(("default", "expected"), [("3", T.i32), ("16", T.i32), ("2**40", T.i64), ("2.5", T.f32),
                                                   ("np.float16(1.5)", T.f16), ("np.int8(-3)", T.i8),
                                                   ("True", T.bool_)])
def test_an_unannotated_run_time_default_is_typed_as_a_launch_types_it(tmp_path, default: str, expected) -> None:
    module = import_source(SOURCE.format(default=default), tmp_path, "aot_default")
    k = module.unannotated
    bindings, key = k.signature_bindings(dict(POINTERS))
    launched = _launch_binding(k, "a")
    assert bindings["a"] == launched and bindings["a"].type == expected
    assert key == k.signature_bindings({**POINTERS, "a": launched})[1]
    k.compile(dict(POINTERS), stop_after="ir")


CHANGED = '''
import sparsile as sp


@sp.jit
def k(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], C: sp.constexpr = 2.0, *, D: sp.constexpr = 5.0):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * C + D)
'''


def test_an_ahead_of_time_compile_takes_a_default_assigned_since_the_last_one(tmp_path) -> None:
    """``k.fn.__defaults__`` / ``__kwdefaults__`` assigned after a compile: the next ahead-of-time
    compile takes the new default, as the next launch does (it kept the parameters read before,
    until a launch or ``k.ir(...)`` read them again: C=2.0 compiled after C became 3.0)."""
    k = import_source(CHANGED, tmp_path, "aot_changed").k

    def constants(ir: str) -> tuple[str, str]:
        header = ir.splitlines()[0]
        return header[header.index("[C="):].split(",")[0], header[header.index(" D="):].split(",")[0]

    assert constants(k.compile(dict(POINTERS), stop_after="ir").ir) == ("[C=2.0", " D=5.0")
    k.fn.__defaults__ = (3.0,)
    assert constants(k.compile(dict(POINTERS), stop_after="ir").ir) == ("[C=3.0", " D=5.0")
    k.fn.__kwdefaults__["D"] = 7.0
    assert constants(k.compile(dict(POINTERS), stop_after="ir").ir) == ("[C=3.0", " D=7.0")
    k.fn.__defaults__ = (4.0,)
    aot = k.signature_bindings(dict(POINTERS))[0]
    launched = k.bind((np.ones(8, np.float32), np.ones(8, np.float32)), {})[1]
    assert (aot["C"], aot["D"]) == (launched["C"], launched["D"]) and aot["C"].value == 4.0
