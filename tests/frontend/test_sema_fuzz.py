"""Fuzzing sema: mutated valid programs go through parse, sema and the interpreter (small grids, a
bounded number of operations). Whatever the mutation, the only exceptions allowed are the
diagnostic ones: CompileError, LaunchError, and InterpreterError for genuine run-time faults. An
InternalError or any other exception is a bug."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsile.driver.module import loads
from sparsile.frontend.diagnostics import CompileError, LaunchError
from sparsile.frontend.interp.values import InterpreterError
from sparsile.frontend.ir import types as T

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

SEEDS = [
    (EXAMPLES / "vector_add.spk").read_text(),
    (EXAMPLES / "softmax.spk").read_text(),
    (EXAMPLES / "transpose.spk").read_text(),
    """
def helper(x, k: constexpr = 2):
    if k > 1:
        return x * k
    return x

@kernel
def loops(x: ptr[f32], out: ptr[i32], n: i32, B: constexpr):
    acc = zeros((B,), f32)
    i = 0
    for j in range(0, n, 2):
        acc += load(x + arange(0, B), mask=arange(0, B) < n)
    while i < n:
        i += 3
    total = sum(helper(acc), axis=0)
    if total > 0.0:
        v = i
    else:
        v = -i
    for s in static_range(3):
        v = v + s
    store(out + program_id(0), v)
""",
    """
import sparsile as sp
from sparsile import zeros as z

def twice(v):
    return v * 2

N = twice(8)
SHAPE = (N, twice(4))

@kernel(num_warps=twice(2))
def module_level(x: ptr[f32], n: i32, B: constexpr = twice(N)):
    t = z(SHAPE, sp.f32) + sp.load(x + sp.arange(0, SHAPE[1]))[None, :]
    r = sp.arange(0, SHAPE[0])[:, None] * SHAPE[1] + sp.arange(0, SHAPE[1])[None, :]
    sp.store(x + r, t * B, mask=r < n)
""",
    """
