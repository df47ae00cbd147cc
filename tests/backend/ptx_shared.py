"""Test helper: a program's shared memory and its synchronization for the PTX executor
(tests/backend/ptx_exec.py): the per-program shared image that ``ld.shared`` / ``st.shared`` read
and write, the barriers (``bar.sync`` / ``barrier.sync``) and ``shfl.sync``.

Shared memory is the kernel's dynamic shared memory (the ``.extern .shared`` symbol
``sparsile_smem`` at :data:`SHARED_BASE` in the shared window), one image per program, every byte
undefined until a thread stores it. The executor runs the threads at one statement together, so a
missing barrier would not change its results; the image therefore checks that the program's
accesses are ordered by barriers (PTX ISA, "Memory Consistency Model": accesses of different
threads between two barriers are unordered). Between two barriers of a program (an *epoch*):

* a thread reading a byte another thread wrote, or writing a byte another thread read, is a
  :class:`~.ptx_ops.MemoryFault` (a data race: the GPU may order them either way);
* threads writing different values to a byte is a MemoryFault (the same value is allowed);
* reading a byte no thread wrote gives an undefined register (a fault where it reaches global
  memory, an address or a guard).
"""

from __future__ import annotations

import numpy as np

from .address_eval import UnknownInstruction
from .ptx_ops import U64, MemoryFault, UndefinedResult

SHARED_BASE = 1 << 10
"""The shared-window address of ``sparsile_smem`` (1024-aligned, as declared; 0 stays invalid)."""
SEVERAL = -2
"""A byte's reader or writer when several threads accessed it in the epoch."""
WARP = 32


