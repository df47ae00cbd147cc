"""Which host arrays of one launch share which device copy, at which offset: a pure plan
(:func:`plan_host_groups`), computed before anything is allocated or copied (staging.py carries it
out; driver/launch.py for host arrays read through TMA).

Host arrays that are C-contiguous and of the machine's byte order (``staging.device_values`` is the
array itself) are *aliasable*: their device copy holds their raw bytes, so any of them that share
memory, whatever their element types and however they overlap (transitively: ``a~b~c`` is one
group), are staged as one device buffer over the union of their byte spans, each argument at its
own byte offset into it. The GPU then sees them alias as the host memory (and the interpreter,
which uses such arrays in place) does. Where the members' spans differ, the buffer's base keeps
the union's address modulo :data:`ALIGNMENT`, so each argument's device address has its host
address's alignment (the specialization's 16-byte assumption and the tensor maps' address rules see
what they see on the host: frontend/sema/specialize.py specializes a numpy array by its address).

Other host arrays (strided, byte-swapped, a CPU bfloat16 or float8 torch tensor, which the
interpreter reads through a copy) are copied by their values: the very same view passed twice
shares one copy (:func:`same_copy`), anything else gets a copy of its own, and memory such an
array shares with another argument, one of them written, is LaunchError SP0750 (two copies would
hide the writes from each other), as is a written array whose own elements share memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...frontend.diagnostics import LaunchError
from ...frontend.interp.overlap import UNDECIDED, UNDECIDED_REASON, self_overlap
from .arrays import byte_range
from .codes import ARG_OVERLAP
from .dtypes import byte_swapped

ALIGNMENT = 256
"""The address alignment a device copy of partly overlapping host arrays keeps (``cuMemAlloc``
returns at least 256-byte aligned memory): more than any the launcher or a tensor map looks at."""


@dataclass(frozen=True)
class HostEntry:
    """One host array argument of a launch: its name, the numpy view of its memory, whether the
    kernel writes it, and whether it is aliasable (its device copy holds its own raw bytes);
    ``keep``: what keeps that memory alive until the launch has staged it (a DLPack export's capsule:
    the launcher stages from the arrays it planned with, seen in an earlier pass over the arguments,
    staging.py)."""

    name: str
    array: np.ndarray
    writes: bool
    aliasable: bool
    keep: Any = field(default=None, compare=False, repr=False)

    @property
    def span(self) -> tuple[int, int]:
        """(first byte, one past the last byte) of its memory."""
        a = self.array
        return byte_range(a.__array_interface__["data"][0], a.shape, a.strides, a.itemsize)


@dataclass(frozen=True)
class HostGroup:
    """Host arrays staged as one device copy. ``members``: indices into the planned entries, in
    order; ``offsets``: each member's byte offset into the copy's data; ``lo``/``hi``: the host
    byte span the copy holds (of the first member, for a copy by value); ``lead``: bytes before the
    data in the allocation (``lo % ALIGNMENT`` where the members' spans differ, so each device
    address keeps its host alignment, else 0); ``raw``: the copy holds the raw bytes of
    ``[lo, hi)`` (a group with an aliasable member: any other member is then the same dense view in
    the machine's byte order, a CPU bfloat16 torch tensor and a numpy view of its memory), else the
    first member's values (staging.device_values); ``written``: members the kernel writes (indices into the entries)."""

    members: tuple[int, ...]
    offsets: tuple[int, ...]
    lo: int
    hi: int
    lead: int
    raw: bool
    written: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes to allocate: the data and its lead."""
        return self.lead + self.hi - self.lo


def aliasable(array: np.ndarray, converted: bool = False) -> bool:
    """Whether a host array's device copy is its raw bytes (C-contiguous, the machine's byte order),
    so that it may share a copy with any array sharing its memory; ``converted``: the interpreter
    reads it through a copy all the same (a CPU bfloat16 or float8 torch tensor)."""
    return bool(array.flags.c_contiguous) and not byte_swapped(array.dtype) and not converted


def shares_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two host arrays share a byte (exactly, as the interpreter asks: interleaved strided
    views share none); a pair too hard to decide is taken as sharing."""
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))
    except np.exceptions.TooHardError:
        return True


