"""Bugs the mutation fuzzer found (tests/fuzz/, scripts/fuzz.py), one test each."""

from __future__ import annotations

import pytest

import sparsile
from sparsile.frontend.diagnostics import CompileError, coded_error_diagnostic
from sparsile.frontend.layout.layouts import LayoutError
from sparsile.frontend.spans import SourceFile, Span
from sparsile.stdlib.sparsity.errors import SparsityError

TWO_WARP_SPECIALIZE = """\
def work(bar):
    mbarrier.arrive(bar[0], per="partition")


@kernel(num_warps=8)
def k(C: ptr[f32]):
    bar = mbarrier.alloc(1, 2)
    warp_specialize(partition(work, bar, warps=4), partition(work, bar, warps=4))
    bar2 = mbarrier.alloc(1, 2)
    warp_specialize(partition(work, bar2, warps=4), partition(work, bar2, warps=4))
"""


def test_two_warp_specialize_ops_in_one_kernel_compile() -> None:
    # the partition-local thread index and leader predicate were cached per partition index, so the
    # second op's partition 0 reused values defined in the first one's (LLVM: "does not dominate")
    k = sparsile.loads(TWO_WARP_SPECIALIZE, "ws.spk").kernels["k"]
    ptx = k.compile("C=ptr[f32]", target="sm_90a", stop_after="ptx").ptx
    assert ptx.count("mbarrier.arrive") == 4


def test_a_static_range_past_2_63_iterations_is_the_unroll_limit_diagnostic() -> None:
    src = "@kernel\ndef k(x: ptr[f32]):\n    for i in static_range(2**70):\n        pass\n"
    k = sparsile.loads(src, "r.spk").kernels["k"]
    with pytest.raises(CompileError) as e:
        k.compile("x=ptr[f32]", target="sm_90a", stop_after="ir")
    (d,) = e.value.diagnostics
    assert d.code == "SP0222" and d.message.startswith(f"`static_range` would unroll {2**70} iterations")
    assert (d.span.line, d.span.col) == (3, 14)


@pytest.mark.parametrize("error", [LayoutError("SP0401", "bad layout", "fix it"),
                                   SparsityError("SP0818", "bad word", "fix it")])
def test_coded_errors_below_an_op_become_diagnostics_at_the_op(error: Exception) -> None:
    span = Span(SourceFile("f.spk", "x = 1\n"), 1, 1, 1, 6)
    d = coded_error_diagnostic(error, span)
    assert d is not None and (d.code, d.message, d.help, d.span) == (error.code, error.message, "fix it", span)
    assert coded_error_diagnostic(ValueError("plain"), span) is None


def test_a_legality_rule_raising_a_layout_error_reports_it_at_the_op() -> None:
    from sparsile.frontend.legality.core import _run

    class Op:
        span = Span(SourceFile("f.spk", "x = 1\n"), 1, 1, 1, 6)

    def rule(op: object, ctx: object) -> list:
        raise LayoutError("SP0409", "no conversion plan")

    (d,) = _run(rule, Op(), None)  # type: ignore[arg-type]
    assert (d.code, d.message, d.span) == ("SP0409", "no conversion plan", Op.span)


def test_a_loop_carried_barrier_replaced_by_a_number_is_a_diagnostic() -> None:
    src = ("@kernel\ndef k(x: ptr[f32]):\n    bar = mbarrier.alloc(4)\n    for i in range(0, 4):\n"
           "        bar = i\n")
    k = sparsile.loads(src, "m.spk").kernels["k"]
    with pytest.raises(CompileError) as e:
        k.compile("x=ptr[f32]", target="sm_90a", stop_after="ir")
    (d,) = e.value.diagnostics
    assert (d.code, d.message) == ("SP0226", "`bar` enters the loop as mbarrier[4] and leaves an iteration as i32")
    assert (d.span.line, d.span.col) == (4, 5) and d.help == "give it its final type and shape before the loop"


def test_a_tensor_descriptor_as_a_shared_memory_index_is_sp0343() -> None:
    src = ("@kernel\ndef k(A: tensor[f16, 2]):\n    b = smem.alloc(f16, (4, 64))\n    v = b[A]\n")
    k = sparsile.loads(src, "m.spk").kernels["k"]
    with pytest.raises(CompileError) as e:
        k.compile("A=tensor[f16, 2]", target="sm_90a", stop_after="ir")
    (d,) = e.value.diagnostics
    assert (d.code, d.message) == ("SP0343", "an index must be an integer scalar, found tensor[f16, 2]")
    assert (d.span.line, d.span.col) == (4, 11)


def test_the_element_type_of_a_descriptor_is_the_sp0252_safety_net() -> None:
    from sparsile.frontend.diagnostics import not_a_value
    from sparsile.frontend.ir import types as T

    t = T.TensorType(T.f16, 2)
    with pytest.raises(T.NotAValueTypeError) as e:
        T.element_type(t)
    span = Span(SourceFile("f.spk", "x = 1\n"), 1, 1, 1, 6)
    d = not_a_value(e.value, "`exp`", span)
    assert (d.code, d.message, d.span) == ("SP0252", "`exp` needs numbers, pointers or tiles, found tensor[f16, 2]",
                                           span)
