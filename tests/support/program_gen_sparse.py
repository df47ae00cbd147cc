"""Random kernels on the sparse core, for the differential program fuzzer (tests/support/program_gen.py
covers the elementwise language; this module what the project exists for).

Two kinds of program, chosen by the seed:

* **sparse**: a ``BM x BN`` tile of ``C = decompress(A) @ B`` per program of a 2-D grid over ragged M,
  N and K: ``sparse_dot`` of 2:4-sparse A (values and "sm90" metadata words from the project's own
  encoder, ``sparsile.stdlib.sparsity.compress`` / ``encode_metadata``) and dense B, f16 / bf16 /
  e4m3 / e5m2 / i8 / u8 (the 8-bit kinds mixed) accumulating in f32 / i32, in a run-time ``for`` (a
  ``cdiv`` trip count or a ``range(0, K, BK)`` step) or ``while`` loop over K tiles carrying one or
  two accumulators (two: even and odd tiles, under an ``if`` in the loop). Each operand is read
  either through a pointer (masked loads with ``other=``, the metadata masked with ``rows < Mp``,
  written as an argument or as ``cdiv(M, 16) * 16``) or as a ``tensor[T, 2]`` with ``load_tile``
  (zero outside); B is stored K x N or N x K (``trans``), A's rows with a padded stride. The
  epilogue adds a bias row, applies an activation (relu, leaky relu by 1/8, a clamp; integer relu or
  shift), converts and stores with a mask or ``store_tile``.
* **tiles**: ``tensor[T, 3]`` parameters read with ``load_tile`` at boxes hanging over every edge
  (negative offsets too: zero fill), an exact elementwise expression (program_gen's AST), stored
  with ``store_tile`` (skipping outside elements) and reduced over the last axis into a
  ``tensor[T, 2]``.

The reference is independent of the compiler and of the sparsity toolkit's decoder: it decodes the
metadata words of each loaded tile from docs/sparse-metadata.md §4 (:func:`decode_sm90`), multiplies
in float64 (int64 for integers, wrapped to i32) and bounds float results by ``n * 2**-23 * sum |a||b|``
(n the K extent of the loop; fp8 MMAs keep about 14 accumulator bits on Hopper, so they get
``(n/32 + 1) * 2**-13 * sum |a||b|`` more), carried through the epilogue's rounding.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .program_gen import NP, POISON, REL, U_BOUND, Bin, Lit, MinMax, Node, OutSpec, Var, Where, convert, fmax

PAIRS = {"f16": ("f16",), "bf16": ("bf16",), "f32": ("f32",), "e4m3": ("e4m3", "e5m2"), "e5m2": ("e4m3", "e5m2"),
         "i8": ("i8", "u8"), "u8": ("i8", "u8")}
"""A's element type -> the B types a sparse_dot may pair it with (src/frontend/ops/dot.py)."""
TOOLKIT = {"f16": "f16", "bf16": "bf16", "f32": "tf32", "e4m3": "e4m3", "e5m2": "e5m2", "i8": "s8", "u8": "u8"}
VALID_WORDS = (0x44444444, 0xEEEEEEEE, 0xD98C4E94, 0x4E8DC94D)
"""Metadata words of defined nibbles only, as ``other=`` of a masked metadata load."""
UNDEFINED_NIBBLES = (0x0, 0x5, 0xA, 0xF)


