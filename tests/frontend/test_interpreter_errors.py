"""The interpreter's run-time faults are SparsileErrors (frontend/interp/values.py InterpreterError):
each has its SP078x code (docs/diagnostics.md), the unchanged message, the span of the op that
faulted, the program that faulted and, where the fix is obvious, a help line."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.codes import CODES
from sparsile.frontend.diagnostics import Diagnostic, SparsileError
from sparsile.frontend.interp import values as V
from sparsile.frontend.interp.values import InterpreterError
from sparsile.frontend.spans import UNKNOWN_SPAN


def kernel(src: str):
    return next(iter(sp.loads(src, "case.spk").kernels.values()))


def fault(src: str, grid: tuple[int, ...], *args, **kw) -> InterpreterError:
    with pytest.raises(InterpreterError) as info:
        kernel(src).interpret[grid](*args, **kw)
    return info.value


def where(e: InterpreterError) -> tuple[int, int]:
    return e.span.file_line, e.span.file_col


def test_the_class_keeps_its_bases_and_renders_the_location_and_program():
    assert issubclass(InterpreterError, SparsileError) and issubclass(InterpreterError, Exception)
    assert sp.InterpreterError is InterpreterError
    codes = [V.OUT_OF_BOUNDS, V.ASSERTION_FAILED, V.DEADLOCK, V.ANOTHER_FAILED, V.BUDGET_EXCEEDED,
             V.CLUSTER_ACCESS, V.BAD_OPERAND_DATA, V.GRID_NOT_CLUSTERS, V.UNSUPPORTED]
    assert codes == [f"SP078{i}" for i in range(9)] and all(c in CODES for c in codes)
    e = InterpreterError(V.ANOTHER_FAILED, "another partition failed")
    assert (e.code, e.message, e.span, e.program, e.help) == ("SP0783", "another partition failed", UNKNOWN_SPAN,
                                                              None, None)
    assert str(e) == "error[SP0783]: another partition failed"


def test_out_of_bounds_load():
    e = fault("@kernel\ndef k(x: ptr[f32], BLOCK: constexpr):\n    v = load(x + arange(0, BLOCK))\n",
              (1,), np.ones(10, np.float32), BLOCK=16)
    assert e.code == "SP0780"
    assert e.message == "out-of-bounds load of `x`: element offset 10 at tile index (10,) is outside [0, 10)"
    assert where(e) == (3, 9) and e.program == (0, 0, 0)
    assert e.help == "mask the lanes outside `x` (`mask=offs < n`)"
    assert str(e) == (f"error[SP0780]: case.spk:3:9: {e.message} (program (0, 0, 0))\n"
                      " = help: mask the lanes outside `x` (`mask=offs < n`)")
    d = e.to_diagnostic()
    assert d == Diagnostic("SP0780", e.message, e.span, help=e.help, notes=("in program (0, 0, 0)",))


def test_shared_buffer_index_out_of_range():
    e = fault("@kernel\ndef k(out: ptr[f32], i: i32):\n    s = smem.alloc(f32, (2, 16))\n"
              "    store(out + arange(0, 16), s[i].load())\n", (1,), np.zeros(16, np.float32), 2)
    assert (e.code, e.message, where(e)) == ("SP0780", "shared buffer index 2 is out of range [0, 2)", (4, 32))


def test_failed_assertion():
    e = fault('@kernel\ndef k(n: i32):\n    assert n > 3, "n is too small"\n', (2,), 2)
    assert (e.code, e.message, where(e), e.program) == ("SP0781", "device assertion failed: n is too small",
                                                        (3, 5), (0, 0, 0))


def test_deadlock():
    src = ("@kernel(num_warps=4)\ndef k(out: ptr[i32]):\n    bars = mbarrier.alloc(1, 2)\n"
           "    mbarrier.arrive(bars[0])\n    mbarrier.wait(bars[0], 0)\n    store(out, 1)\n")
    e = fault(src, (1,), np.zeros(1, np.int32))
    assert e.code == "SP0782" and where(e) == (5, 5)
    assert e.message.startswith("deadlock: every partition waits on an mbarrier that no one will arrive on "
                                "(line 5 (parity 0))")


def test_a_failing_partition_is_reported_not_the_partner_it_stopped():
    """The waiting partition stops with SP0783; the run reports the partition that failed."""
    src = """
def bad(x):
    v = load(x + arange(0, 64))


def waits(bars):
    mbarrier.wait(bars[0], 0)


@kernel(num_warps=2)
def k(x: ptr[f32]):
    bars = mbarrier.alloc(1, 1)
    warp_specialize(partition(waits, bars, warps=1), partition(bad, x, warps=1))
"""
    e = fault(src, (1,), np.zeros(8, np.float32))
    assert e.code == "SP0780" and e.message.startswith("out-of-bounds load of `x`") and where(e) == (3, 9)


def test_operation_budget():
    e = fault("@kernel\ndef k(n: i32):\n    i = 0\n    while i < n:\n        i += 0\n", (1,), 1, max_ops=500)
    assert (e.code, e.message) == ("SP0784", "the run exceeded its budget of 500 operations")
    assert e.help is not None and "max_ops" in e.help and e.span.line > 0


def test_remote_access_before_cluster_sync():
    """Only CTA 0 reaches into CTA 1 (which waits in cluster.sync and stops with SP0783)."""
    src = """
@kernel(num_warps=4, cluster=(2, 1, 1))
def k(X: tensor[f16, 2]):
    s = smem.alloc(f16, (32, 64), swizzle=128)
    bars = mbarrier.alloc(1)
    if cluster.rank() == 0:
        tma.load(X, (0, 0), s, bars[0], multicast=2)
    cluster.sync()
