"""Two untyped literals that meet with nothing else to give them a type (``where(c, 2**63, 1)``,
``maximum(2**63, 1)``, ``2**63 if c else 1``, a run-time ``if`` assigning a literal in each branch)
take one type together: ``f32`` when one is a float, else the first of ``i32``, ``i64`` and ``u64``
that holds both (docs/language.md, rule 1). ``2**63`` and ``1`` are ``u64``, as the lone literal
``2**63`` is and as ``2**63 + 1`` folds to a constant that is; before, each literal took its own
type first and ``2**63`` was SP0303 "does not fit in i64" even where the result was stored to a
``u64`` pointer. Two literals that no one integer type holds (``2**63`` and ``-1``) are SP0303,
never a silent wrap of ``-1`` to ``2**64 - 1``."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError
from sparsile.tests.support.hw_agreement_cases import kernel

N = 64
BIG = 2**63
U64_MAX = 2**64 - 1

SPK = """
@kernel
def k(c: ptr[i32], out: ptr[u64]):
    i = arange(0, 64)
    m = load(c + i) > 0
    store(out + i, where(m, 2**63, 1))
    store(out + 64 + i, where(m, 2**64 - 1, 2**63 + 5))
    store(out + 128 + i, maximum(where(m, 2**63, 1), 2**63 + 7))
    store(out + 192 + i, 2**63 + 3 if load(c) > 0 else 2)
    if load(c + 1) > 0:
        x = 2**63 + 9
    else:
        x = 4
    store(out + 256 + i, x)
"""


@sp.jit
def k_jit(c, out):
    i = sp.arange(0, 64)
    m = sp.load(c + i) > 0
    sp.store(out + i, sp.where(m, 2**63, 1))
    sp.store(out + 64 + i, sp.where(m, 2**64 - 1, 2**63 + 5))
    sp.store(out + 128 + i, sp.maximum(sp.where(m, 2**63, 1), 2**63 + 7))
    sp.store(out + 192 + i, 2**63 + 3 if sp.load(c) > 0 else 2)
    if sp.load(c + 1) > 0:
        x = 2**63 + 9
    else:
        x = 4
    sp.store(out + 256 + i, x)


def _reference(c: np.ndarray) -> list[int]:
    m = [int(v) > 0 for v in c]
    want = [BIG if t else 1 for t in m]
    want += [U64_MAX if t else BIG + 5 for t in m]
    want += [max(BIG if t else 1, BIG + 7) for t in m]
    want += [BIG + 3 if m[0] else 2] * N
    want += [BIG + 9 if m[1] else 4] * N
    return want


@pytest.mark.parametrize("frontend", ["spk", "jit"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_integer_literals_take_the_smallest_type_that_holds_both(frontend: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    c = rng.integers(-5, 6, N).astype(np.int32)
    c[:2] = [seed % 2 * 2 - 1, (seed + 1) % 2 * 2 - 1]  # both branches of the scalar choices over the seeds
    out = np.full(5 * N, 0xDEADBEEF, np.uint64)  # poisoned
    k = kernel(SPK) if frontend == "spk" else k_jit
    k.interpret[(1,)](c, out)
    assert [int(v) for v in out] == _reference(c)


@pytest.mark.parametrize(("expr", "t"), [
    ("where(c > 0, 2**63, 1)", "u64"), ("where(c > 0, 1, 2**64 - 1)", "u64"), ("where(c > 0, 2**31, 1)", "i64"),
    ("where(c > 0, -2**63, 1)", "i64"), ("where(c > 0, 5, -1)", "i32"), ("where(c > 0, 2**63, 0.5)", "f32"),
    ("where(c > 0, True, 2**63)", "u64"), ("maximum(2**63, 1)", "u64"), ("(2**63 if c > 0 else 1)", "u64"),
])
def test_the_type_two_literals_take(expr: str, t: str) -> None:
    src = f"@kernel\ndef k(c: i32, out: ptr[u64]):\n    static_assert({expr}.dtype == {t}, str({expr}.dtype))\n"
    kernel(src).interpret[(1,)](1, np.zeros(1, np.uint64))


def test_a_lone_big_literal_is_u64_as_the_pair() -> None:
    """``2**63`` on its own, carried by a run-time loop, is a u64 value (it was SP0303 at i64)."""
    k = kernel("""
@kernel
def k(n: i32, out: ptr[u64]):
    x = 2**63
    for j in range(n):
        x = x + 3
    static_assert(x.dtype == u64, "u64")
    store(out, x)
""")
    for n in (0, 5):
        out = np.full(1, 0xDEADBEEF, np.uint64)
        k.interpret[(1,)](n, out)
        assert int(out[0]) == BIG + 3 * n


def _diagnostic(body: str) -> tuple[str, str, tuple[int, int], str | None]:
    with pytest.raises(CompileError) as e:
        kernel(f"@kernel\ndef k(c: i32, out: ptr[u64]):\n{body}").interpret[(1,)](1, np.zeros(1, np.uint64))
    d = e.value.diagnostics[0]
    return d.code, d.message, (d.span.line, d.span.col), d.help


@pytest.mark.parametrize(("body", "pair", "at"), [
    ("    store(out, where(c > 0, 2**63, -1))\n", (BIG, -1), (3, 16)),
    ("    store(out, where(c > 0, -1, 2**63))\n", (-1, BIG), (3, 16)),
    ("    store(out, 2**63 if c > 0 else -1)\n", (BIG, -1), (3, 16)),
    ("    if c > 0:\n        x = 2**63\n    else:\n        x = -1\n    store(out, x)\n", (BIG, -1), (3, 5)),
])
def test_two_literals_no_integer_type_holds_are_sp0303_not_a_wrap(body: str, pair: tuple[int, int],
                                                                 at: tuple[int, int]) -> None:
    code, message, span, help_text = _diagnostic(body)
    assert (code, message, span) == ("SP0303", f"no integer type holds both {pair[0]} and {pair[1]}", at)
    assert help_text is not None and "first of i32, i64 and u64" in help_text


@pytest.mark.parametrize(("body", "value", "t", "at"), [
    ("    store(out, where(c > 0, 2**64, 1))\n", 2**64, "u64", (3, 29)),
    ("    store(out, where(c > 0, 1, -2**63 - 1))\n", -2**63 - 1, "i64", (3, 32)),
])
def test_a_literal_no_integer_type_holds_is_sp0303_at_the_literal(body: str, value: int, t: str,
                                                                  at: tuple[int, int]) -> None:
    code, message, span, _ = _diagnostic(body)
    assert (code, message, span) == ("SP0303", f"the literal {value} does not fit in {t}", at)