def decode_sm90(values: np.ndarray, words: np.ndarray, eight_bit: bool, tf32: bool = False) -> np.ndarray:
    """The dense (m, 2 * kh) float64 / int64 tile of compressed ``values`` (m, kh) and their "sm90"
    metadata ``words`` (m, kh / 16), decoded from docs/sparse-metadata.md §4 alone: 8-bit rows are
    plain (word [r, c // 8], nibble c % 8 of chunk c); 16-bit word row ``L = 16 (r // 16) + 8 h +
    r % 8`` holds half h (chunks 4h..4h+3 of each 8) of row r in its low 16 bits and of row r + 8 in
    its high ones. Nibble bits [1:0] place the first kept value and [3:2] the second; a tf32 chunk
    (``tf32``) is two elements, one kept, the nibble 0x4 naming element 0 and 0xE element 1. A chunk with an
    undefined nibble (one index twice, the zero words outside a tensor) must have zero values; it
    contributes nothing."""
    m, kh = values.shape
    chunks = kh if tf32 else kh // 2
    r = np.arange(m)[:, None]
    c = np.arange(chunks)[None, :]
    w = np.asarray(words).astype(np.uint64)
    if eight_bit:
        nib = (w[np.broadcast_to(r, (m, chunks)), c // 8] >> (4 * (c % 8)).astype(np.uint64)) & 0xF
    else:
        half, j = (c % 8) // 4, c % 4
        row = 16 * (r // 16) + 8 * half + r % 8
        shift = 4 * j + 16 * ((r % 16) >= 8)
        nib = (w[row, np.broadcast_to(c // 8, (m, chunks))] >> shift.astype(np.uint64)) & 0xF
    nib = nib.astype(np.int64)
    v = values.astype(np.int64) if values.dtype.kind in "iu" else values.astype(np.float64)
    rr = np.broadcast_to(r, (m, chunks))
    if tf32:
        bad = ~np.isin(nib, (0x4, 0xE))
        if np.any(bad & (v != 0)):
            raise AssertionError("generator bug: an undefined tf32 metadata nibble over a nonzero value")
        dense = np.zeros((m, 2 * chunks), v.dtype)
        dense[rr, 2 * c + (nib == 0xE)] = np.where(bad, 0, v)
        return dense
    v0, v1 = v[:, 0::2], v[:, 1::2]
    bad = np.isin(nib, UNDEFINED_NIBBLES)
    if np.any(bad & ((v0 != 0) | (v1 != 0))):
        raise AssertionError("generator bug: an undefined metadata nibble over nonzero values")
    dense = np.zeros((m, 4 * chunks), v.dtype)
    i0, i1 = np.where(bad, 0, nib & 3), np.where(bad, 1, nib >> 2)
    dense[rr, 4 * c + i0] = np.where(bad, 0, v0)
    dense[rr, 4 * c + i1] = np.where(bad, 0, v1)
    return dense


def _values(rng: np.random.Generator, t: str, shape: tuple[int, ...]) -> np.ndarray:
    """Finite random values of ``t``: few-bit ones, wider ones and zeros (never all zero)."""
    if t in ("i8", "u8", "i16", "i32"):
        lo, hi = {"i8": (-128, 128), "u8": (0, 256), "i16": (-2**15, 2**15), "i32": (-2**31, 2**31)}[t]
        small = rng.integers(max(lo, -9), 10, shape)
        return np.where(rng.random(shape) < 0.6, small, rng.integers(lo, hi, shape)).astype(NP[t])
    scale = 1.0 if t in ("e4m3", "e5m2") else 2.0
    x = np.where(rng.random(shape) < 0.5, rng.integers(-12, 13, shape) / 4.0, rng.standard_normal(shape) * scale)
    x = np.where(rng.random(shape) < 0.05, 0.0, x)
    x.flat[0] = x.flat[0] or 1.0
    return convert(x, "f64", t)


def _tile(arr: np.ndarray, r0: int, c0: int, rows: int, cols: int, other: Any, rmax: int | None = None
          ) -> np.ndarray:
    """The (rows, cols) box of 2-D ``arr`` at (r0, c0), ``other`` outside it (outside rows ``rmax``
    on too when given)."""
    out = np.full((rows, cols), other, arr.dtype)
    nr = arr.shape[0] if rmax is None else min(rmax, arr.shape[0])
    r = np.arange(r0, r0 + rows)
    cc = np.arange(c0, c0 + cols)
    ok = (r[:, None] >= 0) & (r[:, None] < nr) & (cc[None, :] >= 0) & (cc[None, :] < arr.shape[1])
    rr, ci = np.nonzero(ok)
    out[rr, ci] = arr[r[rr], cc[ci]]
    return out


@dataclass
class SparseProgram:
    """A generated kernel of this module: text, launch, arguments, reference (the interface of
    program_gen's :class:`~sparsile.tests.support.program_gen.Program` that program_check uses)."""

    seed: int
    kind: str
    opts: dict[str, Any]
    grid: tuple[int, ...]
    outputs: dict[str, OutSpec]
    consts: dict[str, int] = field(default_factory=dict)
    hist_dtype: str | None = None
    atomic_bufs: dict[str, str] = field(default_factory=dict)
    expr: Node | None = None

    def variants(self) -> list[SparseProgram]:
        return [self]

    @property
    def source(self) -> str:
        return (_sparse_source if self.kind == "sparse" else _tiles_source)(self)

    def inputs(self, seed: int) -> dict[str, Any]:
        return (_sparse_inputs if self.kind == "sparse" else _tiles_inputs)(self, seed)

    def reference(self, args: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        with np.errstate(all="ignore"):
            return (_sparse_reference if self.kind == "sparse" else _tiles_reference)(self, args)


# ---------------------------------------------------------------------------------------------
# sparse_dot programs


def _gen_sparse(rnd: random.Random, seed: int) -> SparseProgram:
    at = rnd.choice(("f16", "f16", "bf16", "bf16", "f32", "e4m3", "e5m2", "i8", "u8"))
    bt = rnd.choice(PAIRS[at])
    eight = at in ("e4m3", "e5m2", "i8", "u8")
    acc = "i32" if at in ("i8", "u8") else ("f16" if at in ("f16", "e4m3", "e5m2") and rnd.random() < 0.2 else "f32")
    bm, bn = rnd.choice((16, 32, 64)), rnd.choice((8, 16, 32))
    bk = rnd.choice((32, 64, 128) if eight else (16, 32) if at == "f32" else (32, 64))
    m, n, k = rnd.randint(1, 2 * bm + 5), rnd.randint(1, 2 * bn + 3), 4 * rnd.randint(1, (2 * bk + 8) // 4)
    acc_types = {"i32": ("i32", "i32", "i16", "i8"), "f16": ("f16", "f32")}.get(
        acc, ("f32", "f32", "f16", "bf16", "e4m3"))
    o = {"at": at, "bt": bt, "eight": eight, "acc": acc, "warps": rnd.choice((1, 2, 4, 4, 8)),
         "per_word": 16 if at == "f32" else 32, "BM": bm, "BN": bn, "BK": bk, "M": m, "N": n, "K": k,
         "a_acc": rnd.choice(("ptr", "ptr", "tensor")), "e_acc": rnd.choice(("ptr", "ptr", "tensor")),
         "b_acc": rnd.choice(("ptr", "ptr", "tensor")), "c_acc": rnd.choice(("ptr", "tensor")),
         "b_trans": rnd.random() < 0.4, "loop": rnd.choice(("cdiv", "step", "while")),
         "split": rnd.random() < 0.3, "a_pad": rnd.choice((0, 0, 3)), "mp_expr": rnd.random() < 0.5,
         "b_other": rnd.choice((0, 0, 1.5, -2)) if acc != "i32" else rnd.choice((0, 3, -1)),
         "e_other": rnd.choice(VALID_WORDS if at != "f32" else (0x44444444, 0xEEEEEEEE, 0x4E4EE4E4)),
         "bias": rnd.random() < 0.6,
         "act": rnd.choice(("none", "relu", "leaky", "clamp") if acc != "i32" else ("none", "relu", "shift")),
         "out": rnd.choice(acc_types), "extra_zeros": rnd.random() < 0.5}
    a_other = rnd.choice((0, 0, 1.5, -3)) if acc != "i32" else rnd.choice((0, 2, -5))
    if at == "u8":
        a_other = abs(a_other)
    o["a_other"] = 0 if o["e_acc"] == "tensor" else a_other  # zero words (tensor fill) only over zero values
    if bt == "u8" and isinstance(o["b_other"], int):
        o["b_other"] = abs(o["b_other"])
    if o["out"] == "e4m3" and o["act"] == "none":
        o["act"] = "clamp"  # (fp8 output: a bounded range, so the rounding bound stays meaningful)
    grid = (-(-m // bm) + rnd.choice((0, 0, 1)), -(-n // bn))
    return SparseProgram(seed, "sparse", o, grid, {"C": OutSpec(o["out"], tol_of=True)},
                         consts={"BM": bm, "BN": bn, "BK": bk})


def _operand_load(name: str, acc: str, tensor_box: str, ptr_expr: str, mask: str, other: Any) -> str:
    if acc == "tensor":
        return f"{name}.load_tile({tensor_box})"
    return f"load({ptr_expr}, mask={mask}, other={other!r})"


def _sparse_source(p: SparseProgram) -> str:
    o = p.opts
    at, bt = o["at"], o["bt"]
    ann = {"A": at, "E": "u32", "Bm": bt}
    access = {"A": o["a_acc"], "E": o["e_acc"], "Bm": o["b_acc"]}
    params = [f"{x}: {'tensor[' + t + ', 2]' if access[x] == 'tensor' else 'ptr[' + t + ']'}" for x, t in ann.items()]
    params.append(f"C: {'tensor[' + o['out'] + ', 2]' if o['c_acc'] == 'tensor' else 'ptr[' + o['out'] + ']'}")
    if o["bias"]:
        params.append(f"BIAS: ptr[{o['acc']}]")
    params += ["M: i32", "N: i32", "KD: i32", "KH: i32", "KW: i32", "MP: i32", "LDA: i32",
               "BM: constexpr", "BN: constexpr", "BK: constexpr"]
    ind = "    "
    lines = [f"# program_gen_sparse seed {p.seed}", f"@kernel(num_warps={o['warps']})", f"def k({', '.join(params)}):",
             f"{ind}m0 = program_id(0) * BM", f"{ind}n0 = program_id(1) * BN",
             f"{ind}rm = m0 + arange(0, BM)", f"{ind}rn = n0 + arange(0, BN)"]
    mp = "cdiv(M, 16) * 16" if o["mp_expr"] else "MP"
    W = o["per_word"]  # K elements per metadata word, as the kernel text writes it
    zero = "0" if o["acc"] == "i32" else "0.0"
    accs = ("acc0", "acc1") if o["split"] else ("acc",)
    lines += [f"{ind}{a} = zeros((BM, BN), {o['acc']})" for a in accs]
    if o["loop"] == "cdiv":
        lines.append(f"{ind}for kt in range(0, cdiv(KD, BK)):")
    elif o["loop"] == "step":
        lines += [f"{ind}for k0 in range(0, KD, BK):"]
    else:
        lines += [f"{ind}kt = 0", f"{ind}while kt < cdiv(KD, BK):"]
    body = ind * 2
    if o["loop"] == "step":
        lines.append(f"{body}kt = k0 // BK")
    lines += [f"{body}ka = kt * (BK // 2) + arange(0, BK // 2)", f"{body}ke = kt * (BK // {W}) + arange(0, BK // {W})",
              f"{body}kb = kt * BK + arange(0, BK)"]
    a_other = o["a_other"]
    lines.append(f"{body}a = " + _operand_load(
        "A", o["a_acc"], "(m0, kt * (BK // 2)), (BM, BK // 2)", "A + rm[:, None] * LDA + ka[None, :]",
        "(rm[:, None] < M) & (ka[None, :] < KH)", a_other))
    lines.append(f"{body}e = " + _operand_load(
        "E", o["e_acc"], f"(m0, kt * (BK // {W})), (BM, BK // {W})", "E + rm[:, None] * KW + ke[None, :]",
        f"(rm[:, None] < {mp}) & (ke[None, :] < KW)", _Hex(o["e_other"])))
    if o["b_trans"]:
        b = _operand_load("Bm", o["b_acc"], "(n0, kt * BK), (BN, BK)", "Bm + rn[:, None] * KD + kb[None, :]",
                          "(rn[:, None] < N) & (kb[None, :] < KD)", o["b_other"])
        lines += [f"{body}bt = {b}", f"{body}b = trans(bt)"]
    else:
        lines.append(f"{body}b = " + _operand_load(
            "Bm", o["b_acc"], "(kt * BK, n0), (BK, BN)", "Bm + kb[:, None] * N + rn[None, :]",
            "(kb[:, None] < KD) & (rn[None, :] < N)", o["b_other"]))
    if o["split"]:
        lines += [f"{body}if kt % 2 == 0:", f"{body}    acc0 = sparse_dot(a, e, b, acc0)", f"{body}else:",
                  f"{body}    acc1 = sparse_dot(a, e, b, acc=acc1)", f"{ind}acc = acc0 + acc1"]
    else:
        lines.append(f"{body}acc = sparse_dot(a, e, b, acc)")
    if o["loop"] == "while":
        lines.insert(len(lines) - (1 if o["split"] else 0), f"{body}kt = kt + 1")
    y = "acc"
    if o["bias"]:
        lines.append(f"{ind}bias = load(BIAS + rn, mask=rn < N, other={zero})")
        lines.append(f"{ind}y = acc + bias[None, :]")
        y = "y"
    act = {"relu": f"maximum({y}, {zero})", "leaky": f"where({y} > 0.0, {y}, {y} * 0.125)",
           "clamp": f"minimum(maximum({y}, -300.0), 300.0)", "shift": f"{y} >> 3", "none": y}[o["act"]]
    lines.append(f"{ind}z = {act}")
    val = "z" if o["out"] == o["acc"] else f"z.to({o['out']})"
    if o["c_acc"] == "tensor":
        lines.append(f"{ind}C.store_tile((m0, n0), {val})")
    else:
        lines.append(f"{ind}store(C + rm[:, None] * N + rn[None, :], {val}, "
                     "mask=(rm[:, None] < M) & (rn[None, :] < N))")
    return "\n".join(lines) + "\n"


class _Hex(int):
    def __repr__(self) -> str:
        return hex(self)


def _sparse_inputs(p: SparseProgram, seed: int) -> dict[str, Any]:
    from sparsile.stdlib.sparsity import compress, encode_metadata

    o = p.opts
    rng = np.random.default_rng(seed)
    m, n, k = o["M"], o["N"], o["K"]
    dense = _values(rng, o["at"], (m, k))
    if o["extra_zeros"]:  # chunks with fewer than two nonzeros: the encoder's special cases
        dense = np.where(rng.random((m, k)) < 0.4, np.zeros((), dense.dtype), dense)
    values, indices = compress(dense, TOOLKIT[o["at"]], prune=True)
    meta = np.ascontiguousarray(np.asarray(encode_metadata(indices, "sm90", TOOLKIT[o["at"]]).data), np.uint32)
    kh = values.shape[1]
    lda = kh + o["a_pad"]
    a = np.zeros((m, lda), values.dtype)
    a[:, :kh] = values
    if o["a_pad"]:
        a[:, kh:] = _values(rng, o["at"], (m, o["a_pad"]))  # never read: masked by KH
    b = _values(rng, o["bt"], (n, k) if o["b_trans"] else (k, n))
    args: dict[str, Any] = {"A": a if o["a_acc"] == "ptr" else np.ascontiguousarray(values), "E": meta,
                            "Bm": b, "M": m, "N": n, "KD": k, "KH": kh, "KW": meta.shape[1], "MP": meta.shape[0],
                            "LDA": lda if o["a_acc"] == "ptr" else kh}
    out = np.full(m * n, POISON, np.float64)
    args["C"] = convert(out, "f64", o["out"]).reshape(m, n) if o["c_acc"] == "tensor" else convert(out, "f64", o["out"])
    if o["bias"]:
        args["BIAS"] = _values(rng, o["acc"], (n,))
    args.update(p.consts)
    return args


def _sparse_reference(p: SparseProgram, args: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    o = p.opts
    m, n, k, bm, bn, bk = o["M"], o["N"], o["K"], o["BM"], o["BN"], o["BK"]
    kh, mp = args["KH"], args["MP"]
    vals = np.asarray(args["A"])[:, :kh]
    meta, b = np.asarray(args["E"]), np.asarray(args["Bm"])
    out = np.array(args["C"], copy=True).reshape(-1)
    tol = np.zeros(m * n)
    trips = -(-k // bk)
    is_int = o["acc"] == "i32"
    for pm, pn in np.ndindex(*p.grid):
        m0, n0 = pm * bm, pn * bn
        acc = np.zeros((bm, bn), np.int64 if is_int else np.float64)
        mag = np.zeros((bm, bn))
        for kt in range(trips):
            a_other = 0 if o["a_acc"] == "tensor" else o["a_other"]
            e_other = 0 if o["e_acc"] == "tensor" else o["e_other"]
            b_other = 0 if o["b_acc"] == "tensor" else o["b_other"]
            a = _tile(vals, m0, kt * bk // 2, bm, bk // 2, convert(np.asarray(a_other), "f64" if not is_int
                                                                    else "i64", o["at"]))
            e = _tile(meta, m0, kt * bk // o["per_word"], bm, bk // o["per_word"], e_other, rmax=mp)
            bo = convert(np.asarray(b_other), "i64" if is_int else "f64", o["bt"])
            bt = (_tile(b, n0, kt * bk, bn, bk, bo).T if o["b_trans"] else _tile(b, kt * bk, n0, bk, bn, bo))
            da = decode_sm90(a, e, o["eight"], tf32=o["at"] == "f32")
            db = bt.astype(np.int64) if is_int else bt.astype(np.float64)
            acc += da @ db
            mag += np.abs(da.astype(np.float64)) @ np.abs(db.astype(np.float64))
        rows, cols = m0 + np.arange(bm), n0 + np.arange(bn)
        bias = np.zeros(bn, acc.dtype)
        if o["bias"]:
            inb = cols < n
            bias[inb] = np.asarray(args["BIAS"])[cols[inb]]
        ktot = trips * bk
        if is_int:
            y = (acc + bias[None, :] + 2**31) % 2**32 - 2**31
            y = {"relu": np.maximum(y, 0), "shift": y >> 3, "none": y}[o["act"]]
            val, err = convert(y.astype(np.int32), "i32", o["out"]), np.zeros_like(mag)
        else:
            bound = ktot * (2.0**-10 if o["acc"] == "f16" else U_BOUND) * mag
            if o["at"] == "f32":  # operands rounded to tf32 (the interpreter) or truncated (the H200)
                bound += 2.0**-9 * mag
            if o["at"] in ("e4m3", "e5m2"):
                bound += (ktot // 32 + 1) * 2.0**-13 * mag  # Hopper's fp8 accumulator: about 14 bits
            if o["split"]:  # acc0 + acc1 rounds once more
                bound += 2 * REL[o["acc"]] * (np.abs(acc) + bound)
            y = acc + bias[None, :]
            if o["bias"]:  # the add rounds to the accumulator type
                bound += 2 * REL[o["acc"]] * (np.abs(y) + bound)
            y = {"relu": np.maximum(y, 0.0), "leaky": np.where(y > 0, y, y * 0.125),
                 "clamp": np.clip(y, -300.0, 300.0), "none": y}[o["act"]]
            val = convert(y, "f64", o["out"])
            rel = REL[o["out"]]
            err = bound * (1 + rel) + 2 * rel * (np.abs(y) + bound) + 2.0**-24
        ok = (rows[:, None] < m) & (cols[None, :] < n)
        rr, cc = np.nonzero(ok)
        out[rows[rr] * n + cols[cc]] = val[rr, cc]
        tol[rows[rr] * n + cols[cc]] = err[rr, cc]
    return {"C": out}, {"C": tol}


# ---------------------------------------------------------------------------------------------
# 3-D tensor tiles


TILE_TYPES = ("i32", "i16", "u8", "f32", "f16", "bf16")


def _tile_expr(rnd: random.Random, t: str, shape: tuple[int, ...], depth: int) -> Node:
    """An exact elementwise expression of ``x`` (type ``t``) and ``y`` (converted to ``t``)."""
    if depth == 0 or rnd.random() < 0.3:
        leaf = rnd.choice(("x", "y", "lit"))
        if leaf == "x":
            return Var(t, shape, "x")
        if leaf == "y":
            return Var(t, shape, "yt")
        return Lit(t, (), rnd.choice((0.5, -2.0, 3.0)) if t[0] in "fb" else rnd.choice((1, 3, 7)))
    a, b = _tile_expr(rnd, t, shape, depth - 1), _tile_expr(rnd, t, shape, depth - 1)
    if isinstance(a, Lit):
        a, b = b, a
    if isinstance(a, Lit):
        a = Var(t, shape, "x")
    kind = rnd.choice(("bin", "minmax", "where"))
    if kind == "bin":
        ops = ("+", "-", "*") + (("&", "^") if t[0] in "iu" else ())
        return Bin(t, shape, rnd.choice(ops), a, b)
    if kind == "minmax":
        return MinMax(t, shape, rnd.random() < 0.5, a, b)
    return Where(t, shape, Bin("bool", shape, rnd.choice(("<", ">", "==")), Var(t, shape, "x"), Var(t, shape, "yt")),
                 a, b)


def _gen_tiles(rnd: random.Random, seed: int) -> SparseProgram:
    t, u = rnd.choice(TILE_TYPES), rnd.choice(TILE_TYPES)
    box = (rnd.choice((1, 2, 4)), rnd.choice((2, 8)), rnd.choice((8, 16)))
    ext = tuple(rnd.randint(1, 2 * d + 2) for d in box)
    shift = tuple(rnd.choice((0, 0, -1, -3)) for _ in box)
    dy = tuple(rnd.choice((0, 0, 1, -2)) for _ in box)
    grid = tuple(-(-(e - s) // d) + rnd.choice((0, 1)) for e, s, d in zip(ext, shift, box, strict=True))[:2]
    red = rnd.choice(("max", "min", "sum")) if t[0] in "iu" else rnd.choice(("max", "min"))
    o = {"t": t, "u": u, "box": box, "ext": ext, "shift": shift, "dy": dy, "red": red}
    expr = _tile_expr(rnd, t, box, 3)
    if isinstance(expr, Lit):  # (a tile, not a scalar)
        expr = Bin(t, box, "+", Var(t, box, "x"), expr)
    rt = ("i32" if t in ("i16", "u8") else t) if red == "sum" else t
    o["rt"] = rt
    outs = {"O": OutSpec(t), "R": OutSpec(rt)}
    return SparseProgram(seed, "tiles", o, grid, outs, consts={"BZ": box[0], "BR": box[1], "BC": box[2]}, expr=expr)


def _tiles_source(p: SparseProgram) -> str:
    o = p.opts
    t, u = o["t"], o["u"]
    sz, sr, sc = o["shift"]
    dz, dr, dc = o["dy"]
    ind = "    "
    lines = [f"# program_gen_sparse seed {p.seed}", "@kernel",
             f"def k(X: tensor[{t}, 3], Y: tensor[{u}, 3], O: tensor[{t}, 3], R: tensor[{o['rt']}, 2], "
             "BZ: constexpr, BR: constexpr, BC: constexpr):",
             f"{ind}z0 = program_id(0) * BZ + ({sz})", f"{ind}r0 = program_id(1) * BR + ({sr})", f"{ind}c0 = {sc}",
             f"{ind}x = X.load_tile((z0, r0, c0), (BZ, BR, BC))",
             f"{ind}y = load_tile(Y, (z0 + ({dz}), r0 + ({dr}), c0 + ({dc})), (BZ, BR, BC))",
             f"{ind}yt = y.to({t})", f"{ind}v = {p.expr.src()}", f"{ind}O.store_tile((z0, r0, c0), v)",
             f"{ind}s = {o['red']}(v, axis=2)" + (f".to({o['rt']})" if o["rt"] != t else ""),
             f"{ind}R.store_tile((z0, r0), s)"]
    return "\n".join(lines) + "\n"


def _tiles_inputs(p: SparseProgram, seed: int) -> dict[str, Any]:
    o = p.opts
    rng = np.random.default_rng(seed)
    ext = o["ext"]
    return {"X": _values(rng, o["t"], ext), "Y": _values(rng, o["u"], ext),
            "O": convert(np.full(ext, POISON, np.float64), "f64", o["t"]),
            "R": convert(np.full(ext[:2], POISON, np.float64), "f64", o["rt"]), **p.consts}


def _box(arr: np.ndarray, start: tuple[int, ...], box: tuple[int, ...]) -> np.ndarray:
    """The box of ``arr`` at ``start``, zero outside (load_tile)."""
    out = np.zeros(box, arr.dtype)
    idx = np.indices(box).reshape(len(box), -1).T + np.asarray(start)
    ok = np.all((idx >= 0) & (idx < np.asarray(arr.shape)), axis=1)
    out.reshape(-1)[ok] = arr[tuple(idx[ok].T)]
    return out


def _put(arr: np.ndarray, start: tuple[int, ...], tile: np.ndarray) -> None:
    """``store_tile``: the elements of ``tile`` inside ``arr``."""
    idx = np.indices(tile.shape).reshape(tile.ndim, -1).T + np.asarray(start)
    ok = np.all((idx >= 0) & (idx < np.asarray(arr.shape)), axis=1)
    arr[tuple(idx[ok].T)] = tile.reshape(-1)[ok]


def _tiles_reference(p: SparseProgram, args: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    o = p.opts
    t, box = o["t"], o["box"]
    out_o, out_r = np.array(args["O"], copy=True), np.array(args["R"], copy=True)
    for pz, pr in np.ndindex(*p.grid):
        z0, r0, c0 = pz * box[0] + o["shift"][0], pr * box[1] + o["shift"][1], o["shift"][2]
        x = _box(np.asarray(args["X"]), (z0, r0, c0), box)
        y = _box(np.asarray(args["Y"]), (z0 + o["dy"][0], r0 + o["dy"][1], c0 + o["dy"][2]), box)
        v = np.asarray(np.broadcast_to(p.expr.ev({"x": x, "yt": convert(y, o["u"], t)}), box)).astype(NP[t])
        _put(out_o, (z0, r0, c0), v)
        if o["red"] == "sum":
            s = convert(v, t, "i64").sum(axis=2)
            s = convert(s, "i64", o["rt"])
        else:
            s = v[..., 0]
            for i in range(1, box[2]):  # rule 9's maximum / minimum (max(-0.0, 0.0) is +0.0)
                s = fmax(s, v[..., i], o["red"] == "max")
            s = convert(np.asarray(s), t, o["rt"])
        _put(out_r, (z0, r0), s)
    return ({"O": out_o.reshape(-1), "R": out_r.reshape(-1)},
            {"O": np.zeros(out_o.size), "R": np.zeros(out_r.size)})


def generate_sparse(seed: int) -> SparseProgram:
    """The program of ``seed``: three in four a sparse_dot program, else a 3-D tile program."""
    rnd = random.Random(seed * 7919 + 45)
    return _gen_sparse(rnd, seed) if rnd.random() < 0.75 else _gen_tiles(rnd, seed)
