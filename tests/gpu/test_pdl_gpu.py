"""Programmatic dependent launch (``pdl=True``, docs/language.md "Programmatic dependent launch") on
the H200: a producer that lets its dependents start at once (``pdl.launch_dependents()``) and then
spins before it writes ``x = a * 3 + s``, and a consumer launched with ``pdl=True`` that calls
``pdl.wait()`` before it reads ``x`` and writes ``y = x + 1``. Launched back to back on one stream
many times (eager, inside a captured CUDA graph, prepared, and as a native launch record), with
``x`` and ``y`` poisoned before each pair and new ``a`` and ``s`` each time: a consumer that read
``x`` before the producer finished would see the poison or the previous pair's values.

Every test here needs the ``pdl`` builtins (``pdl.wait()``, ``pdl.launch_dependents()``): they are
marked ``NEEDS_PDL_BUILTIN`` and skip until the builtins exist. Not run yet: written without a GPU.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.sema.builtins import ROOT

torch = pytest.importorskip("torch")

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")
NEEDS_PDL_BUILTIN = pytest.mark.skipif("pdl" not in ROOT.members,
                                       reason="needs the pdl.wait() / pdl.launch_dependents() builtins")

SOURCE = """
@kernel(pdl=True)
def produce(x: ptr[i32], a: ptr[i32], n: i32, s: i32, spin: i32, zero: i32, BLOCK: constexpr = 256):
    pdl.launch_dependents()     # the next pdl=True kernel may be scheduled now; it waits for us to finish
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    pdl.wait()                  # x is poisoned by the kernel before us and read by the consumer before that
    h = offs
    for j in range(spin):       # a slow producer: h * zero is 0, but the loop cannot be removed
        h = (h * 7 + 1) % 65521
    store(x + offs, load(a + offs, mask=mask) * 3 + s + h * zero, mask=mask)


@kernel
def consume(x: ptr[i32], y: ptr[i32], n: i32, BLOCK: constexpr = 256):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    pdl.wait()                  # x is the producer's output
    store(y + offs, load(x + offs, mask=mask) + 1, mask=mask)


@kernel(pdl=True, cluster=(2, 1, 1))
def consume_cluster(x: ptr[i32], y: ptr[i32], n: i32, BLOCK: constexpr = 256):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    pdl.wait()
    store(y + offs, load(x + offs, mask=mask) + 1, mask=mask)
"""

N, BLOCK = 4000, 256
GRID = (16,)  # 4096 >= N, and a whole number of 2-CTA clusters
SPIN = 20000  # about a third of a millisecond of producer per pair
PAIRS = 40
X_POISON, Y_POISON = -7, -9


def _s(k: int) -> int:
    """The producer's scalar of pair k: never a multiple of 16 (one specialization for every k)."""
    return 1000 * k + 1


def _kernels():
    return sp.loads(SOURCE, "pdl.spk").kernels


def _reference(a: np.ndarray, s: int) -> np.ndarray:
    return a.astype(np.int64) * 3 + s + 1


def _inputs(rng: np.random.Generator, pairs: int) -> list:
    return [torch.from_numpy(rng.integers(-1000, 1000, N, dtype=np.int32)).cuda() for _ in range(pairs)]


def _check(ys: list, inputs: list) -> None:
    torch.cuda.synchronize()
    for k, (y, a) in enumerate(zip(ys, inputs)):
        got, want = y.cpu().numpy().astype(np.int64), _reference(a.cpu().numpy(), _s(k))
        assert np.array_equal(got, want), (k, int((got != want).sum()), np.unique(got[got != want])[:5])


@pytest.mark.gpu
@NEEDS_CUDA
@NEEDS_PDL_BUILTIN
@pytest.mark.parametrize("consumer", ["consume", "consume_cluster"])
def test_eager_pdl_consumer_reads_every_producer_write(consumer):
    """kernel[grid](..., pdl=True) back to back on torch's current stream (a 2-CTA cluster consumer:
    two launch attributes, the cluster's and programmatic stream serialization)."""
    ks = _kernels()
    inputs = _inputs(np.random.default_rng(1), PAIRS)
    x = torch.empty(N, dtype=torch.int32, device="cuda")
    y = torch.empty(N, dtype=torch.int32, device="cuda")
    ys = []
    for k, a in enumerate(inputs):
        x.fill_(X_POISON)
        y.fill_(Y_POISON)
        ks["produce"][GRID](x, a, N, _s(k), SPIN, 0)
        ks[consumer][GRID](x, y, N, pdl=True)
        ys.append(y.clone())
    _check(ys, inputs)


