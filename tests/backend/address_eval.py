"""Test helper: the global memory addresses a kernel's straight-line LLVM IR accesses, for every thread
of one program at once (numpy), so that a test can compare them with the addresses the interpreter's
offsets define.

:func:`global_accesses` evaluates, on demand, only what the accesses' pointers and predicates read
(integer arithmetic of 32 and 64 bits, wrapping as LLVM does, ``sext``/``zext``/``trunc``,
``getelementptr``, ``icmp`` and the inline asm of the backend's opaque address arithmetic), from
``ctaid.x`` / ``.y`` / ``.z``, ``tid.x`` and the kernel parameters' values.
Accesses are the predicated ``ld.global``/``st.global`` inline asm of masked loads and stores and the
plain ``load``/``store`` of unmasked ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

_DEF = re.compile(r"^\s*(%[\w.]+) = (.*)$")
_SIZES = {"i1": 1, "i8": 1, "i16": 2, "half": 2, "bfloat": 2, "i32": 4, "float": 4, "i64": 8, "double": 8}
_U64 = np.uint64
_INT_OPS = frozenset(("add", "sub", "mul", "and", "or", "xor", "shl", "lshr", "ashr", "sdiv", "srem", "udiv",
                      "urem"))


class UnknownInstruction(AssertionError):
    """An instruction the evaluator does not evaluate (a load from shared memory, a call)."""


@dataclass(frozen=True)
class Access:
    """One access instruction: ``addr`` and ``pred`` per thread, ``nbytes`` accessed from ``addr``."""

    store: bool
    addr: np.ndarray
    pred: np.ndarray
    nbytes: int


def _mask(bits: int) -> np.uint64:
    return _U64((1 << bits) - 1) if bits < 64 else _U64(0xFFFFFFFFFFFFFFFF)


def _signed(x: np.ndarray, bits: int) -> np.ndarray:
    v = x.astype(np.int64) if bits == 64 else (x & _mask(bits)).astype(np.int64)
    return v - ((v >> (bits - 1)) & 1) * (1 << bits) if bits < 64 else v


class _Eval:
    def __init__(self, text: str, tids: np.ndarray, ctaid: int | tuple[int, ...], params: dict[str, int]):
        self.defs = {m.group(1): m.group(2) for line in text.splitlines() if (m := _DEF.match(line))}
        self.n = len(tids)
        self.env: dict[str, np.ndarray] = {f"%p_{k}": np.full(self.n, v & 0xFFFFFFFFFFFFFFFF, _U64)
                                           for k, v in params.items()}
        self.tids = tids.astype(_U64)
        self.ctaid = (ctaid, 0, 0) if isinstance(ctaid, int) else (*ctaid, 0, 0)[:3]

    def val(self, tok: str, bits: int = 64) -> np.ndarray:
        tok = tok.strip()
        if not tok.startswith("%"):
            v = {"true": 1, "false": 0}.get(tok)
            return np.full(self.n, (int(tok) if v is None else v) & ((1 << bits) - 1), _U64)
        if tok not in self.env:
            self.env[tok] = self._define(self.defs[tok])
        return self.env[tok]

    def _define(self, rhs: str) -> np.ndarray:
        if rhs.startswith("call"):
            add = re.match(r'call i64 asm "add\.s64 \$0, \$1, \$2;", "=l,l,l"\(i64 ([^,\s]+), i64 ([^,\s)]+)\)$', rhs)
            if add:  # the 64-bit add of a generic tensor tile's addresses (backend/lower/tile_address.py)
                return (self.val(add.group(1)) + self.val(add.group(2))) & _mask(64)
            mad = re.match(r'call i64 asm "mad\.(wide\.s32|lo\.s64) \$0, \$1, (\d+), \$2;", "=l,[rl],l"'
                           r'\(i(32|64) ([^,\s]+), i64 ([^,\s)]+)\)$', rhs)
            if mad:  # a large pointer tile's address, p + off * E (backend/lower/wide_address.py)
                bits = int(mad.group(3))
                off = _signed(self.val(mad.group(4), bits) & _mask(bits), bits).astype(_U64)
                return (self.val(mad.group(5)) + off * _U64(int(mad.group(2)))) & _mask(64)
            mov = re.match(r'call i32 asm "mov\.b32 \$0, \$1;", "=r,r"\(i32 ([^,\s)]+)\)$', rhs)
            if mov:  # the opaque copy of a large tile's thread coordinate (backend/lower/codegen.py)
                return self.val(mov.group(1), 32) & _mask(32)
            if "sreg.tid.x" in rhs:
                return self.tids.copy()
            ctaid = re.search(r"sreg\.ctaid\.([xyz])\(", rhs)
            if ctaid:
                return np.full(self.n, self.ctaid["xyz".index(ctaid.group(1))], _U64)
            mm = re.match(r"call i(\d+) @llvm\.([su])(max|min)\.i\d+\((.*)\)", rhs)
            if mm:
                bits = int(mm.group(1))
                a, b = (self.val(x.split()[-1], bits) & _mask(bits) for x in mm.group(4).split(","))
                if mm.group(2) == "s":
                    a, b = _signed(a, bits), _signed(b, bits)
                pick = np.maximum if mm.group(3) == "max" else np.minimum
                return pick(a, b).astype(_U64) & _mask(bits)
            raise UnknownInstruction(f"the evaluator does not know: {rhs}")
        op, rest = rhs.split(" ", 1)
        if op == "select":
            return self._select(rest)
        rest = re.sub(r"^((nuw|nsw|exact|disjoint|inbounds|nusw) )*", "", rest)
        if op == "getelementptr":
            ety, ptr, idx = (s.strip() for s in rest.split(",", 2))
            p = self.val(ptr.split()[-1])
            i = self.val(idx.split()[-1])
            return p + i * _U64(_SIZES[ety])
        if op in ("inttoptr", "ptrtoint"):  # (addresses are 64-bit integers here)
            return self.val(rest.split(" to ")[0].split()[-1])
        if op in ("sext", "zext", "trunc"):
            src_ty, src, _to, dst_ty = rest.split()
            sb, db = int(src_ty[1:]), int(dst_ty[1:])
            x = self.val(src, sb) & _mask(sb)
            if op == "sext":
                return _signed(x, sb).astype(_U64) & _mask(db)
            return x & _mask(db)
        if op == "icmp":
            pred, ty, operands = rest.split(" ", 2)
            bits = int(ty[1:])
            a, b = (self.val(x, bits) & _mask(bits) for x in operands.split(","))
            if pred[0] == "s":
                a, b = _signed(a, bits), _signed(b, bits)
            cmp = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
                   "gt": np.greater, "ge": np.greater_equal}[pred.lstrip("su") if pred[0] in "su" else pred]
            return cmp(a, b).astype(_U64)
        ty, operands = rest.split(" ", 1)
        if op not in _INT_OPS or not re.fullmatch(r"i\d+", ty):  # (a phi, a float op)
            raise UnknownInstruction(f"the evaluator does not know: {rhs}")
        bits = int(ty[1:])
        a, b = (self.val(x, bits) & _mask(bits) for x in operands.split(","))
        if op in ("add", "sub", "mul", "and", "or", "xor", "shl", "lshr"):
            fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and,
                  "or": np.bitwise_or, "xor": np.bitwise_xor, "shl": np.left_shift, "lshr": np.right_shift}[op]
            return fn(a, b) & _mask(bits)
        if op in ("ashr", "sdiv", "srem"):
            x, y = _signed(a, bits), _signed(b, bits)
            if op == "ashr":
                return (x >> y).astype(_U64) & _mask(bits)
            y = np.where(y == 0, 1, y)
            q = np.abs(x) // np.abs(y) * np.sign(x) * np.sign(y)  # C division: towards zero
            return (q if op == "sdiv" else x - q * y).astype(_U64) & _mask(bits)
        if op in ("udiv", "urem"):
            return (a // b if op == "udiv" else a % b) & _mask(bits)
        raise UnknownInstruction(f"the evaluator does not know: {rhs}")

    def _select(self, rest: str) -> np.ndarray:
        cond, a, b = (s.strip() for s in rest.split(","))
        ty = a.split()[0]
        bits = 64 if ty.startswith("ptr") else 1 if ty == "i1" else int(ty[1:])
        pick = self.val(cond.split()[-1]) != 0
        return np.where(pick, self.val(a.split()[-1], bits), self.val(b.split()[-1], bits))


def global_accesses(llvm: str, num_threads: int, ctaid: int, params: dict[str, int]) -> list[Access]:
    """Every global access of the kernel's entry block (straight-line code) for threads
    0..num_threads-1 of program ``ctaid``; ``params``: the value of each kernel parameter (a
    pointer's address), by name."""
    ev = _Eval(llvm, np.arange(num_threads), ctaid, params)
    out = []
    for line in llvm.splitlines():
        line = line.strip()
        asm = re.search(r'asm sideeffect "([^"]*)", "[^"]*"\((.*)\)', line)
        if asm and re.search(r"\b(ld|st)\.global", asm.group(1)):
            text, args = asm.groups()
            ptr = re.search(r"ptr addrspace\(1\) (%[\w.]+)", args).group(1)
            pred = re.findall(r"i1 (%[\w.]+|true|false)", args)
            width = re.search(r"(ld|st)\.global(?:\.v(\d))?\.b(\d+)", text)
            nbytes = int(width.group(2) or 1) * int(width.group(3)) // 8
            p = ev.val(pred[-1]) != 0 if "@$" in text else np.ones(num_threads, bool)
            out.append(Access(width.group(1) == "st", ev.val(ptr), p, nbytes))
            continue
        plain = re.match(r"(?:%[\w.]+ = )?(load|store) (.*?), ptr addrspace\(1\) (%[\w.]+), align \d+$", line)
        if plain:
            kind, ty, ptr = plain.groups()
            vec = re.match(r"<(\d+) x i(\d+)>", ty)
            nbytes = int(vec.group(1)) * int(vec.group(2)) // 8 if vec else int(ty.split()[0][1:]) // 8
            out.append(Access(kind == "store", ev.val(ptr), np.ones(num_threads, bool), nbytes))
    return out


def register_values(llvm: str, refs: list[str], num_threads: int, ctaid: int | tuple[int, ...],
                    params: dict[str, int], known: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """The value of each SSA value (or constant) in ``refs`` for threads 0..num_threads-1 of program
    ``ctaid`` (its x index, or its (x, y, z) indices; straight-line code: values defined through a
    loop's ``phi`` raise :class:`UnknownInstruction` unless given in ``known``: the value of SSA
    values by name, the same for every thread), as unsigned 64-bit patterns."""
    ev = _Eval(llvm, np.arange(num_threads), ctaid, params)
    for ref, v in (known or {}).items():
        ev.env[ref] = np.full(num_threads, v & 0xFFFFFFFFFFFFFFFF, _U64)
    return {r: ev.val(r) for r in refs}


def element_addresses(accesses: list[Access], store: bool, elem_bytes: int) -> list[int]:
    """The sorted addresses of the elements the predicated-on accesses of one kind touch."""
    got = []
    for a in accesses:
        if a.store != store:
            continue
        for base in a.addr[a.pred]:
            got.extend(int(base) + j for j in range(0, a.nbytes, elem_bytes))
    return sorted(got)