@kernel
def mm(a: ptr[f16], b: ptr[f16], c: ptr[f32], n: i32, B: constexpr):
    r = arange(0, B)
    ta = load(a + r[:, None] * B + r[None, :])
    tb = load(b + r[:, None] * B + r[None, :])
    acc = dot(ta, tb, zeros((B, B), f32))
    t = (B, B // 2)
    m = max(acc, axis=1)
    store(c + r[:, None] * B + r[None, :], where(acc > m[:, None] / 2, acc, -acc.to(f16).to(f32)))
    static_assert(len(t) == 2 and t[1] * 2 == B)
""",
]

VOCABULARY = [
    "x", "y", "out", "n", "B", "BLOCK", "ROWS", "acc", "i", "j", "v", "offs", "mask", "rows", "cols", "tile",
    "load", "store", "arange", "zeros", "full", "where", "sum", "max", "min", "exp", "log", "sqrt", "abs",
    "maximum", "minimum", "dot", "cdiv", "program_id", "num_programs", "static_assert", "static_range", "range",
    "reshape", "permute", "trans", "expand_dims", "broadcast_to", "to", "shape", "dtype", "len", "int", "float",
    "f32", "f16", "i32", "i8", "u8", "bool", "ptr", "tensor", "constexpr", "None", "True", "False",
    "0", "1", "2", "-1", "3", "16", "17", "64", "1024", "0.5", "1e30", "2**40", "(1, 2)", "()", '"s"',
    "+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^", "<", ">", "==", "!=", "not", "and", "or",
    "[:, None]", "[None, :]", "[0]", ".to(f16)", ".shape", "(", ")", ",", ":", "=", "if", "else", "return", "pass",
]

NAMES = [v for v in VOCABULARY if v.isidentifier() and v not in ("not", "and", "or", "if", "else", "return", "pass")]
NUMBERS = ["0", "1", "2", "3", "-1", "16", "17", "64", "1024", "0.5", "1e30", "2**40", "(16, 16)"]
OPERATORS = ["+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^", "<", ">", "==", "!=", "<=", ">="]

KEYWORDS = {"def", "for", "in", "if", "else", "elif", "while", "return", "pass", "import", "from", "as", "and", "or",
            "not", "is", "None", "True", "False", "kernel", "assert"}


def _pool(token: str) -> list[str]:
    """Tokens that can stand where ``token`` stands without breaking the syntax."""
    if token.isidentifier():
        return [] if token in KEYWORDS else NAMES
    if token[0].isdigit():
        return NUMBERS
    return OPERATORS if token in OPERATORS else []


TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\d+\.\d*(?:e-?\d+)?|\d+|\"[^\"\n]*\"|\*\*|//|<<|>>|[<>=!]=|\n[ ]*|[ ]+|.")


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


@st.composite
def mutated_program(draw) -> str:
    toks = tokens(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        positions = [i for i, t in enumerate(toks) if t.strip()]
        i = draw(st.sampled_from(positions))
        kind = draw(st.sampled_from(["similar"] * 6 + ["replace", "insert", "delete", "duplicate", "swap", "line"]))
        if kind == "similar":  # keeps the syntax valid most of the time: more programs reach sema
            i = draw(st.sampled_from([k for k in positions if _pool(toks[k])]))
            toks[i] = draw(st.sampled_from(_pool(toks[i])))
        elif kind == "replace":
            toks[i] = draw(st.sampled_from(VOCABULARY))
        elif kind == "insert":
            toks.insert(i, draw(st.sampled_from(VOCABULARY)) + " ")
        elif kind == "delete":
            del toks[i]
        elif kind == "duplicate":
            toks.insert(i, toks[i])
        elif kind == "swap":
            j = draw(st.sampled_from(positions))
            toks[i], toks[j] = toks[j], toks[i]
        else:  # delete or duplicate a whole line
            lines = "".join(toks).split("\n")
            k = draw(st.integers(0, len(lines) - 1))
            if draw(st.booleans()):
                del lines[k]
            else:
                lines.insert(k, lines[k])
            toks = tokens("\n".join(lines))
    return "".join(toks)


def argument_for(p, rng: np.random.Generator):
    """A plausible value for a kernel parameter (small arrays, small sizes)."""
    ann = p.annotation
    if ann is T.CONSTEXPR:
        return 16
    if isinstance(ann, T.PointerType):
        return (rng.uniform(-2, 2, 4096) + 3).astype(T.numpy_dtype(ann.elem if ann.elem != T.tf32 else T.f32))
    if isinstance(ann, T.TensorType):
        return (rng.uniform(-2, 2, (24,) * ann.rank) + 3).astype(T.numpy_dtype(ann.elem))
    if isinstance(ann, T.ScalarType):
        return 2.0 if ann.is_float else (True if ann.is_bool else 37)
    return (rng.uniform(-2, 2, 4096) + 3).astype(np.float32) if p.name in ("x", "y", "out", "a", "b", "c") else 37


ALLOWED = (CompileError, LaunchError, InterpreterError)


def run_program(text: str) -> None:
    """Parse, specialize, analyse and interpret every kernel of ``text`` (2 programs each)."""
    rng = np.random.default_rng(0)
    try:
        module = loads(text, "fuzz.spk")
    except ALLOWED:
        return
    for kernel in module.kernels.values():
        try:
            args = [argument_for(p, rng) for p in kernel.params]
            kernel.interpret[(2,)](*args, max_ops=3000)
        except ALLOWED:
            pass


def test_seeds_run_cleanly() -> None:
    for seed in SEEDS:
        module = loads(seed, "seed.spk")
        rng = np.random.default_rng(0)
        for kernel in module.kernels.values():
            kernel.interpret[(2,)](*[argument_for(p, rng) for p in kernel.params], max_ops=100_000)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_program())
def test_mutated_programs_raise_only_diagnostics(text: str) -> None:
    run_program(text)


@pytest.mark.parametrize("text", [
    "@kernel\ndef k(x: ptr[f32]):\n    y = 2 ** 2 ** 2 ** 2 ** 2\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = (1,) * 10 ** 12\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = 1 << 100000\n",
    '@kernel\ndef k(x: ptr[f32]):\n    y = "a" * 10 ** 12\n',
    "@kernel\ndef k(x: ptr[f32]):\n    y = full((16,), 1e400, f16)\n    store(x + arange(0, 16), y)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = int(float('nan'))\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = i8(1e100)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = max((1, (2,)))\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = (1, 2)[1:2:0]\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = ptr[ptr]\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = tensor[f32, 2.5]\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = x.load_tile((0,), (16,))\n",
    "@kernel\ndef k(x: ptr[f32]):\n    store(x + arange(0, 16), zeros((16,), f32) // 0)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    store(x + arange(0, 16).to(u8) + 255, 1.0)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    for i in range(2 ** 40):\n        pass\n",
    "@kernel\ndef k(x: ptr[f32], n: i64):\n    for i in range(n, 2 ** 62, 2 ** 61):\n        store(x, 1.0)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = arange(0, 16)[:, None, None, None, None, None]\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = reshape(zeros((16,), f32), (0, 16))\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = permute(zeros((4, 8), f32), (5, 1))\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = sum(zeros((4, 8), f32), axis=True)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = program_id(True)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = x.shape\n    z = x.dtype\n",
    "@kernel\ndef k(x: ptr[f32]):\n    def f(a):\n        return f\n    y = f(1)(2)\n",
    "@kernel\ndef k(x):\n    static_print(x, 1, (2, 3))\n",
    "@kernel\ndef k(x: ptr[f32], B: constexpr = 1 // 0):\n    pass\n",
    "@kernel(num_warps=1 // 0)\ndef k(x: ptr[f32]):\n    pass\n",
    "X = Y\n@kernel\ndef k(x: ptr[f32]):\n    pass\n",
    "from sparsile import *\n@kernel\ndef k(x: ptr[f32]):\n    store(x, 1.0)\n",
    "import sparsile.nothing\n",
    "def f(x):\n    return x + nope\nX = f(1)\n",
    "def f(x):\n    return x + nope\n@kernel\ndef k(a: ptr[f32], B: constexpr = f(1)):\n    pass\n",
    "def f(x):\n    return x + nope\n@kernel(num_warps=f(1))\ndef k(a: ptr[f32]):\n    pass\n",
    "def f(x):\n    return f(x)\nX = f(1)\n",
    "@kernel\ndef k(x: ptr[f32], BM: constexpr % 32):\n    pass\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    i = 64\n    while i < x:\n        i += 3\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    y = where(n > 0, x, 1)\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    y = maximum(x, x)\n",
    "@kernel\ndef k(x: ptr[f32], y: ptr[f16], n: i32):\n    z = where(n > 0, x, y)\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    z = x if n > 0 else x + 1\n    store(z, 1.0)\n    b = x < x + 1\n",
    "@kernel\ndef k(t: tensor[f32, 2], n: i32):\n    c = 1 - t\n    d = exp(t) + sum(t) + t[:, None]\n",
    "@kernel\ndef k(t: tensor[f32, 2], n: i32):\n    c = full((16,), t, f32)\n    store(t, load(t))\n",
    "@kernel\ndef k(t: tensor[f32, 2], n: i32):\n    for i in range(t):\n        assert t\n",
    "@kernel\ndef k(t: tensor[f32, 2], n: i32):\n    x = n\n    if n > 0:\n        x = t\n",
    "@kernel\ndef k(t: tensor[f32, 2], n: i32):\n    x = n\n    for i in range(n):\n        x = t\n",
    "@kernel\ndef k(t: tensor[f32, 2], n: i32):\n    x = t.load_tile((0, t), (16, 16)) + f32(t)\n",
    "@kernel\ndef k(x: ptr[f32], out: ptr[f32]):\n    store(out + arange(0, 16), x)\n    y = f16(x)\n",
    "@kernel\ndef k(x: ptr[f32], out: ptr[f32]):\n    y = load(x, mask=True, other=x) + full((16,), x, f32)\n",
    "def f(x):\n    if x:\n        return 1\nX = f(program_id(0))\n",
    "@kernel\ndef k(x: ptr[e4m3]):\n    store(x + arange(0, 16), load(x + arange(0, 16)) * 2)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = where(x > x, x, x)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    store(x, load(x) > 1.0)\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = dot(zeros((16, 16), f64), zeros((16, 16), f64))\n",
    "@kernel\ndef k(x: ptr[f32]):\n    y = sparse_dot(zeros((16, 8), f16), zeros((16, 1), u32),\n"
    "                   zeros((16, 16), f16))\n",
])
def test_nasty_programs_raise_only_diagnostics(text: str) -> None:
    run_program(text)


def test_dot_of_pointer_tiles_is_a_diagnostic() -> None:
    run_program("@kernel\ndef k(x: ptr[f16]):\n    t = x + arange(0, 16)[:, None] + arange(0, 16)[None, :]\n"
                "    c = dot(t, t)\n")
