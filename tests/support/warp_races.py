"""The warp simulator's shared-memory race check (tests/support/warp_sim.py), over the log of a
launch's accesses (tests/support/warp_fibers.py) at its end, vectorized with numpy.

The accesses are taken in the order the simulator ran them, byte by byte. With the state of a byte
being its last store (epoch, thread, value) and its readers since the last load in another epoch
(epoch, threads), each access is checked as it comes:

* a load of a byte no thread stored before it;
* a load of a byte whose last store was another thread's in a conflicting epoch;
* a store to a byte that other threads read in a conflicting epoch (those readers);
* a store of a different value to a byte another thread stored in a conflicting epoch (floats'
  NaNs all count as one value: the GPU's are canonical, the host's keep payload and sign).

Epochs ``(barrier id, barriers passed)`` conflict when equal, or of different barriers (nothing
orders them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .warp_fibers import LOG_FIELDS

_F = {name: i for i, name in enumerate(LOG_FIELDS)}
_SHOWN = 8  # errors rendered in full; the rest are counted


def _canonical_nans(log: np.ndarray, data: np.ndarray) -> None:
    """Zero the stored bytes of every float store (kind 2) of a NaN, as the old per-access check did
    for scalars of 2, 4 and 8 bytes."""
    kind, size = log[:, _F["kind"]], log[:, _F["size"]]
    for nbytes, dt in ((2, np.float16), (4, np.float32), (8, np.float64)):
        rows = np.flatnonzero((kind == 2) & (size == nbytes))
        if len(rows):
            values = np.ascontiguousarray(data[rows, :nbytes]).view(dt).ravel()
            data[rows[np.isnan(values)]] = 0


def _previous(flag: np.ndarray, start: np.ndarray) -> np.ndarray:
    """For each event, the index of the latest earlier event of its byte with ``flag``, or -1."""
    idx = np.maximum.accumulate(np.where(flag, np.arange(len(flag)), -1))
    prev = np.concatenate(([-1], idx[:-1]))
    return np.where(prev >= start, prev, -1)


def _conflict(bar_a: np.ndarray, n_a: np.ndarray, bar_b: np.ndarray, n_b: np.ndarray) -> np.ndarray:
    return ((bar_a == bar_b) & (n_a == n_b)) | (bar_a != bar_b)


def races(log: np.ndarray, base: int) -> list[str]:
    """The errors of the accesses ``log`` (rows of LOG_FIELDS, in the order they ran) to the shared
    memory at address ``base``, oldest first."""
    if not len(log):
        return []
    size = log[:, _F["size"]]
    data = np.ascontiguousarray(log[:, _F["data"]:_F["data"] + 2]).view(np.uint8).reshape(len(log), 16).copy()
    _canonical_nans(log, data)
    # one event per byte accessed, in the order they ran; then grouped by byte (stable)
    rep = np.repeat(np.arange(len(log)), size)
    within = np.arange(len(rep)) - np.repeat(np.cumsum(size) - size, size)
    byte_all = log[rep, _F["ptr"]] - base + within
    order = np.argsort(byte_all, kind="stable")
    ev = rep[order]
    byte = byte_all[order]
    val = data[ev, within[order]]
    store = log[ev, _F["kind"]] != 0
    tid, bar, n = log[ev, _F["tid"]], log[ev, _F["epoch_bar"]], log[ev, _F["epoch_n"]]
    i = np.arange(len(ev))
    start = np.maximum.accumulate(np.where(np.concatenate(([True], byte[1:] != byte[:-1])), i, 0))

    w = _previous(store, start)  # the byte's last store before each event
    has_w = w >= 0
    wc = np.where(has_w, w, 0)
    against_w = has_w & _conflict(bar[wc], n[wc], bar, n) & (tid[wc] != tid)
    unwritten = ~store & ~has_w
    load_race = ~store & against_w
    store_race = store & against_w & (val[wc] != val)

    # the readers: runs of the byte's loads in one epoch; who read, up to each load of a run
    loads = np.flatnonzero(~store)
    read_race = np.zeros(len(ev), bool)
    first_reader = np.zeros(0, np.int64)
    if len(loads):
        lb, lbar, ln, lt = byte[loads], bar[loads], n[loads], tid[loads]
        new_run = np.concatenate(([True], (lb[1:] != lb[:-1]) | (lbar[1:] != lbar[:-1]) | (ln[1:] != ln[:-1])))
        run = np.cumsum(new_run)
        big = int(lt.max()) + 1
        most = np.maximum.accumulate(run * big + lt) - run * big
        least = big - 1 - (np.maximum.accumulate(run * big + (big - 1 - lt)) - run * big)
        first_reader = np.maximum.accumulate(np.where(new_run, np.arange(len(loads)), 0))
        r = _previous(~store, start)  # the byte's last load before each event
        has_r = store & (r >= 0)
        q = np.searchsorted(loads, np.where(has_r, r, loads[0]))
        others = (most[q] != tid) | (least[q] != tid)
        read_race = has_r & _conflict(lbar[q], ln[q], bar, n) & others

    events = _Events(tid, bar, n, byte, val, wc, loads, first_reader)
    failed = [(np.flatnonzero(mask), check) for check, mask in enumerate((read_race, store_race, unwritten, load_race))]
    at = np.concatenate([k for k, _ in failed])
    check = np.concatenate([np.full(len(k), c) for k, c in failed])
    first = np.lexsort((check, byte[at], ev[at]))[:_SHOWN]  # by access, then byte, then check, as they ran
    shown = [events.message(int(check[j]), int(at[j])) for j in first]
    total = len(at)
    if total > len(shown):
        shown.append(f"... and {total - len(shown)} more")
    return shown


@dataclass
class _Events:
    """A launch's byte events grouped by byte, for the messages of the errors shown."""

    tid: np.ndarray
    bar: np.ndarray
    n: np.ndarray
    byte: np.ndarray
    val: np.ndarray
    last_store: np.ndarray  # each event's byte's last store before it (where it has one)
    loads: np.ndarray  # the events that are loads
    first_reader: np.ndarray  # per load: the first load of its run (its byte, its epoch)

    def message(self, check: int, k: int) -> str:
        """The message of check ``check`` (read race, store race, unwritten, load race) failing at
        event ``k``."""
        ep = (int(self.bar[k]), int(self.n[k]))
        t, b = int(self.tid[k]), int(self.byte[k])
        w = int(self.last_store[k])
        if check == 0:
            q = int(np.searchsorted(self.loads, k)) - 1  # the byte's last load before k
            assert q >= 0 and self.byte[self.loads[q]] == b
            readers = sorted({int(x) for x in self.tid[self.loads[self.first_reader[q]:q + 1]]})
            return f"race: thread {t} writes smem byte {b} read by {readers[:4]} in epoch {ep}"
        if check == 1:
            return (f"race: threads {int(self.tid[w])} and {t} write different values to smem byte {b} in epoch "
                    f"{ep} ({int(self.val[w]):#x}, {int(self.val[k]):#x})")
        if check == 2:
            return f"thread {t} reads smem byte {b}, which no thread wrote"
        return f"race: thread {t} reads smem byte {b} written by {int(self.tid[w])} in epoch {ep}"
