"""Block scheduling for the whole-matrix kernels.

The SWAR kernels run about fifteen numpy operations per step. Run on a whole 16384 x 16384
matrix, every temporary would be a fresh half-gigabyte allocation (page faults dominate); even
1 MB temporaries are returned to the OS and faulted in again by the allocator on every step. So
the flattened array of chunks is cut into blocks of ``BLOCK_CHUNKS`` chunks (64 KB of uint64
words, below glibc's mmap threshold, so temporaries are recycled from the heap and stay in
cache). Blocks are independent: they are spread over a small thread pool (numpy releases the GIL
inside its loops). Inside a block everything is vectorized; the loop is over blocks, never over
rows or chunks.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .errors import SP_BAD_INPUT, SparsityError
from .swar import Workspace

T = TypeVar("T")

BLOCK_CHUNKS = 65536
"""Chunks per block: 65536 uint64 words = 512 KB per temporary."""

PARALLEL_MIN_CHUNKS = 1 << 18
"""Inputs with fewer chunks run on the calling thread (pool start-up would dominate)."""


def default_workers() -> int:
    """Threads used for large inputs: the CPUs available to this process, at most 8."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        available = os.cpu_count() or 1
    return max(1, min(8, available))


def checked_workers(workers: Any) -> int | None:
    """``workers`` of :func:`for_blocks` (None, or a positive integer, numpy's included), else SP0804:
    a string failed deep inside as a TypeError, and 0 or -1 silently meant one thread."""
    if workers is None:
        return None
    if isinstance(workers, numbers.Integral) and not isinstance(workers, bool) and workers >= 1:
        return int(workers)
    raise SparsityError(SP_BAD_INPUT, f"workers must be a positive integer or None, got {workers!r}",
                        help="leave it unset for a small thread pool on large inputs, or pass 1 for the calling thread")


def chunk_blocks(count: int, block: int = BLOCK_CHUNKS) -> list[slice]:
    """Consecutive slices covering ``range(count)``, each at most ``block`` long."""
    return [slice(start, min(count, start + block)) for start in range(0, count, block)]


def _run_all(work: Callable[[slice, Workspace], T], blocks: Sequence[slice], block: int) -> list[T]:
    ws = Workspace(block)
    return [work(chunks, ws) for chunks in blocks]


def for_blocks(count: int, work: Callable[[slice, Workspace], T], workers: int | None = None,
               block: int = BLOCK_CHUNKS) -> list[T]:
    """Call ``work(chunks, workspace)`` for consecutive slices of ``range(count)``; results in order.

    ``work`` must only write its own slice; each thread has its own :class:`Workspace`.
    ``workers`` = 1 forces the calling thread; None uses :func:`default_workers` threads for
    inputs of at least ``PARALLEL_MIN_CHUNKS`` chunks. Each thread takes a contiguous run of
    blocks, so the pool sees a few tasks, not thousands.
    """
    blocks = chunk_blocks(count, block)
    if workers is None:
        workers = default_workers() if count >= PARALLEL_MIN_CHUNKS else 1
    if workers <= 1 or len(blocks) <= 1:
        return _run_all(work, blocks, block)
    tasks = min(len(blocks), 4 * workers)
    bounds = [len(blocks) * i // tasks for i in range(tasks + 1)]
    runs = [blocks[bounds[i]:bounds[i + 1]] for i in range(tasks)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = pool.map(lambda run: _run_all(work, run, block), runs)
        return [result for run_results in results for result in run_results]