class SharedImage:
    """The shared memory of ``programs`` programs of ``threads`` threads each (lane ``L`` is thread
    ``L % threads`` of program ``L // threads``), ``nbytes`` each, with the epoch bookkeeping."""

    def __init__(self, programs: int, threads: int, nbytes: int) -> None:
        self.threads, self.nbytes = threads, nbytes
        shape = (programs, nbytes)
        self.data = np.zeros(shape, np.uint8)
        self.defined = np.zeros(shape, bool)
        self.epoch = np.zeros(programs, np.int64)  # barriers each program passed
        self.w_epoch, self.w_thread = np.full(shape, -1, np.int64), np.full(shape, -1, np.int64)
        self.r_epoch, self.r_thread = np.full(shape, -1, np.int64), np.full(shape, -1, np.int64)

    def _locate(self, lanes: np.ndarray, addr: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(program, thread, byte offset) of each lane's access; outside the image or misaligned is a fault."""
        if (addr % U64(nbytes)).any():
            lane = int(lanes[np.flatnonzero(addr % U64(nbytes))[0]])
            raise MemoryFault(f"a misaligned {nbytes}-byte shared access (thread {lane})")
        off = addr.astype(np.int64) - SHARED_BASE
        bad = (addr < U64(SHARED_BASE)) | (addr > U64(1 << 40)) | (off + nbytes > self.nbytes)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise MemoryFault(f"a {nbytes}-byte shared access at {int(addr[j]):#x} (thread {int(lanes[j])}) is "
                              f"outside the {self.nbytes} bytes of dynamic shared memory")
        return lanes // self.threads, lanes % self.threads, off

    def load(self, lanes: np.ndarray, addr: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
        """(value, defined) of the ``nbytes`` little-endian bytes each lane reads."""
        prog, thread, off = self._locate(lanes, addr, nbytes)
        value, defined = np.zeros(len(lanes), U64), np.ones(len(lanes), bool)
        for j in range(nbytes):
            at = (prog, off + j)
            raced = (self.w_epoch[at] == self.epoch[prog]) & (self.w_thread[at] != thread)
            if raced.any():
                k = int(np.flatnonzero(raced)[0])
                raise MemoryFault(f"thread {int(thread[k])} of program {int(prog[k])} reads shared byte "
                                  f"{int(off[k]) + j} that another thread wrote with no barrier between")
            value |= self.data[at].astype(U64) << U64(8 * j)
            defined &= self.defined[at]
            self._note(self.r_epoch, self.r_thread, prog, thread, off + j)
        return value, defined

    def store(self, lanes: np.ndarray, addr: np.ndarray, nbytes: int, value: np.ndarray,
              defined: np.ndarray) -> None:
        """Each lane writes the ``nbytes`` low bytes of its ``value`` (undefined where not ``defined``)."""
        prog, thread, off = self._locate(lanes, addr, nbytes)
        for j in range(nbytes):
            at = (prog, off + j)
            now = self.epoch[prog]
            raced = (self.r_epoch[at] == now) & (self.r_thread[at] != thread)
            if raced.any():
                k = int(np.flatnonzero(raced)[0])
                raise MemoryFault(f"thread {int(thread[k])} of program {int(prog[k])} writes shared byte "
                                  f"{int(off[k]) + j} that another thread read with no barrier between")
            byte = ((value >> U64(8 * j)) & U64(0xFF)).astype(np.uint8)
            # (two writes in one epoch by different threads: only the same defined value is order-free)
            earlier = (self.w_epoch[at] == now) & (self.w_thread[at] != thread)
            clash = earlier & ((self.data[at] != byte) | ~self.defined[at] | ~defined)
            self.data[at], self.defined[at] = byte, defined
            same = (self.data[at] == byte) & (self.defined[at] == defined)  # (lanes of this store agree)
            if clash.any() or not same.all():
                k = int(np.flatnonzero(clash | ~same)[0])
                raise MemoryFault(f"threads of program {int(prog[k])} write different values to shared byte "
                                  f"{int(off[k]) + j} with no barrier between")
            self._note(self.w_epoch, self.w_thread, prog, thread, off + j)

    def _note(self, ep: np.ndarray, who: np.ndarray, prog: np.ndarray, thread: np.ndarray, off: np.ndarray) -> None:
        """Record that ``thread`` accessed byte ``off`` of ``prog`` in the program's current epoch
        (:data:`SEVERAL` once two threads did)."""
        keys, inv = np.unique(prog * self.nbytes + off, return_inverse=True)
        lo = np.full(len(keys), np.iinfo(np.int64).max, np.int64)
        hi = np.full(len(keys), -1, np.int64)
        np.minimum.at(lo, inv, thread)
        np.maximum.at(hi, inv, thread)
        p, o = keys // self.nbytes, keys % self.nbytes
        now = self.epoch[p]
        one = lo == hi
        same_epoch = ep[p, o] == now
        keep = same_epoch & one & (who[p, o] == lo)
        who[p, o] = np.where(keep | (~same_epoch & one), lo, SEVERAL)
        ep[p, o] = now

    def release(self, prog: int) -> None:
        """Program ``prog``'s threads passed a barrier: a new epoch."""
        self.epoch[prog] += 1


def barrier_id(op: str, args: list[str], threads: int) -> int:
    """The barrier of ``bar.sync`` / ``barrier.sync`` (``.aligned`` too) for every thread of the
    program: a constant id, with no thread count or one equal to the program's threads; other forms
    (``bar.arrive``, ``bar.red``, fewer threads, a barrier id in a register) are unknown."""
    if op not in ("bar.sync", "barrier.sync", "barrier.sync.aligned") or not 1 <= len(args) <= 2 \
            or not all(a.isdigit() for a in args):
        raise UnknownInstruction(f"{op} {', '.join(args)}")
    if len(args) == 2 and int(args[1]) != threads:
        raise UnknownInstruction(f"{op} {', '.join(args)} (a barrier for {args[1]} of {threads} threads)")
    return int(args[0])


def shuffle(mode: str, a: tuple[np.ndarray, np.ndarray], b: np.ndarray, c: np.ndarray, membermask: np.ndarray,
            active: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``shfl.sync.<mode>.b32`` (PTX ISA, "shfl.sync"): (value, defined, predicate) per lane.

    ``a``: the source register (value, defined) of every lane; ``b`` the lane / offset, ``c`` the
    clamp and segment mask, ``membermask``, per lane. Every active thread must be in its mask, and
    every thread its mask names must execute this shuffle with the same mask (else the PTX ISA leaves
    it undefined: an :class:`~.ptx_ops.UndefinedResult`); a source lane outside the mask gives an
    undefined value. Lanes are grouped into warps of 32 consecutive threads (``tid``: each lane's
    thread index in its program; programs' threads are multiples of 32)."""
    n = len(active)
    lane = (tid % WARP).astype(np.int64)
    warp_start = np.arange(n, dtype=np.int64) - lane
    mm = membermask.astype(np.int64) & 0xFFFFFFFF
    for k in np.flatnonzero(active):
        if not (mm[k] >> lane[k]) & 1:
            raise UndefinedResult(f"shfl.sync in lane {int(lane[k])} whose member mask {int(mm[k]):#x} lacks it")
        members = [warp_start[k] + m for m in range(WARP) if (mm[k] >> m) & 1]
        if any(m >= n or not active[m] or mm[m] != mm[k] for m in members):
            raise UndefinedResult(f"shfl.sync with member mask {int(mm[k]):#x}: a thread it names does not "
                                  f"execute it with lane {int(lane[k])}")
    bval, cval = b.astype(np.int64) & 0x1F, c.astype(np.int64) & 0x1F
    segmask = (c.astype(np.int64) >> 8) & 0x1F
    max_lane = (lane & segmask) | (cval & ~segmask)
    min_lane = lane & segmask
    if mode == "up":
        j = lane - bval
        pval = j >= max_lane
    elif mode == "down":
        j = lane + bval
        pval = j <= max_lane
    elif mode == "bfly":
        j = lane ^ bval
        pval = j <= max_lane
    elif mode == "idx":
        j = min_lane | (bval & ~segmask)
        pval = j <= max_lane
    else:
        raise UnknownInstruction(f"shfl.sync.{mode}")
    j = np.where(pval, j, lane)
    src = warp_start + j
    src = np.where(active, src, np.arange(n))
    value = a[0][src]
    defined = a[1][src] & (((mm >> j) & 1) == 1)
    return value, defined, pval
