"""SP0370 on the generated PTX: is any register that a ``wgmma.mma_async.sp`` in flight reads as
metadata written before the ``wgmma.wait_group`` that retires it?

The legality rule (frontend/legality/wgmma_inflight.py) decides this on the IR, where it can name
the user's line. It cannot see every register LLVM shares between values: LLVM may sink an op
that both branches of an ``if`` share behind a new phi, coalesce a value with one computed from it
unchanged, or re-materialize a constant in a loop. So every kernel whose PTX keeps a sparse group
in flight (a ``wgmma.wait_group`` with N > 0) is checked again here, after LLVM has chosen the
registers (:func:`check_ptx`, called where the PTX is made: driver/compiler.py), and a write is
SP0370 too. PTX is the contract (PTX ISA, wgmma.mma_async: a register an in-flight wgmma reads must
not be modified before the wait_group that retires it); ptxas allocates the machine registers
knowing that wgmma is asynchronous.

It runs the same abstract interpretation on the PTX's control-flow graph: each
``wgmma.mma_async.sp`` instruction joins the group of the next ``wgmma.commit_group``;
``wgmma.wait_group N`` retires the groups with N or more committed after them; the state keeps, per
sparse wgmma instruction, the fewest groups committed after it on any path (-1 while its group is
open). A statement whose destination is the metadata register of an instruction in the state is a
hazard. Inline asm statements (``{ .reg ...; a; b; }`` on one line) count one by one."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

LABEL = re.compile(r"^\s*(\$?[\w.$]+):\s*$")
REG = re.compile(r"^%[\w.]+$")
NO_DESTINATION = ("st.", "red.", "bar.", "barrier.", "bra", "call", "ret", "exit", "fence", "cp.", "prefetch",
                  "membar", "trap", "setmaxnreg", "griddepcontrol", "wgmma.fence", "wgmma.commit_group",
                  "wgmma.wait_group", "mbarrier.init", "mbarrier.expect_tx", "tensormap.", "stmatrix")
DEPTH_CAP = 7


@dataclass
class Statement:
    line: int
    text: str
    opcode: str
    args: list[str]
    guard: str = ""


@dataclass
class Block:
    label: str
    statements: list[Statement] = field(default_factory=list)
    successors: list[str] = field(default_factory=list)


def _split_operands(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _statement(line_no: int, piece: str) -> Statement | None:
    """One PTX statement (the text up to its ``;``, braces of inline asm blocks around it dropped),
    or None for a directive (``.reg`` ...) or nothing."""
    p = piece.strip()
    while p.startswith(("{", "}")) and not p.startswith("{%"):
        p = p[1:].strip()
    while p.endswith("}") and p.count("{") < p.count("}"):
        p = p[:-1].strip()
    if not p or p.startswith("."):
        return None
    guard = ""
    if p.startswith("@"):
        guard, p = p.split(None, 1)
    parts = p.split(None, 1)
    return Statement(line_no, " ".join(p.split()), parts[0], _split_operands(parts[1]) if len(parts) > 1 else [],
                     guard)


def _ends_block(st: Statement) -> bool:
    return st.opcode.startswith("bra") or st.opcode in ("ret", "exit")


def entry_blocks(ptx: str) -> list[Block]:
    """The basic blocks of the (first) ``.entry`` of ``ptx``, in text order, with their successors.
    A statement may span lines (it ends at its ``;``); the body ends at the brace that closes the
    entry's (inline asm blocks may put braces on lines of their own). Every branch, ``ret`` and
    ``exit`` ends its block: code after a guarded branch (a loop's exit, which LLVM need not label)
    is a block of its own, reached by falling through."""
    lines = ptx.splitlines()
    start = next(i for i, ln in enumerate(lines) if ".entry" in ln)
    body = next(i for i in range(start, len(lines)) if lines[i].strip() == "{")
    blocks = [Block("<entry>")]
    depth, pending = 1, ""
    for i in range(body + 1, len(lines)):
        code = lines[i].split("//", 1)[0]
        depth += code.count("{") - code.count("}")
        if depth <= 0:  # the brace that closes the entry
            break
        m = LABEL.match(code)
        if m and not pending.strip("{} \t"):
            blocks.append(Block(m.group(1)))
            pending = ""
            continue
        *done, pending = (pending + " " + code).split(";")
        for piece in done:
            st = _statement(i + 1, piece)
            if st is None:
                continue
            blocks[-1].statements.append(st)
            if _ends_block(st):
                if st.opcode.startswith("bra"):
                    blocks[-1].successors.append(st.args[0])
                blocks.append(Block(f"<after {i + 1}>"))  # a guarded branch falls through into it
    for b, nxt in itertools.pairwise(blocks):
        last = b.statements[-1] if b.statements else None
        if last is None or last.guard or not _ends_block(last):
            b.successors.append(nxt.label)  # falls through
    return blocks


def _writes(st: Statement) -> list[str]:
    if not st.args or st.opcode.startswith(NO_DESTINATION):
        return []
    first = st.args[0]
    if first.startswith("{"):
        return [r.strip() for r in first.strip("{}").split(",") if REG.match(r.strip())]
    return [r for r in first.split("|") if REG.match(r)]


def metadata_hazards(ptx: str) -> list[str]:
    """Each write of a register that a sparse wgmma instruction in flight reads as metadata, as
    ``"line L: <statement> writes %r (metadata of the wgmma at line W)"``."""
    blocks = entry_blocks(ptx)
    index = {b.label: i for i, b in enumerate(blocks)}
    meta: dict[int, str] = {}  # wgmma line -> its metadata register
    for b in blocks:
        for st in b.statements:
            if st.opcode.startswith("wgmma.mma_async.sp"):
                meta[st.line] = st.args[3] if len(st.args) > 3 else ""  # (d, a, b, sp-meta, ...)
    found: dict[tuple[int, str], str] = {}
    states: dict[int, dict[int, int]] = {0: {}}
    work = [0]
    while work:
        bi = work.pop()
        state = dict(states[bi])
        for st in blocks[bi].statements:
            for r in _writes(st):
                for w in state:
                    if meta[w] == r:
                        found.setdefault((st.line, r), f"line {st.line}: {st.text[:80]} writes {r} (metadata of "
                                                       f"the wgmma at line {w})")
            if st.opcode.startswith("wgmma.mma_async.sp"):
                state[st.line] = -1
            elif st.opcode.startswith("wgmma.commit_group"):
                state = {w: min(d + 1, DEPTH_CAP) for w, d in state.items()}
            elif st.opcode.startswith("wgmma.wait_group"):
                n = int(st.args[0])
                state = {w: d for w, d in state.items() if d < n}
        for label in blocks[bi].successors:
            si = index[label]
            old = states.get(si)
            new = dict(old or {})
            for w, d in state.items():
                new[w] = min(d, new.get(w, d))
            if new != old:
                states[si] = new
                work.append(si)
    return sorted(found.values())


def has_sparse_wgmma(ptx: str) -> bool:
    """Whether ``ptx`` has a sparse wgmma, whose group may be in flight past a write (the only PTX
    :func:`metadata_hazards` can find anything in: a wait of N > 0, or none before the write)."""
    return "wgmma.mma_async.sp" in ptx


def check_ptx(ptx: str, kernel: str, span: Any = None) -> None:
    """CompileError SP0370 when the PTX of ``kernel`` writes a register that a sparse wgmma in
    flight reads as metadata; ``span``: the user's ``hopper.wgmma_wait`` that keeps groups in
    flight (the diagnostic's place), else the kernel's."""
    if not has_sparse_wgmma(ptx):
        return
    hazards = metadata_hazards(ptx)
    if not hazards:
        return
    from ...frontend.diagnostics import CompileError, Diagnostic
    from ...frontend.legality.wgmma_inflight import HELP, NOTE, SP_SPARSE_META_IN_FLIGHT
    from ...frontend.spans import UNKNOWN_SPAN

    more = f" (and {len(hazards) - 1} more)" if len(hazards) > 1 else ""
    raise CompileError([Diagnostic(
        SP_SPARSE_META_IN_FLIGHT,
        f"the PTX generated for `{kernel}` writes a register that a sparse wgmma in flight reads as metadata, "
        f"before the wait that retires it: {hazards[0]}{more}; LLVM gave that register to another value too",
        span if span is not None else UNKNOWN_SPAN, help=HELP, notes=(NOTE,))])
