"""The warp simulator's model of one CTA (tests/support/warp_sim.py): which thread runs, the
shuffles and barriers it waits at, and the shared-memory race check, driven by the requests of
the threads' fibers (tests/support/warp_fibers.py).

One thread runs at a time, until it finishes or must wait: at a shuffle not all lanes of its warp
have reached, or a barrier short of its count. The thread whose arrival completes a shuffle or
barrier runs on; the others become ready and run in turn. With no thread ready while some wait,
the launch deadlocked: an error, after which every waiting thread runs on with each later
barrier and shuffle returning at once (a shuffle reads 0).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from . import warp_fibers as F
from .warp_races import races


def cvt_fp8x2(name: str) -> Any:
    """``cvt.rn.f16x2.<name>x2 d, a``: the two fp8 values of ``a`` as f16 (exact), the high byte's
    in the high half (PTX ISA, "cvt"); ml_dtypes gives the values, as it does to the interpreter."""
    import sparsile as sp

    dt = getattr(sp, name).numpy_dtype

    def cvt(a: int) -> int:
        pair = np.array([a & 0xFF, a >> 8], np.uint8).view(dt).astype(np.float16).view(np.uint16)
        return int(pair[0]) | int(pair[1]) << 16

    return cvt


_CVTS = (cvt_fp8x2("e4m3"), cvt_fp8x2("e5m2"))


class CTA:
    """One launch of ``num_warps`` warps, whose shared memory starts at address ``base``, on
    ``fibers`` (one a thread)."""

    def __init__(self, num_warps: int, base: int, fibers: F.Fibers) -> None:
        n = 32 * num_warps
        self.n = n
        self.base = base
        self.fibers = fibers
        self.errors: list[str] = []
        self.broken = False
        self.ready: deque[int] = deque(range(n))
        self.waiting: dict[int, tuple[str, int | None]] = {}  # thread -> what it waits at (and barrier id)
        self.reply = [0] * n  # what each thread's pending request returns
        self.shuffles: list[dict[int, tuple[int, int]]] = [{} for _ in range(num_warps)]  # lane -> (value, mask)
        self.barriers: dict[int, tuple[int, list[int]]] = {}  # barrier id -> (count, threads arrived)
        self.epochs = fibers.epochs  # (barrier id, barriers passed) per thread, which logged accesses record
        self.log: list[np.ndarray] = []  # the shared-memory accesses, in the order they ran

    def run(self) -> None:
        """Run every thread to its end, answering its requests; then check the shared-memory
        accesses (tests/support/warp_races.py)."""
        fibers = self.fibers
        while self.ready:
            t = self.ready.popleft()
            while self._answer(t, fibers.resume(t, self.reply[t])):
                pass
            if not self.ready and self.waiting:
                waits = "; ".join(sorted({at[0] for at in self.waiting.values()}))
                self.errors.append(f"deadlock: every unfinished thread waits ({waits[:300]})")
                self.broken = True
                self.ready.extend(sorted(self.waiting))
                for w, at in self.waiting.items():
                    self.reply[w] = 0
                    if at[1] is not None:
                        self._passed(w, at[1])
                self.waiting.clear()
        self.log.append(fibers.take_log())
        self.errors += races(np.concatenate(self.log), self.base)

    def _answer(self, t: int, request: tuple[int, int, int, int]) -> bool:
        """Answer thread ``t``'s request: whether it runs on (False: it finished or waits)."""
        kind, a, b, c = request
        self.reply[t] = 0
        if kind == F.FLUSH:
            self.log.append(self.fibers.take_log())
        elif kind == F.CVT:
            self.reply[t] = _CVTS[b](a)
        elif kind == F.SHUFFLE:
            return self._shuffle(t, a, b, (c >> 32) & 0xFFFFFFFF, c & 0xFFFFFFFF)
        elif kind == F.BARRIER:
            return self._barrier(t, a, self.n if b < 0 else b)
        else:
            assert kind == F.DONE, request
            return False
        return True

    def _go(self, threads: list[int], t: int) -> None:
        """A shuffle or barrier of ``threads`` completed on the arrival of ``t``, which runs on."""
        for w in threads:
            if w != t:
                del self.waiting[w]
                self.ready.append(w)

    def _shuffle(self, t: int, value: int, lane_mask: int, mask: int, clamp: int) -> bool:
        """``shfl.sync.bfly.b32``: the warp's lanes all arrive, then each reads lane
        ``l ^ lane_mask`` (PTX ISA, "shfl.sync"; every lane of the full mask takes part)."""
        w, lane = divmod(t, 32)
        if mask != 0xFFFFFFFF or clamp != 31:
            self.errors.append(f"thread {t}: shfl.sync.bfly with mask {mask:#x} clamp {clamp} is not modelled")
        if self.broken:
            return True
        arrived = self.shuffles[w]
        arrived[lane] = (value, lane_mask)
        if len(arrived) < 32:
            self.waiting[t] = (f"warp {w}'s shuffle", None)
            return False
        self.shuffles[w] = {}
        for ln, (own, m) in arrived.items():
            self.reply[32 * w + ln] = arrived[ln ^ m][0] if ln ^ m < 32 else own
        self._go([32 * w + ln for ln in range(32)], t)
        return True

    def _barrier(self, t: int, bar: int, count: int) -> bool:
        """``bar.sync bar, count``: thread ``t`` waits until ``count`` threads have arrived at
        barrier ``bar`` (``bar.sync 0`` is the CTA's: all of them); an arrival with a different
        count than those waiting is an error."""
        if self.broken:
            self._passed(t, bar)
            return True
        had, arrived = self.barriers.setdefault(bar, (count, []))
        if had != count:
            self.errors.append(f"thread {t}: bar.sync {bar}, {count} while {len(arrived)} threads wait with "
                               f"count {had}")
            self._passed(t, bar)
            return True
        arrived.append(t)
        if len(arrived) < count:
            self.waiting[t] = (f"bar.sync {bar}, {count}", bar)
            return False
        del self.barriers[bar]
        for w in arrived:
            self._passed(w, bar)
        self._go(arrived, t)
        return True

    def _passed(self, t: int, bar: int) -> None:
        self.epochs[2 * t] = bar
        self.epochs[2 * t + 1] += 1
