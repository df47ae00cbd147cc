"""``@sparsile.jit`` over unusual Python source forms: each computes what Python computes on the
same inputs, or is reported with a diagnostic at the user's own source line, with a help text."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support.jit_source import import_source

WRAPPING_DECORATOR = '''
import functools

SCALE = 100.0   # not the kernel module's SCALE: the kernel must never read it


def logged(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper
'''

KERNEL_UNDER_A_WRAPPER = '''
import sparsile as sp
{decorators}

SCALE = 2.0


def make():
    factor = 3.0

    @sp.jit
    @decorators.logged
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * SCALE * factor)

    @sp.jit
    @decorators.logged
    def bad(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * undefined_name)

    return k, bad
'''


def test_a_functools_wraps_decorator_below_jit_reads_the_kernels_own_names(tmp_path) -> None:
    # The wrapper's globals (another module's SCALE) and closure (`f`) were read instead of the
    # kernel's, and its first line placed every span a few lines off.
    decorators = import_source(WRAPPING_DECORATOR, tmp_path, "wrapping_decorator")
    sys.modules[decorators.__name__] = decorators
    try:
        text = KERNEL_UNDER_A_WRAPPER.format(decorators=f"import {decorators.__name__} as decorators")
        module = import_source(text, tmp_path, "under_a_wrapper")
    finally:
        del sys.modules[decorators.__name__]
    k, bad = module.make()
    x = np.random.default_rng(52).uniform(-2.0, 2.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    k.interpret[(1,)](x, out)
    np.testing.assert_allclose(out, x.astype(np.float64) * 2.0 * 3.0, rtol=1e-6)

    with pytest.raises(sp.CompileError) as info:
        bad.interpret[(1,)](x, out)
    d = info.value.diagnostics[0]
    assert d.code == "SP0202" and d.message == "unknown name `undefined_name`"
    lines = text.splitlines()
    line = next(n for n, s in enumerate(lines, 1) if "* undefined_name" in s)
    assert (d.span.file_line, d.span.file_col) == (line, lines[line - 1].index("undefined_name") + 1)
