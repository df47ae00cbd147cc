"""``inspect.signature`` of a kernel and of the ``Kernel`` class.

A ``@jit`` kernel's signature is its function's (the defaults Python evaluated: docs/language.md,
"What a kernel captures"); a ``.spk`` kernel has none of its own. The class itself keeps the
signature of its constructor: ``Kernel.__signature__`` was a property, so reading it on the class gave
the property object, and ``inspect.signature(Kernel)`` (pydoc's, IPython's ``Kernel?``, sphinx's
autodoc, ``dataclasses``) stopped at inspect's "TypeError: unexpected object <property ...> in
__signature__ attribute"."""

from __future__ import annotations

import inspect

import numpy as np

import sparsile as sp
from sparsile.driver.kernel import Kernel

HALF = np.float16(1.5)


@sp.jit
def scaled(x, out, a=HALF, *, BLOCK: sp.constexpr = 8):
    i = sp.arange(0, BLOCK)
    sp.store(out + i, sp.load(x + i) * a)


def test_the_kernel_class_has_its_constructors_signature() -> None:
    assert list(inspect.signature(Kernel).parameters) == list(inspect.signature(Kernel.__init__).parameters)[1:]
    assert list(inspect.signature(Kernel).parameters)[:2] == ["node", "globals"]


def test_a_jit_kernel_has_its_functions_signature() -> None:
    assert inspect.signature(scaled) == inspect.signature(scaled.fn)
    assert inspect.signature(scaled).parameters["a"].default == np.float16(1.5)
    assert inspect.signature(scaled).parameters["BLOCK"].default == 8


def test_a_spk_kernel_has_no_signature_of_its_own() -> None:
    k = sp.loads("@kernel\ndef k(x: ptr[f32], n: i32):\n    store(x, load(x))\n").kernels["k"]
    assert k.fn is None and k.__signature__ is None
