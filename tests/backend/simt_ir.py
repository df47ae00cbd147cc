"""Test helpers that evaluate layouts and emitted LLVM IR for every thread at once (numpy).

:func:`apply_all` is :meth:`LinearLayout.apply` over arrays of input points; :class:`SimtIR` runs the
straight-line IR that ``load_tile`` / ``store_tile`` emit for a set of threads together (one numpy
element per thread), forking the set at a branch whose condition differs between threads. Both do,
element by element, exactly what the one-point versions do; they exist so that tests which check
every (warp, thread, register) cell do not spend seconds in Python loops.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from sparsile.frontend.layout.layouts import LinearLayout

_M32 = np.uint64(0xFFFFFFFF)
_M64 = (1 << 64) - 1


def apply_all(layout: LinearLayout, **inputs: np.ndarray | int) -> dict[str, np.ndarray]:
    """``layout.apply(**point)`` for every point of the broadcast ``inputs`` arrays: a dict of
    int64 arrays, one per output dim. As with ``apply``, a missing input dim is 0 and an unknown
    dim or an out-of-range input is an error."""
    unknown = set(inputs) - set(layout.in_names)
    if unknown:
        raise ValueError(f"unknown input dims {sorted(unknown)}; the layout has {list(layout.in_names)}")
    arrays = np.broadcast_arrays(*(np.asarray(v, dtype=np.int64) for v in inputs.values()))
    shape = arrays[0].shape if arrays else ()
    cols = layout.flat_columns()
    offsets = layout.in_bit_offsets()
    flat_out = np.zeros(shape, dtype=np.int64)
    for (name, size), v in zip(((n, layout.in_size(n)) for n in inputs), arrays):
        if v.size and not ((v >= 0).all() and (v < size).all()):
            raise ValueError(f"input {name} outside 0..{size - 1}")
        for b in range(layout.in_bits(name)):
            flat_out ^= np.where((v >> b) & 1, np.int64(cols[offsets[name] + b]), np.int64(0))
    out, shift = {}, 0
    for name, size in layout.out_dims:
        out[name] = (flat_out >> shift) & (size - 1)
        shift += (size - 1).bit_length()  # sizes are powers of two
    return out


#: ``access(name, tids, addr, split) -> (lanes, cols)``: the TMEM cells of a ``tcgen05.ld/st`` call,
#: arrays of shape (threads, registers).
Access = Callable[[str, np.ndarray, np.ndarray, "int | None"], tuple[np.ndarray, np.ndarray]]

_ASSIGN = re.compile(r"^\s*(%[\w.]+) = (.*)$")
_ARG = re.compile(r"(?:<\d+ x i32>|\{[^}]*\}|[\w() ]+?)\s+(%[\w.]+|-?\d+|poison|false|true)")
_BINOPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and, "or": np.bitwise_or,
    "xor": np.bitwise_xor, "shl": np.left_shift, "lshr": np.right_shift, "udiv": np.floor_divide,
}


def _u64(x: object) -> np.ndarray:
    """An operand as uint64 (a negative constant as its two's complement: the same low 32 bits)."""
    if isinstance(x, int):
        return np.uint64(x & _M64)
    assert x is not None, "an operation on a poison value"
    return np.asarray(x, dtype=np.uint64)


def _take(value: object, mask: np.ndarray) -> object:
    if isinstance(value, np.ndarray) and value.ndim:
        return value[mask]
    if isinstance(value, list):
        return [_take(v, mask) for v in value]
    return value


class SimtIR:
    """Evaluates the LLVM IR of ``load_tile``/``store_tile`` for the threads ``tids`` at once:
    straight-line code and branches without phis.

    Values are Python ints (constants), uint64 arrays with one element per thread (bit patterns;
    floats are kept as their bits) or lists of those (vectors, aggregates); ``None`` is poison.
    ``tcgen05.ld`` calls read ``tmem[lane, col]`` at the cells ``access`` gives; ``tcgen05.st``
    calls append ``(tids, lanes, cols, values)`` to ``writes``. A branch whose condition differs
    between threads runs each side with its threads; ``leaves`` holds ``(tids, env)`` of every
    path that reached the end."""

    def __init__(self, lines: list[str], tids: np.ndarray, access: Access, tmem: np.ndarray | None = None,
                 writes: list | None = None):
        self.lines = [ln.strip() for ln in lines]
        self.labels = {ln[:-1]: i for i, ln in enumerate(self.lines) if ln.endswith(":")}
        self.access, self.tmem = access, tmem
        self.writes = writes if writes is not None else []
        self.leaves: list[tuple[np.ndarray, dict[str, object]]] = []
        self._run(0, np.asarray(tids, dtype=np.int64), {})

    def gather(self, tok: str, n_threads: int) -> np.ndarray:
        """The value ``tok`` for threads 0..n_threads-1, from the path each thread took."""
        out = np.zeros(n_threads, dtype=np.uint64)
        seen = np.zeros(n_threads, dtype=bool)
        for tids, env in self.leaves:
            out[tids] = _u64(self.val(env, tok))
            seen[tids] = True
        assert seen.all(), "a thread did not reach the end"
        return out

    def _run(self, pc: int, tids: np.ndarray, env: dict[str, object]) -> None:
        while pc < len(self.lines):
            line = self.lines[pc]
            pc += 1
            if m := re.match(r"br label %([\w.]+)$", line):
                pc = self.labels[m.group(1)]
            elif m := re.match(r"br i1 (\S+), label %([\w.]+), label %([\w.]+)$", line):
                cond = np.broadcast_to(_u64(self.val(env, m.group(1))) != 0, tids.shape)
                if cond.all() or not cond.any():
                    pc = self.labels[m.group(2) if cond.all() else m.group(3)]
                else:
                    for side, label in ((cond, m.group(2)), (~cond, m.group(3))):
                        self._run(self.labels[label], tids[side], {k: _take(v, side) for k, v in env.items()})
                    return
            else:
                self._step(line, tids, env)
        self.leaves.append((tids, env))

    @staticmethod
    def val(env: dict[str, object], tok: str) -> object:
        tok = tok.strip()
        if tok.startswith("%"):
            return env[tok]
        if tok in ("poison", "undef"):
            return None
        if tok in ("false", "true"):
            return int(tok == "true")
        return int(tok)

    def _args(self, env: dict[str, object], text: str) -> list[object]:
        return [self.val(env, m.group(1)) for m in _ARG.finditer(text)]

    def _tcgen05(self, name: str, args: list[object], tids: np.ndarray, dst: str | None,
                 env: dict[str, object]) -> None:
        split = None
        if "16x32bx2" in name:
            assert isinstance(args[1], int), "the half-split offset is not an immediate"
            split = args[1]
        addr = np.broadcast_to(_u64(args[0]), tids.shape).astype(np.int64)
        lanes, cols = self.access(name, tids, addr, split)
        if ".ld." in name:
            assert args[-1] == 0, "tcgen05.ld emitted with .pack::16b"
            assert self.tmem is not None
            inside = (lanes >= 0) & (lanes < self.tmem.shape[0]) & (cols >= 0) & (cols < self.tmem.shape[1])
            assert inside.all(), "tcgen05.ld reads a TMEM cell outside the region"
            words = self.tmem[lanes, cols]
            env[dst] = [words[:, k] for k in range(words.shape[1])] if words.shape[1] > 1 else words[:, 0]
        else:
            assert args[-1] == 0, "tcgen05.st emitted with .unpack::16b"
            data = args[-2] if isinstance(args[-2], list) else [args[-2]]
            assert len(data) == lanes.shape[1], "tcgen05.st with the wrong number of registers"
            for k, v in enumerate(data):
                self.writes.append((tids, lanes[:, k], cols[:, k], np.broadcast_to(_u64(v), tids.shape)))

    def _step(self, line: str, tids: np.ndarray, env: dict[str, object]) -> None:
        if not line or line.endswith(":"):
            return
        m = _ASSIGN.match(line)
        dst, rhs = (m.group(1), m.group(2)) if m else (None, line)
        if rhs.startswith("call") and "sreg.tid.x" in rhs:
            env[dst] = tids.astype(np.uint64)
            return
        call = re.match(r"call .*?@(llvm\.nvvm\.tcgen05\.(?:ld|st)\.[\w.]+)\((.*)\)", rhs)
        if call:
            self._tcgen05(call.group(1), self._args(env, call.group(2)), tids, dst, env)
            return
        if rhs.startswith("call") and "tcgen05.wait" in rhs:
            if dst is not None:  # the tied asm: returns its inputs
                env[dst] = self._args(env, rhs[rhs.rindex("(") + 1:])
            return
        if rhs.startswith("call"):
            return
        op, rest = rhs.split(" ", 1)
        if op == "icmp":
            pred, _ty, operands = rest.split(" ", 2)
            a, b = (_u64(self.val(env, x)) for x in operands.split(","))
            env[dst] = {"eq": a == b, "ne": a != b}[pred].astype(np.uint64)
        elif op in _BINOPS:
            rest = re.sub(r"^(nuw |nsw |exact )*", "", rest)
            a, b = (_u64(self.val(env, x)) for x in rest.split(" ", 1)[1].split(","))
            env[dst] = _BINOPS[op](a, b) & _M32
        elif op in ("inttoptr", "bitcast", "zext"):
            env[dst] = self.val(env, rest.split(" ")[1])
        elif op == "trunc":
            src, ty = rest.split(" ")[1], rest.split(" to ")[1]
            env[dst] = _u64(self.val(env, src)) & np.uint64((1 << int(ty[1:])) - 1)
        elif op == "extractelement":
            vec, idx = re.match(r"<[^>]*> (%[\w.]+), i32 (\d+)", rest).groups()
            env[dst] = self.val(env, vec)[int(idx)]
        elif op == "extractvalue":
            agg, idx = re.match(r"\{[^}]*\} (%[\w.]+), (\d+)", rest).groups()
            env[dst] = self.val(env, agg)[int(idx)]
        elif op == "insertelement":
            n, vec, v, idx = re.match(r"<(\d+) x i32> (\S+), i32 (\S+), i32 (\d+)", rest).groups()
            old = self.val(env, vec)
            new = list(old) if old is not None else [None] * int(n)
            new[int(idx)] = self.val(env, v)
            env[dst] = new
        else:
            raise AssertionError(f"the evaluator does not know: {line}")