@pytest.mark.gpu
@NEEDS_CUDA
@NEEDS_PDL_BUILTIN
def test_pdl_pairs_captured_in_a_cuda_graph_replay_correctly():
    """Stream capture turns the pdl=True launches into programmatic dependency edges; each replay
    (new ``a`` copied in first) gives the new results."""
    from sparsile.tests.integrations.torch_helpers import warm_up_on_a_side_stream

    ks = _kernels()
    chains = 4
    a = [torch.empty(N, dtype=torch.int32, device="cuda") for _ in range(chains)]
    x = torch.empty(N, dtype=torch.int32, device="cuda")
    y = [torch.empty(N, dtype=torch.int32, device="cuda") for _ in range(chains)]

    def pairs():
        for k in range(chains):
            x.fill_(X_POISON)
            y[k].fill_(Y_POISON)
            ks["produce"][GRID](x, a[k], N, _s(k), SPIN, 0)
            ks["consume"][GRID](x, y[k], N, pdl=True)

    for buf in a:
        buf.fill_(1)
    warm_up_on_a_side_stream(pairs)  # compiled and launchers built before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pairs()
    rng = np.random.default_rng(2)
    for _ in range(10):
        inputs = _inputs(rng, chains)
        for buf, new in zip(a, inputs):
            buf.copy_(new)
        graph.replay()
        _check(y, inputs)


@pytest.mark.gpu
@NEEDS_CUDA
@NEEDS_PDL_BUILTIN
def test_prepared_pdl_launches_read_every_producer_write():
    """kernel[grid].prepare(..., pdl=True): the prepared launch's own cuLaunchKernelEx config."""
    ks = _kernels()
    inputs = _inputs(np.random.default_rng(3), PAIRS)
    x = torch.empty(N, dtype=torch.int32, device="cuda")
    y = torch.empty(N, dtype=torch.int32, device="cuda")
    produce = ks["produce"][GRID].prepare(x, inputs[0], N, _s(0), SPIN, 0)
    consume = ks["consume"][GRID].prepare(x, y, N, pdl=True)
    assert consume.launcher.pdl and consume._config is not None
    ys = []
    for k, a in enumerate(inputs):
        x.fill_(X_POISON)
        y.fill_(Y_POISON)
        produce(x, a, N, _s(k), SPIN, 0)
        consume(x, y, N)
        ys.append(y.clone())
    _check(ys, inputs)


@pytest.mark.gpu
@NEEDS_CUDA
@NEEDS_PDL_BUILTIN
@pytest.mark.parametrize("consumer", ["consume", "consume_cluster"])
def test_native_record_pdl_launches_read_every_producer_write(consumer):
    """The consumer's native record (driver/prepared.py ``native_record``, the launch record the
    torch layer replays): its attribute block holds programmatic stream serialization."""
    from sparsile.backend.runtime import native_launch as nl

    ks = _kernels()
    inputs = _inputs(np.random.default_rng(4), PAIRS)
    x = torch.empty(N, dtype=torch.int32, device="cuda")
    ys = [torch.empty(N, dtype=torch.int32, device="cuda") for _ in inputs]
    produce = ks["produce"][GRID].prepare(x, inputs[0], N, _s(0), SPIN, 0)
    consume = ks[consumer][GRID].prepare(x, ys[0], N, pdl=True, per_call=("x", "y"))
    record = consume.native_record((x, ys[0]), (0, 1), (True, True))
    assert record is not None
    block = record.keep[1]
    assert record.words[nl.R_ATTRS] == ctypes.addressof(block)
    assert block.count == (2 if consumer == "consume_cluster" else 1)
    launcher = nl.RecordLauncher()
    words = launcher.record(record.words)
    for k, (a, y) in enumerate(zip(inputs, ys)):
        x.fill_(X_POISON)
        y.fill_(Y_POISON)
        produce(x, a, N, _s(k), SPIN, 0)
        record.context_current()
        stream = torch.cuda.current_stream().cuda_stream
        assert launcher.launch(ctypes.addressof(words), x.data_ptr(), y.data_ptr(), 0, stream) == 0
    _check(ys, inputs)
    assert launcher.counts() == {"launched": PAIRS, "declined": 0, "launch_failures": 0}


@NEEDS_PDL_BUILTIN
def test_the_pdl_kernels_compile_to_griddepcontrol_and_carry_pdl():
    """CPU: the PTX has both instructions, and the compiled kernels say how they are launched."""
    ks = _kernels()
    x, a = np.zeros(N, np.int32), np.ones(N, np.int32)
    produce = ks["produce"][GRID].compile_for("sm_90a", x, a, N, _s(0), SPIN, 0)
    assert produce.pdl and "griddepcontrol.launch_dependents" in produce.ptx and "griddepcontrol.wait" in produce.ptx
    consume = ks["consume"][GRID].compile_for("sm_90a", x, x, N, pdl=True)
    assert consume.pdl and "griddepcontrol.wait" in consume.ptx
    assert not ks["consume"][GRID].compile_for("sm_90a", x, x, N).pdl


@NEEDS_PDL_BUILTIN
def test_the_pair_in_the_interpreter():
    """CPU: the interpreter runs the pair in order (pdl.wait() has nothing to wait for there)."""
    ks = _kernels()
    rng = np.random.default_rng(5)
    a = rng.integers(-1000, 1000, N, dtype=np.int32)
    x = np.full(N, X_POISON, np.int32)
    y = np.full(N, Y_POISON, np.int32)
    ks["produce"].interpret[GRID](x, a, N, _s(3), 3, 0)
    ks["consume"].interpret[GRID](x, y, N, pdl=True)
    assert np.array_equal(y.astype(np.int64), _reference(a, _s(3)))