"""
    e = fault(src, (2,), np.ones((64, 64), np.float16))
    assert e.code == "SP0785" and where(e) == (7, 9) and e.program == (0, 0, 0)
    assert e.message == ("tma.load multicast: CTA 0 accesses the shared memory of CTA 1 before any cluster.sync(): "
                         "its buffers and mbarriers may not be initialized yet")
    assert e.help and "cluster.sync()" in e.help


def test_invalid_sparse_metadata_keeps_the_toolkit_help():
    src = """
@kernel(num_warps=4)
def k(A: ptr[f16], E: ptr[u32], B: ptr[f16], C: ptr[f32]):
    r = arange(0, 64)
    a = load(A + r[:, None] * 32 + arange(0, 32)[None, :])
    e = load(E + r[:, None] * 2 + arange(0, 2)[None, :])
    b = load(B + arange(0, 64)[:, None] * 64 + r[None, :])
    store(C + r[:, None] * 64 + r[None, :], sparse_dot(a, e, b))
"""
    e = fault(src, (1,), np.ones(2048, np.float16), np.full(128, 0xFFFFFFFF, np.uint32), np.ones(4096, np.float16),
              np.zeros(4096, np.float32))
    assert e.code == "SP0786" and where(e) == (8, 45)
    assert e.message.startswith("invalid sparse metadata: undefined metadata nibble 0xF at row 0")
    assert "error[SP08" not in e.message and e.help and "encode_metadata()" in e.help


def test_grid_not_a_whole_number_of_clusters():
    src = "@kernel(cluster=(2, 1, 1))\ndef k(Out: ptr[i32]):\n    store(Out + program_id(0), cluster.rank())\n"
    e = fault(src, (3,), np.zeros(4, np.int32))
    assert (e.code, e.message) == ("SP0787", "the grid (3, 1, 1) is not a multiple of the cluster (2, 1, 1) in "
                                             "every dimension")
    assert e.span.line > 0 and e.program is None and e.help


def test_where_between_pointers_into_different_arguments():
    src = "@kernel\ndef k(x: ptr[f32], y: ptr[f32], n: i32):\n    p = where(n > 0, x, y)\n    store(p, 1.0)\n"
    e = fault(src, (1,), np.zeros(4, np.float32), np.zeros(4, np.float32), 1)
    assert (e.code, e.message, where(e)) == ("SP0788", "`where` between pointers into different arguments", (3, 9))
    assert e.help == "select offsets and add them to one pointer: `p + where(c, i, j)`"


# ------------------------------------------------------------------------------------------------
# a tensor no TMA map can describe: SP0714 in the interpreter, as at a GPU launch

_TMA_COPY = """
@kernel(num_warps=4)
def k(X: tensor[f16, 2], Out: ptr[f16], n: i32):
    s = smem.alloc(f16, (32, 64), swizzle=128)
    bars = mbarrier.alloc(1)
    mbarrier.expect(bars[0], 32 * 64 * 2)
    tma.load(X, (0, 0), s, bars[0])
    mbarrier.wait(bars[0], 0)
    store(Out + arange(0, 32)[:, None] * 64 + arange(0, 64)[None, :], s.load())

@kernel(num_warps=4)
def plain(X: tensor[f16, 2], Out: ptr[f16], n: i32):
    offs = arange(0, 32)[:, None] * 64 + arange(0, 64)[None, :]
    store(Out + offs, X.load_tile((0, 0), (32, 64)))
"""


def test_a_tma_copy_of_rows_not_a_multiple_of_16_bytes_is_sp0714():
    """Located at the TMA copy (line 7), with the rule a GPU launch reports for the same array; a
    tensor read without TMA (``plain``) takes any row length."""
    import sparsile as sp
    from sparsile.frontend.interp.values import InterpreterError

    mod = sp.loads(_TMA_COPY, "tma_rows.spk")
    x = np.arange(32 * 68, dtype=np.float16).reshape(32, 68)  # 136-byte rows: no tensor map fits them
    with pytest.raises(InterpreterError) as e:
        mod.k.interpret[(1,)](x, np.zeros(32 * 64, np.float16), 68)
    assert e.value.code == "SP0714" and e.value.span.line == 7
    assert e.value.message == ("the tensor map of argument `X` is invalid: global stride of dimension 0 = 136 "
                               "bytes is not a multiple of 16 below 2^40")
    assert "pad the last dimension" in e.value.help
    out = np.zeros(32 * 64, np.float16)
    mod.plain.interpret[(1,)](x, out, 68)
    assert np.array_equal(out.reshape(32, 64), x[:, :64])
    ok = np.arange(32 * 72, dtype=np.float16).reshape(32, 72)  # 144-byte rows
    mod.k.interpret[(1,)](ok, out, 72)
    assert np.array_equal(out.reshape(32, 64), ok[:, :64])


def test_a_strided_view_is_checked_with_its_own_strides():
    """A column slice of a wider array keeps the wider rows (a GPU launch maps the view itself): no
    SP0714 for a 1001-column view of 1024-column rows, though a dense copy would have 2002-byte rows."""
    import sparsile as sp

    mod = sp.loads(_TMA_COPY, "tma_rows.spk")
    wide = np.arange(32 * 1024, dtype=np.float16).reshape(32, 1024)
    view = wide[:, :1001]
    out = np.zeros(32 * 64, np.float16)
    mod.k.interpret[(1,)](view, out, 1001)
    assert np.array_equal(out.reshape(32, 64), view[:, :64])