def same_copy(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the device copies of two host arrays over the same bytes (staging.device_values) hold
    the same bytes: not for a view and its byte-swapped reading (``x`` and ``x.view('>f4')``), whose
    copies hold two different sets of values (the interpreter reads each by its own). Two views in
    the machine's byte order share their raw bytes, whatever their element types; byte-swapped ones
    only of one dtype (a '>f4' and a '>u2' reading convert the bytes differently)."""
    return a.dtype == b.dtype or not (byte_swapped(a.dtype) or byte_swapped(b.dtype))


def same_view(a: HostEntry, b: HostEntry) -> bool:
    """Whether two host arrays are the same view for their copies by value: the very same bytes with
    the same shape and strides (any shapes where both are dense), in the same byte order."""
    x, y = a.array, b.array
    span = a.span
    same_layout = (x.strides == y.strides and x.shape == y.shape) or (x.flags.c_contiguous and y.flags.c_contiguous)
    return span[1] > span[0] and span == b.span and same_layout and same_copy(x, y)


def check_self_overlap(name: str, host: np.ndarray) -> None:
    """SP0750 for a written host array whose own elements share memory (an ``as_strided`` view): its
    device copy has one element per index, and copying them back would keep only one of the values
    written to each shared address, silently. The interpreter refuses it in the same words."""
    if host.flags.c_contiguous:
        return
    verdict = self_overlap(host.shape, host.strides, host.itemsize)
    if verdict is not None:
        why = (f": {UNDECIDED_REASON}" if verdict == UNDECIDED else "; it is copied to the device and back, and "
               "copying it back would keep only one of the values written to each shared address")
        raise LaunchError(ARG_OVERLAP, f"elements of argument `{name}` {verdict} in memory (shape {host.shape}, "
                          f"byte strides {host.strides}), and the kernel writes through it{why}",
                          help="pass an array whose elements are distinct (e.g. `out.copy()`, or a slice of a new "
                               "array)")


def relation(a: HostEntry, b: HostEntry) -> str | None:
    """How two host arrays of one launch are staged: ``"share"`` one device copy (the same view, or
    two aliasable arrays sharing memory), None (a copy each: no memory shared, or neither written),
    or LaunchError SP0750 (memory shared, not as either of those, one of them written)."""
    (lo, hi), (a_lo, a_hi) = b.span, a.span
    if not (a_lo < hi and lo < a_hi):
        return None
    if same_view(a, b):
        return "share"
    if a.aliasable and b.aliasable:  # (dense: byte spans that meet share memory)
        return "share"
    if (a.writes or b.writes) and shares_memory(a.array, b.array):
        raise LaunchError(ARG_OVERLAP, f"host arrays `{a.name}` and `{b.name}` overlap in memory but are not "
                          f"the same array, and the kernel writes `{b.name if b.writes else a.name}`; "
                          f"{_copied_by_value(a, b)} is copied to the device by its values, on its own, so the "
                          "writes would be lost",
                          "pass the same array for both, or separate arrays (e.g. `y.copy()`); C-contiguous arrays "
                          "of the machine's byte order share one device copy however they overlap")
    return None


def _copied_by_value(a: HostEntry, b: HostEntry) -> str:
    """Which of two arrays (not both aliasable) the refusal names as copied by its values."""
    e = b if a.aliasable else a
    x = e.array
    why = ("not C-contiguous" if not x.flags.c_contiguous else "byte-swapped" if byte_swapped(x.dtype)
           else "read through a copy, as the interpreter reads it")
    return f"`{e.name}` ({why})"


def plan_host_groups(entries: Sequence[HostEntry]) -> list[HostGroup]:
    """The device copies of a launch's host arrays (every refusal first: SP0750 for a written array
    whose own elements share memory, or for memory shared as :func:`relation` refuses). Each entry
    belongs to exactly one group; a group of aliasable arrays spans the union of its members' bytes."""
    for e in entries:
        if e.writes:
            check_self_overlap(e.name, e.array)
    parent = list(range(len(entries)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for j, b in enumerate(entries):
        for i in range(j):
            if relation(entries[i], b) == "share":
                parent[root(j)] = root(i)
    members: dict[int, list[int]] = {}
    for i in range(len(entries)):
        members.setdefault(root(i), []).append(i)
    return [_group(entries, m) for m in sorted(members.values())]


def _group(entries: Sequence[HostEntry], members: list[int]) -> HostGroup:
    written = tuple(i for i in members if entries[i].writes)
    first = entries[members[0]]
    if not any(entries[i].aliasable for i in members):  # the same view (by value): a copy of the first's values
        lo, hi = first.span
        return HostGroup(tuple(members), (0,) * len(members), lo, lo + first.array.nbytes, 0, False, written)
    spans = [entries[i].span for i in members]
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    lead = lo % ALIGNMENT if len(set(spans)) > 1 else 0
    return HostGroup(tuple(members), tuple(s[0] - lo for s in spans), lo, hi, lead, True, written)


def written_spans(group: HostGroup, entries: Sequence[HostEntry]) -> list[tuple[int, int]]:
    """The host byte ranges to copy back after a launch that wrote an aliasable group: the union of
    its written members' spans (merged, ascending), never the bytes only read-only members cover
    (their memory may not be writable)."""
    spans = sorted(entries[i].span for i in group.written)
    merged: list[tuple[int, int]] = []
    for lo, hi in spans:
        if hi <= lo:
            continue
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged
