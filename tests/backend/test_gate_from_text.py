"""The intrinsic gate's reading of immediates from the IR text (backend/toolchain/llvm_to_ptx.py,
``_immargs_in_text``): every spelling of a call site LLVM accepts is either read as the instruction
walk reads it or handed to the walk (None); none is missed. A missed TMA load with a ``cta_group``
flag on sm_90a reaches LLVM, which aborts the process on it (docs/hardware.md §0 item 2)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.backend.toolchain import llvm_to_ptx as L
from sparsile.frontend.diagnostics import CompileError
from sparsile.target.targets import get_target
from sparsile.tests.backend.test_llvm_to_ptx import _G2S_DECL, kernel

NAME = "llvm.nvvm.cp.async.bulk.tensor.g2s.tile.2d"
ARGS = ("ptr addrspace(7) %c, ptr addrspace(3) %s, ptr %p, i32 0, i32 0, i16 0, i64 0, i1 false, i1 false, "
        "i32 1")
CALL = f"call void @{NAME}({ARGS})"

# Spellings of one call site (cta_group = 1) that LLVM parses to the same instruction.
SPELLINGS = {
    "plain": CALL,
    "quoted callee": CALL.replace(f"@{NAME}", f'@"{NAME}"'),
    "escaped quoted callee": CALL.replace(f"@{NAME}", '@"llvm\\2Envvm.cp.async.bulk.tensor.g2s.tile.2d"'),
    "space before the arguments": CALL.replace(f"@{NAME}(", f"@{NAME} ("),
    "callee on the next line": CALL.replace(f"void @{NAME}", f"void\n    @{NAME}"),
    "call on the line of another instruction": f"%z = add i32 1, 2 {CALL}",
    "tail call with metadata": f"tail {CALL}, !foo !0",
    "notail call": f"notail {CALL}",
    "arguments over lines": CALL.replace("i64 0, ", "i64 0,\n      "),
    "a comment naming the callee": f"; call void @{NAME}(i1 0)\n  {CALL}",
    "a hex flag": CALL.replace("i32 1)", "i32 u0x1)"),
}


def _module(body: str) -> str:
    return kernel(_G2S_DECL, body) + "!0 = !{}\n"


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_no_spelling_of_a_call_site_is_missed(spelling: str) -> None:
    ir = _module(SPELLINGS[spelling])
    module = L.parse_module(ir)
    walked = L.nvvm_intrinsic_calls(module)
    assert walked == [L.IntrinsicCall(NAME, (0, 0, 1))]
    assert L.nvvm_intrinsic_calls(module, ir) == walked
    with pytest.raises(CompileError) as info:  # TMA's cta_group flag: not on Hopper
        L.gate_module(module, get_target("sm_90a"), ir)
    assert info.value.diagnostics[0].code == "SP0603"


def test_a_second_call_site_spelled_otherwise_is_not_missed() -> None:
    """The plain call site reads as expected; the quoted one beside it must not be dropped."""
    plain = CALL.replace("i32 1)", "i32 0)")
    ir = _module(f"{plain}\n  {SPELLINGS['quoted callee']}")
    module = L.parse_module(ir)
    assert sorted(L.nvvm_intrinsic_calls(module, ir), key=str) == sorted(L.nvvm_intrinsic_calls(module), key=str)


def test_an_aggregate_argument_does_not_shift_the_immediates() -> None:
    """Commas inside ``<...>``, ``[...]`` and ``{...}`` do not separate arguments."""
    for aggregate in ("<2 x i32> <i32 1, i32 7>", "[2 x i32] [i32 1, i32 7]", "{ i32, i32 } { i32 1, i32 7 }"):
        text = f"call void @llvm.nvvm.tcgen05.mma.x({aggregate}, i32 3, i32 5)"
        assert L._immargs_in_text(text, {"llvm.nvvm.tcgen05.mma.x": [2]}) in (
            {("llvm.nvvm.tcgen05.mma.x", (5,)): None}, None), aggregate


_WS = st.sampled_from([" ", "  ", "\n    ", " \n "])


@settings(max_examples=60, deadline=None)
@given(before=_WS, after=_WS, tail=st.sampled_from(["", "tail ", "notail ", "musttail "]),
       quoted=st.booleans(), cta_group=st.integers(0, 2), md=st.booleans())
def test_any_spacing_reads_as_the_walk_or_falls_back(before: str, after: str, tail: str, quoted: bool,
                                                     cta_group: int, md: bool) -> None:
    callee = f'@"{NAME}"' if quoted else f"@{NAME}"
    args = ARGS.replace("i32 1", f"i32 {cta_group}").replace(", ", "," + after)
    body = f"{tail}call{before}void{before}{callee}{after}({args}){', !foo !0' if md else ''}"
    if tail == "musttail ":
        body = body.replace("musttail ", "tail ")  # (musttail needs a matching return)
    ir = _module(body)
    module = L.parse_module(ir)
    assert L.nvvm_intrinsic_calls(module, ir) == L.nvvm_intrinsic_calls(module)


def test_real_kernels_are_read_from_the_text() -> None:
    """The stdlib kernels' call sites all read as expected (no walk: the reason for reading the text)."""
    from sparsile.tests.backend.test_llvm_to_ptx import _stdlib_kernel_llvm

    for case, ir in _stdlib_kernel_llvm().items():
        module = L.parse_module(ir)
        by_immargs = {fn.name: L._immarg_positions(fn) for fn in module.functions
                      if fn.is_declaration and fn.name.startswith("llvm.nvvm.") and L._needs_immargs(fn.name)}
        arity = {fn.name: len(list(fn.arguments)) for fn in module.functions if fn.name in by_immargs}
        assert by_immargs, case
        assert L._immargs_in_text(ir, by_immargs, arity) is not None, case
