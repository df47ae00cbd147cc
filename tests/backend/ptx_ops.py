"""Test helper: the values of PTX's integer instructions, for every thread of one program at once
(numpy), as the PTX ISA defines them. The evaluators of tests/backend/ptx_eval.py (addresses) and
tests/backend/ptx_exec.py (a memory image) execute a kernel's PTX with it.

A value is a ``uint64`` array, one element per thread, holding the low bits of a register (an
instruction's result is wrapped to its width). :func:`integer_op` computes one instruction; an
instruction or form it does not know is an :class:`UnknownInstruction` (it never guesses), and a
result the PTX ISA leaves unspecified (``div`` / ``rem`` by zero, signed ``MIN / -1``) in an active
thread is an :class:`UndefinedResult`: the language's code must not let one happen
(docs/language.md rule 7: integer ``//`` and ``%`` by zero give 0, the GPU code selects it).
"""

from __future__ import annotations

import re

import numpy as np

from .address_eval import UnknownInstruction

U64 = np.uint64
INSTR = re.compile(r"^(@!?%p\d+\s+)?([a-z][\w.:]*)\s*(.*?);?$")
"""A statement: an optional guard (``@%p1``, ``@!%p1``), the opcode with its suffixes, the operands."""


class UndefinedResult(UnknownInstruction):
    """An active thread computes a result the PTX ISA leaves unspecified (division by zero)."""


class MemoryFault(AssertionError):
    """An access outside the arguments' arrays or the shared image, misaligned, of an undefined
    value, or a racing access (tests/backend/ptx_exec.py, tests/backend/ptx_shared.py)."""


def statements(ptx: str) -> list[str]:
    """The statements of the (first) ``.entry``'s body, comments removed, one per element."""
    body = ptx[ptx.index("{", ptx.index(".entry")) + 1:]
    out = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        out.extend(s.strip() for s in line.split(";") if s.strip())
    return out


def type_bits(op: str) -> int:
    """The operand width of ``op``'s type suffix (``add.s32``: 32; ``mul.wide.s32``: 32; ``.pred``: 1)."""
    m = re.search(r"\.[bsu](\d+)$|\.pred$", op)
    if m is None:
        raise UnknownInstruction(op)
    return 1 if m.group(1) is None else int(m.group(1))


def mask(bits: int) -> np.uint64:
    """The low ``bits`` bits set."""
    return U64((1 << bits) - 1) if bits < 64 else U64(0xFFFFFFFFFFFFFFFF)


def wrap(x: np.ndarray, bits: int) -> np.ndarray:
    """``x`` reduced to its low ``bits`` bits."""
    return np.asarray(x, U64) & mask(bits)


def signed(x: np.ndarray, bits: int) -> np.ndarray:
    """The low ``bits`` bits of ``x`` as a two's complement value (int64)."""
    v = wrap(x, bits).astype(np.int64)
    return v - ((v >> (bits - 1)) & 1) * (1 << bits) if bits < 64 else v


def sext(x: np.ndarray, bits: int) -> np.ndarray:
    """The low ``bits`` bits of ``x`` sign-extended to 64 bits (uint64)."""
    return signed(x, bits).astype(U64)


def _ints(x: np.ndarray, bits: int, is_signed: bool) -> list[int]:
    """The lanes' values as Python integers (exact, for the division and bit-field instructions)."""
    return [int(v) for v in (signed(x, bits) if is_signed else wrap(x, bits))]


def _from_ints(vals: list[int], bits: int) -> np.ndarray:
    return np.array([v & ((1 << bits) - 1) for v in vals], U64)


_ORDERS = {"s": ("eq", "ne", "lt", "le", "gt", "ge"), "u": ("eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs"),
           "b": ("eq", "ne")}
"""The comparisons ``setp`` has for each kind of integer type (``.u``'s ``lt`` is unsigned, as ``lo``)."""


def compare(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``setp.<cmp>.<type>``'s result (bool per thread) for integer and bit types."""
    parts = op.split(".")
    if len(parts) != 3:  # (setp.cmp.bop.type: combined with a predicate)
        raise UnknownInstruction(op)
    cmp, ty = parts[1], parts[2]
    if cmp not in _ORDERS.get(ty[:1], ()):
        raise UnknownInstruction(op)
    bits = type_bits(op)
    if ty[0] == "s":
        a, b = signed(a, bits), signed(b, bits)
    else:
        a, b = wrap(a, bits), wrap(b, bits)
    table = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
             "ne": np.not_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}
    return table[cmp](a, b)


