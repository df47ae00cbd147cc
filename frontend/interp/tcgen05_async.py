"""The interpreter's model of the asynchrony of ``tcgen05.mma`` and ``tcgen05.cp`` (SP0791).

The interpreter computes an MMA or a copy when it is issued, but on the GPU both run asynchronously
(PTX ISA 9.7.16.6, the memory consistency of tcgen05): their TMEM results may be read or
overwritten by other tcgen05 instructions (``tcgen05.ld`` / ``tcgen05.st``) only after a
``tcgen05.commit`` issued after them by the same thread arrived on an mbarrier, the reading thread
waited for that mbarrier phase, and then executed ``tcgen05.fence::after_thread_sync``. Likewise
the shared memory an MMA or a copy reads may be overwritten only once the writer observed that
phase. Instructions of the same issuing thread are pipelined (an MMA after a copy into its metadata,
MMAs into one accumulator) and need nothing.

So every MMA / copy leaves :class:`AsyncRecord` s (the numpy views it writes and reads, TMEM and
shared memory) in the program's :class:`Tracker` (one per CTA, one per cluster for CTA pairs,
whose MMAs write the peer's TMEM); ``tcgen05.commit`` attaches the mbarrier and its current phase
to every record of its thread (it tracks all earlier tcgen05 operations of the thread); a wait
remembers, per thread (:class:`ThreadState`, one per partition), the phases it saw complete, and
``tcgen05.fence_after`` makes them count for tcgen05 accesses. An access overlapping a record its
thread has not observed complete is an :class:`InterpreterError` SP0791 at the access.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.core import Operation
from .values import TMEM_RACE, InterpreterError, shared_condition

_CLOCK = itertools.count(1)  # orders waits after commits (across threads) for the messages

HELP_TMEM = ("commit the MMA to an mbarrier and wait on it before reading the accumulator: "
             "`tcgen05.commit(bar)`, then in the reading partition `mbarrier.wait(bar, phase)` and "
             "`tcgen05.fence_after()`")
HELP_COPY = ("commit the copy to an mbarrier and wait on it before reading its destination: "
             "`tcgen05.commit(bar)`, `mbarrier.wait(bar, phase)`, `tcgen05.fence_after()` (only a later "
             "`tcgen05.mma` of the same thread is ordered after it without them)")
HELP_SMEM = ("wait on the mbarrier the MMA (or copy) was committed to before overwriting its shared-memory "
             "operands (`tcgen05.commit(empty[s])` in the MMA partition, `mbarrier.wait(empty[s], phase)` "
             "before the store or TMA load)")


@dataclass
class ThreadState:
    """What one issuing thread (a partition, or the whole program outside ``warp_specialize``) has
    observed: per mbarrier, the number of completed phases seen by its waits (``waited``, with
    the wait op) and the part of it made visible to tcgen05 ops by ``tcgen05.fence_after``."""

    waited: dict[Any, tuple[int, Operation, int]] = field(default_factory=dict)  # + when (_CLOCK)
    fenced: dict[Any, int] = field(default_factory=dict)


@dataclass(eq=False)
class AsyncRecord:
    """A region an asynchronous tcgen05 op (``op``, issued by ``issuer``) writes or reads, and the
    mbarriers its completion was committed to: barrier -> (phase index, commit op), the earliest;
    ``committed``: when (``_CLOCK``) the last commit covering it was issued."""

    view: np.ndarray
    op: Operation
    writes: bool
    tmem: bool
    issuer: ThreadState
    commits: dict[Any, tuple[int, Operation]] = field(default_factory=dict)
    committed: int = 0


@dataclass
class Tracker:
    """The records in flight of one CTA (or of one cluster), keyed by (issuer, region, writes)."""

    records: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], bool], AsyncRecord] = field(default_factory=dict)


def thread_state(ctx: Any) -> ThreadState:
    """The :class:`ThreadState` of the running partition (its context object carries it)."""
    st = getattr(ctx, "_tcgen05_thread", None)
    if st is None:
        st = ThreadState()
        ctx._tcgen05_thread = st
    return st


def _tracker(ctx: Any) -> Tracker:
    cluster = ctx.shared.get("_cluster")
    holder = cluster[0].shared[0] if cluster is not None else ctx.shared
    return holder.setdefault("_tcgen05_async", Tracker())


def _line(op: Operation) -> str:
    return f"line {op.span.line}" if op.span is not None and op.span.line > 0 else "an earlier line"


def issue(ctx: Any, op: Operation, view: Any, writes: bool, tmem: bool) -> None:
    """Record that ``op`` (just issued by this thread) asynchronously writes / reads ``view``; it
    replaces this thread's earlier record of the same region (a commit that covers the new one
    covers the old one too)."""
    v = np.asarray(view)
    if v.size == 0:
        return
    st = thread_state(ctx)
    key = (id(st), v.__array_interface__["data"][0], v.shape, v.strides, writes)
    with shared_condition(ctx):
        _tracker(ctx).records[key] = AsyncRecord(v, op, writes, tmem, st)


def commit(ctx: Any, op: Operation, bars: list[Any]) -> None:
    """``tcgen05.commit`` to ``bars``: every tcgen05 op this thread issued so far completes with the
    phase of each barrier now in progress. Call before the arrivals (holding no lock)."""
    st = thread_state(ctx)
    with shared_condition(ctx):
        now = next(_CLOCK)
        for rec in _tracker(ctx).records.values():
            if rec.issuer is st:
                rec.committed = now
                for bar in bars:
                    rec.commits.setdefault(bar, (bar.completed, op))


def waited(ctx: Any, op: Operation, bar: Any, completed: int) -> None:
    """A wait of this thread (``op``) saw ``completed`` phases of ``bar`` complete."""
    st = thread_state(ctx)
    if completed > st.waited.get(bar, (0, op, 0))[0]:
        st.waited[bar] = (completed, op, next(_CLOCK))


def fence_after(ctx: Any) -> None:
    """``tcgen05.fence_after``: the phases this thread waited for now order its tcgen05 accesses."""
    st = thread_state(ctx)
    st.fenced.update({bar: n for bar, (n, _, _) in st.waited.items()})


def check(ctx: Any, op: Operation, view: Any, what: str, *, write: bool, tcgen05: bool, pipelined: bool) -> None:
    """SP0791 when ``op`` (``what``) accesses ``view`` (writes it when ``write``) while an
    asynchronous tcgen05 op touching it is, for this thread, possibly still in flight.
    ``tcgen05``: the access is a tcgen05 instruction (it needs the fence after the wait);
    ``pipelined``: it is an MMA or copy, ordered after the earlier ones of its own thread."""
    v = np.asarray(view)
    if v.size == 0:
        return
    st = thread_state(ctx)
    with shared_condition(ctx):
        for rec in _tracker(ctx).records.values():
            if not (rec.writes or write) or (pipelined and rec.issuer is st):
                continue
            if not np.may_share_memory(v, rec.view) or not np.shares_memory(v, rec.view):
                continue
            seen = st.fenced if tcgen05 else {b: n for b, (n, _, _) in st.waited.items()}
            if any(seen.get(bar, 0) > n for bar, (n, _) in rec.commits.items()):
                continue
            help = HELP_SMEM if not rec.tmem else HELP_TMEM if rec.op.name == "tcgen05.mma" else HELP_COPY
            raise InterpreterError(TMEM_RACE, _message(st, rec, what, write, tcgen05), op.span, ctx.program_id,
                                   help=help)


def _message(st: ThreadState, rec: AsyncRecord, what: str, write: bool, tcgen05: bool) -> str:
    """Why the access races with ``rec``: no commit, no wait for the committed phase, or no fence."""
    memory = "TMEM" if rec.tmem else "shared memory"
    verb = ("overwrites" if write else "reads") + f" {memory} that the `{rec.op.name}` at {_line(rec.op)} " \
        + ("writes" if rec.writes else "reads") + " asynchronously"
    if not rec.commits:
        return (f"`{what}` {verb}, and no `tcgen05.commit` has followed it: on the GPU it may still be in flight "
                "(a race)")
    if tcgen05:
        for bar, (n, _) in rec.commits.items():
            w = st.waited.get(bar)
            if w is not None and w[0] > n:
                return (f"`{what}` {verb}; the wait at {_line(w[1])} saw its commit's phase complete, but no "
                        "`tcgen05.fence_after()` followed that wait (a race: tcgen05.fence::after_thread_sync "
                        "orders tcgen05 accesses after a wait)")
    commits = "; ".join(f"{_line(c)} (phase {n}, parity {n & 1})" for n, c in rec.commits.values())
    others = sorted({_line(w) for bar, (_, w, t) in st.waited.items() if bar not in rec.commits and t > rec.committed})
    elsewhere = f"; its wait at {', '.join(others)} is on another mbarrier" if others else ""
    return (f"`{what}` {verb}; it was committed to an mbarrier at {commits}, but this thread has not waited for "
            f"that phase of that mbarrier to complete (a race: the wait is missing, on another mbarrier, or "
            f"for another phase{elsewhere})")
