"""A captured ``fractions.Fraction`` or ``decimal.Decimal`` keys the compile cache by its exact value
(docs/language.md, "What a kernel captures").

History: ``fingerprint`` keyed both as "objects", on disk by their type's name alone, yet a kernel
folds their value (``x * float(v)``, ``v < 1``, ``float(v / 3)``): two kernels of one source
capturing ``Fraction(1, 3)`` and ``Fraction(2, 3)`` (or ``Decimal("-0")`` and ``Decimal("0")``)
shared one compile cache entry, and the second compiled to the first's PTX, silently (the
interpreter, which does not go through that cache, gave the right numbers). A Decimal's arithmetic
rounds to the precision of the thread's decimal context, so the context is part of its key too.
"""

from __future__ import annotations

import decimal
import os
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.sema.fingerprints import fingerprint
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import distinct_cached_ptx, scales_x
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import sparsile as sp


def make_float(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * float(v))

    return k


def make_third(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * float(v / 3))

    return k
'''

fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.mark.parametrize("values", [
    (Fraction(1, 3), Fraction(2, 3)),
    (Fraction(-1, 7), Fraction(1, 7)),
    (Decimal("1.5"), Decimal("2.5")),
    (Decimal("-0"), Decimal("0")),  # equal Decimals, yet -0.0 and 0.0 in the kernel
], ids=["fraction", "fraction-sign", "decimal", "decimal-zero"])
def test_a_captured_fraction_or_decimal_keys_the_compile_cache_by_its_value(tmp_path, fresh_cache, values) -> None:
    module = import_source(SOURCE, tmp_path, "fraction_capture")
    kernels = []
    for v in values:
        kernels.append(module.make_float(v))
        scales_x(kernels[-1], float(v))
    assert len(distinct_cached_ptx(kernels)) == 2


def test_a_decimal_is_keyed_with_the_precision_its_arithmetic_rounds_to(tmp_path, fresh_cache) -> None:
    module = import_source(SOURCE, tmp_path, "decimal_context")
    kernels = []
    for prec in (2, 28):  # Decimal(1) / 3 is 0.33 or 0.3333...
        with decimal.localcontext(prec=prec):
            kernels.append(module.make_third(Decimal(1)))
            scales_x(kernels[-1], float(Decimal(1) / 3))
            ptx = distinct_cached_ptx(kernels[-1:])
        assert len(ptx) == 1
    with decimal.localcontext(prec=2):
        first = distinct_cached_ptx(kernels[:1])
    assert first != ptx


def test_one_kernel_follows_the_decimal_context_of_each_call(tmp_path) -> None:
    kernel = import_source(SOURCE, tmp_path, "decimal_calls").make_third(Decimal(1))
    for prec in (2, 28, 2):
        with decimal.localcontext(prec=prec):
            scales_x(kernel, float(Decimal(1) / 3))


def test_fractions_and_decimals_are_fingerprinted_by_their_exact_values() -> None:
    assert fingerprint(Fraction(1, 3)) == fingerprint(Fraction(2, 6)) != fingerprint(Fraction(2, 3))
    assert fingerprint(Fraction(1, 3)) != fingerprint(Fraction(-1, 3))
    assert fingerprint(Decimal("1.5")) == fingerprint(Decimal("1.5")) != fingerprint(Decimal("2.5"))
    assert fingerprint(Decimal("-0")) != fingerprint(Decimal("0"))
    assert fingerprint(Decimal("NaN1")) != fingerprint(Decimal("NaN2")) != fingerprint(Decimal("sNaN2"))

    class Third(Fraction):
        pass

    assert fingerprint(Third(1, 3)) != fingerprint(Fraction(1, 3))


CHILD = '''
import os
from decimal import Decimal
from fractions import Fraction

import sparsile as sp
from sparsile.driver import cache

F = Fraction(int(os.environ["F_NUM"]), 3)
D = Decimal(os.environ["D_TEXT"])


@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * float(F))
    sp.store(out + 8 + i, sp.load(x + i) * float(D))


ptx = k.compile({"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32]}, stop_after="ptx").ptx
stats = cache.default_cache().stats
print("hits", stats.disk_hits, "misses", stats.misses)
print(ptx)
'''


def test_a_new_process_with_another_fraction_or_decimal_compiles_anew(tmp_path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = Path(sp.__file__).resolve().parents[1]

    def child(num: int, text: str) -> tuple[str, str]:
        env = {**os.environ, "F_NUM": str(num), "D_TEXT": text, "SPARSILE_CACHE_DIR": str(tmp_path / "cache"),
               "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        stats, _, ptx = done.stdout.partition("\n")
        return stats, ptx

    first = child(1, "1.5")
    assert first[0] == "hits 0 misses 1"
    for num, text in ((2, "1.5"), (1, "2.5"), (1, "-0"), (-1, "1.5")):
        other = child(num, text)
        assert other[0] == "hits 0 misses 1" and other[1] != first[1], (num, text)
    assert child(1, "1.5") == ("hits 1 misses 0", first[1])


SIGNALS = '''
from decimal import Decimal

import sparsile as sp

NAN = Decimal("NaN")
SNAN = Decimal("sNaN")
INF = Decimal("Infinity")


@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    c = {expr}
    sp.store(out + i, sp.load(x + i) * c)
'''


@pytest.mark.parametrize(("expr", "operand", "message"), [
    ("2.0 if NAN < 1 else 3.0", "NAN < 1", "`<` of Decimal('NaN') and 1"),
    ("2.0 if SNAN == 1 else 3.0", "SNAN == 1", "`==` of Decimal('sNaN') and 1"),
    ("float(INF * 0)", "INF * 0", "`*` of Decimal('Infinity') and 0"),
    ("float(-SNAN)", "-SNAN", "`-` of Decimal('sNaN')"),
    ("2.0 if SNAN in (1, 2) else 3.0", "SNAN in (1, 2)", "`in` of Decimal('sNaN') and (1, 2)"),
])
def test_a_decimal_operation_that_signals_is_a_diagnostic(tmp_path, expr, operand, message) -> None:
    """`Decimal("NaN") < 1` raises decimal.InvalidOperation (the context traps it): an internal
    traceback before."""
    text = SIGNALS.format(expr=expr)
    module = import_source(text, tmp_path, "decimal_signal")
    out = np.full(8, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        module.k.interpret[(1,)](np.ones(8, np.float32), out)
    assert np.isnan(out).all()
    d = info.value.diagnostics[0]
    assert d.code == "SP0329"
    assert d.message == f"{message} signals decimal.InvalidOperation in the thread's decimal context"
    line = text.split("\n")[d.span.file_line - 1]
    assert line[d.span.file_col - 1:].startswith(operand)
    assert "decimal.localcontext" in d.help