def convert(op: str, x: np.ndarray) -> np.ndarray:
    """``cvt.<dst>.<src>`` between integer types (``.sat`` clamps to the destination's range)."""
    parts = op.split(".")
    dst, src = parts[-2], parts[-1]
    rest = parts[1:-2]
    if rest not in ([], ["sat"]) or dst[:1] not in ("s", "u") or src[:1] not in ("s", "u") \
            or not (dst[1:].isdigit() and src[1:].isdigit()):
        raise UnknownInstruction(op)
    sb, db = int(src[1:]), int(dst[1:])
    if not rest:
        return wrap(sext(x, sb) if src[0] == "s" else wrap(x, sb), db)
    lo, hi = (-(1 << (db - 1)), (1 << (db - 1)) - 1) if dst[0] == "s" else (0, (1 << db) - 1)
    return _from_ints([min(max(e, lo), hi) for e in _ints(x, sb, src[0] == "s")], db)


def _div(op: str, a: np.ndarray, b: np.ndarray, bits: int, is_signed: bool, active: np.ndarray) -> np.ndarray:
    """``div`` / ``rem``: C's truncating quotient and the remainder with the dividend's sign."""
    xs, ys = _ints(a, bits, is_signed), _ints(b, bits, is_signed)
    out = []
    for lane, (x, y) in enumerate(zip(xs, ys, strict=True)):
        bad = y == 0 or (is_signed and x == -(1 << (bits - 1)) and y == -1)
        if bad:
            if active[lane]:
                raise UndefinedResult(f"{op} of {x} by {y} in thread {lane}: the PTX ISA leaves it unspecified")
            out.append(0)
            continue
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        out.append(q if op.startswith("div") else x - q * y)
    return _from_ints(out, bits)


def _bfe(a: int, pos: int, ln: int, bits: int, is_signed: bool) -> int:
    """``bfe``: ``ln`` bits of ``a`` from ``pos`` (each the low 8 bits of its operand), sign-extended
    from the field's top bit (or the operand's, past it) for ``.s`` (PTX ISA, "bfe")."""
    pos, ln = pos & 0xFF, ln & 0xFF
    msb = bits - 1
    sbit = 0 if (not is_signed or ln == 0) else (a >> min(pos + ln - 1, msb)) & 1
    d = 0
    for i in range(bits):
        bit = (a >> (pos + i)) & 1 if (i < ln and pos + i <= msb) else sbit
        d |= bit << i
    return d


def _bfi(a: int, b: int, pos: int, ln: int, bits: int) -> int:
    """``bfi``: ``b`` with ``ln`` bits from ``pos`` replaced by the low bits of ``a`` (PTX ISA, "bfi")."""
    pos, ln = pos & 0xFF, ln & 0xFF
    d = b
    for i in range(ln):
        if pos + i >= bits:
            break
        d = (d & ~(1 << (pos + i))) | (((a >> i) & 1) << (pos + i))
    return d


def _prmt(a: int, b: int, c: int) -> int:
    """``prmt.b32`` (default mode): each result byte picked from the eight bytes of ``{b, a}`` by a
    selector nibble of ``c``, its bit 3 replicating the picked byte's sign."""
    src = (b << 32) | a
    d = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = (src >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        d |= byte << (8 * i)
    return d


def integer_op(op: str, v: list[np.ndarray], active: np.ndarray) -> np.ndarray:
    """The result of integer instruction ``op`` on the operand values ``v`` (the destination not
    included); ``active``: the threads that execute it (where an unspecified result matters)."""
    parts = op.split(".")
    base = parts[0]
    if base == "cvt":
        return convert(op, v[0])
    if base == "setp":
        return compare(op, v[0], v[1]).astype(U64)
    if base == "selp":
        return wrap(np.where(v[2] != 0, v[0], v[1]), type_bits(op))
    if base == "slct":  # slct.<dtype>.s32 d, a, b, c: a where c >= 0
        if len(parts) != 3 or parts[2] != "s32":
            raise UnknownInstruction(op)
        return wrap(np.where(signed(v[2], 32) >= 0, v[0], v[1]), type_bits(".".join(parts[:2])))
    bits = type_bits(op)
    is_signed = parts[-1][0] == "s"
    if (base == "mov" and len(parts) == 2) or base == "cvta":  # (cvta: generic and global addresses agree)
        return wrap(v[0], bits)
    if base in ("not", "neg", "abs", "popc", "clz", "brev") and len(parts) == 2:
        return _unary(base, v[0], bits, is_signed)
    if "sat" in parts or "cc" in parts:
        raise UnknownInstruction(op)
    if "wide" in parts:  # (mul|mad).wide: the full product of two `bits`-bit values, 2 * bits wide
        if len(parts) != 3 or base not in ("mul", "mad"):
            raise UnknownInstruction(op)
        ext = sext if is_signed else wrap
        prod = ext(v[0], bits) * ext(v[1], bits)
        return wrap(prod + (v[2] if base == "mad" else U64(0)), 2 * bits)
    if base in ("mul", "mad") and len(parts) == 3 and parts[1] in ("lo", "hi"):
        if parts[1] == "lo":
            return wrap(v[0] * v[1] + (v[2] if base == "mad" else U64(0)), bits)
        xs, ys = _ints(v[0], bits, is_signed), _ints(v[1], bits, is_signed)
        hi = _from_ints([(x * y) >> bits for x, y in zip(xs, ys, strict=True)], bits)
        return wrap(hi + (v[2] if base == "mad" else U64(0)), bits)
    if len(parts) != 2:
        raise UnknownInstruction(op)
    if base in ("add", "sub", "and", "or", "xor"):
        a, b = v
        out = {"add": np.add, "sub": np.subtract, "and": np.bitwise_and, "or": np.bitwise_or,
               "xor": np.bitwise_xor}[base](a, b)
        return wrap(out, bits)
    if base in ("shl", "shr"):  # the amount is a .u32; amounts past the width give the width's result
        a, b = v[0], wrap(v[1], 32)
        big = b >= U64(bits)
        sh = np.minimum(b, U64(bits - 1))
        if base == "shl":
            return np.where(big, U64(0), wrap(wrap(a, bits) << sh, bits))
        if is_signed:
            return wrap((signed(a, bits) >> sh.astype(np.int64)).astype(U64), bits)
        return np.where(big, U64(0), wrap(a, bits) >> sh)
    if base in ("min", "max"):
        a, b = (signed(v[0], bits), signed(v[1], bits)) if is_signed else (wrap(v[0], bits), wrap(v[1], bits))
        return wrap((np.minimum if base == "min" else np.maximum)(a, b).astype(U64), bits)
    if base in ("div", "rem"):
        return _div(op, v[0], v[1], bits, is_signed, active)
    if base == "bfe":
        xs = _ints(v[0], bits, False)
        return _from_ints([_bfe(x, int(p), int(n), bits, is_signed)
                           for x, p, n in zip(xs, v[1], v[2], strict=True)], bits)
    if base == "bfi":
        xs, ys = _ints(v[0], bits, False), _ints(v[1], bits, False)
        return _from_ints([_bfi(x, y, int(p), int(n), bits)
                           for x, y, p, n in zip(xs, ys, v[2], v[3], strict=True)], bits)
    if base == "prmt" and parts[1] == "b32":
        xs, ys, cs = (_ints(x, 32, False) for x in v)
        return _from_ints([_prmt(x, y, c) for x, y, c in zip(xs, ys, cs, strict=True)], 32)
    raise UnknownInstruction(op)


def _unary(base: str, x: np.ndarray, bits: int, is_signed: bool) -> np.ndarray:
    """``not``, ``neg``, ``abs`` (``|MIN|`` is ``MIN``: the result wraps), ``popc``, ``clz``, ``brev``."""
    if base == "not":
        return wrap(~np.asarray(x, U64), bits)
    if base == "neg":
        return wrap(U64(0) - np.asarray(x, U64), bits)
    if base == "abs":
        if not is_signed:
            raise UnknownInstruction(f"abs.u{bits}")
        s = signed(x, bits)
        return wrap(np.where(s < 0, U64(0) - s.astype(U64), s.astype(U64)), bits)
    xs = _ints(x, bits, False)
    if base == "popc":
        return np.array([bin(e).count("1") for e in xs], U64)
    if base == "clz":
        return np.array([bits - e.bit_length() for e in xs], U64)
    return _from_ints([int(format(e, f"0{bits}b")[::-1], 2) for e in xs], bits)
