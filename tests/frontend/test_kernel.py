"""Kernel objects (driver/kernel.py): the checks on kernel options, interpreter grids and the
interpreter's ``max_ops`` bound, so that bad values get a diagnostic instead of a Python error
from the interpreter or an LLVM attribute that makes LLVM exit the process."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.driver.kernel import GRID_LIMITS, check_options, normalize_grid
from sparsile.frontend.diagnostics import CompileError, LaunchError

SOURCE = """
@kernel
def add_one(x: ptr[f32], n: i32, BLOCK: constexpr = 16):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(x + offs, load(x + offs, mask=offs < n) + 1.0, mask=offs < n)
"""
SIGNATURE = "x=ptr[f32], n=i32"


def kernel(**options: object) -> sp.Kernel:
    k = sp.loads(SOURCE, "case.spk").kernels["add_one"]
    k.options.update(options)
    return k


@pytest.mark.parametrize(("option", "value", "message"), [
    ("num_warps", 0, "num_warps must be a positive integer, found 0"),
    ("num_warps", -4, "num_warps must be a positive integer, found -4"),
    ("num_warps", "many", "num_warps must be a positive integer, found 'many'"),
    ("num_warps", 4.0, "num_warps must be a positive integer, found 4.0"),
    ("num_warps", True, "num_warps must be a positive integer, found True"),
    ("num_stages", -1, "num_stages must be a non-negative integer, found -1"),
    ("num_ctas", 0, "num_ctas must be a positive integer, found 0"),
    ("maxnreg", "x", "maxnreg must be an integer from 24 to 255 registers per thread, found 'x'"),
    ("maxnreg", 32.5, "maxnreg must be an integer from 24 to 255 registers per thread, found 32.5"),
    ("maxnreg", 0, "maxnreg must be an integer from 24 to 255 registers per thread, found 0"),
    ("maxnreg", 256, "maxnreg must be an integer from 24 to 255 registers per thread, found 256"),
    ("target", 90, "target must be a target name such as \"sm_90a\", found 90"),
    ("pdl", 1, "pdl must be True or False, found 1"),
    ("pdl", "yes", "pdl must be True or False, found 'yes'"),
    ("pdl", None, "pdl must be True or False, found None"),
])
def test_bad_option_values_are_sp0242(option: str, value: object, message: str) -> None:
    with pytest.raises(CompileError) as info:
        check_options({option: value})
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("SP0242", message)
    assert d.help


@pytest.mark.parametrize("options", [
    {"num_warps": 1}, {"num_warps": 6}, {"num_warps": np.int64(8)}, {"num_stages": 0}, {"maxnreg": None},
    {"maxnreg": 24}, {"maxnreg": 255}, {"target": "sm_100a"}, {"num_ctas": 1}, {"cluster": (2, 1, 1)},
    {"pdl": True}, {"pdl": False},
])
def test_good_option_values_pass(options: dict) -> None:
    check_options(options)


def test_unknown_option_name_is_sp0236() -> None:
    with pytest.raises(CompileError) as info:
        check_options({"num_warpz": 4})
    assert [(d.code, d.message) for d in info.value.diagnostics] == [("SP0236", "unknown kernel option `num_warpz`")]


def test_compile_refuses_bad_options_before_llvm() -> None:
    # num_warps=-4 used to reach LLVM as nvvm.reqntid="-128" and LLVM exited the process; a float
    # maxnreg did the same through nvvm.maxnreg
    for options in ({"num_warps": -4}, {"maxnreg": 32.5}, {"num_warps": "many"}):
        with pytest.raises(CompileError) as info:
            kernel().compile(SIGNATURE, target="sm_90a", stop_after="llvm", **options)
        assert info.value.codes == ["SP0242"]


def test_compile_refuses_unknown_option_keywords() -> None:
    with pytest.raises(CompileError) as info:
        kernel().compile(SIGNATURE, target="sm_90a", stop_after="llvm", num_warpz=8)
    assert info.value.codes == ["SP0236"]


def test_options_set_on_the_kernel_are_checked_at_launch() -> None:
    x = np.zeros(16, np.float32)
    with pytest.raises(CompileError) as info:
        kernel(num_warps="many").interpret[(1,)](x, 16)
    assert info.value.codes == ["SP0242"]


def test_launch_options_are_checked() -> None:
    x = np.zeros(16, np.float32)
    with pytest.raises(CompileError) as info:
        kernel().interpret[(1,)](x, 16, num_warps=0)
    assert [d.message for d in info.value.diagnostics] == ["num_warps must be a positive integer, found 0"]


@pytest.mark.parametrize(("grid", "message"), [
    ("a", "the grid must be an int or a tuple of up to 3 ints, found 'a'"),
    ((1.5,), "every grid dimension must be an integer, found 1.5 in (1.5,)"),
    ((float("nan"),), "every grid dimension must be an integer, found nan in (nan,)"),
    ((True,), "every grid dimension must be an integer, found True in (True,)"),
    (("1",), "every grid dimension must be an integer, found '1' in ('1',)"),
    ({1: 2}, "the grid must be an int or a tuple of up to 3 ints, found {1: 2}"),
    ((2**31,), f"grid (2147483648,) has 2147483648 programs along x; CUDA allows at most {GRID_LIMITS[0]}"),
    ((1, 65536), f"grid (1, 65536) has 65536 programs along y; CUDA allows at most {GRID_LIMITS[1]}"),
    (lambda meta: "x", "the grid must be an int or a tuple of up to 3 ints, found 'x'"),
    ((-1,), "a grid dimension cannot be negative, found (-1,)"),
    ((4, 0, -2), "a grid dimension cannot be negative, found (4, 0, -2)"),
    ((), "the grid must have 1 to 3 dimensions, found 0"),
    ((1, 1, 1, 1), "the grid must have 1 to 3 dimensions, found 4"),
])
def test_bad_grids_are_sp0710(grid: object, message: str) -> None:
    with pytest.raises(LaunchError) as info:
        normalize_grid(grid, {})
    assert (info.value.code, str(info.value).splitlines()[0]) == ("SP0710", f"error[SP0710]: {message}")


def test_good_grids() -> None:
    assert normalize_grid(3, {}) == (3, 1, 1)
    assert normalize_grid([2, np.int32(4)], {}) == (2, 4, 1)
    assert normalize_grid(lambda meta: (meta["B"], 2, 2), {"B": 5}) == (5, 2, 2)
    assert normalize_grid((GRID_LIMITS[0], 1, 65535), {}) == (GRID_LIMITS[0], 1, 65535)
    assert normalize_grid(0, {}) == (0, 1, 1)  # an empty grid: launched, it runs nothing
    assert normalize_grid((4, 0), {}) == (4, 0, 1)
    assert normalize_grid(lambda meta: (sp.cdiv(0, meta["B"]), 2, 2), {"B": 5}) == (0, 2, 2)


def test_a_huge_interpreter_grid_is_refused_before_running() -> None:
    # it used to reach the interpreter, which ran out of memory building the program list
    x = np.zeros(16, np.float32)
    with pytest.raises(LaunchError) as info:
        kernel().interpret[(1 << 40,)](x, 16)
    assert info.value.code == "SP0710"


@pytest.mark.parametrize("max_ops", ["a", 0, -1, 2.5])
def test_bad_max_ops_is_sp0725(max_ops: object) -> None:
    x = np.zeros(16, np.float32)
    with pytest.raises(LaunchError) as info:
        kernel().interpret[(1,)](x, 16, max_ops=max_ops)
    assert info.value.code == "SP0725"
    assert f"max_ops must be a positive integer or None, found {max_ops!r}" in str(info.value)


def test_max_ops_none_and_positive_run() -> None:
    x = np.arange(16, dtype=np.float32)
    kernel().interpret[(1,)](x, 16, max_ops=None)
    kernel().interpret[(1,)](x, 16, max_ops=10_000)
    np.testing.assert_array_equal(x, np.arange(16, dtype=np.float32) + 2)


# ------------------------------------------------------------------------------------------------
# pdl=True (programmatic dependent launch, docs/language.md): an option like cluster=


def test_pdl_decorator_option_is_kept_and_checked() -> None:
    k = sp.loads(SOURCE.replace("@kernel", "@kernel(pdl=True)"), "case.spk").kernels["add_one"]
    assert k.options == {"pdl": True}
    with pytest.raises(CompileError) as info:
        sp.loads(SOURCE.replace("@kernel", "@kernel(pdl=1)"), "case.spk")
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("SP0242", "pdl must be True or False, found 1")
    assert (d.span.line, d.span.col) == (2, 9) and "pdl.wait()" in d.help


def test_pdl_is_part_of_the_specialization_key() -> None:
    x = np.zeros(16, np.float32)
    k = kernel()
    _, _, plain = k.bind((x, 16), {})
    _, _, off = k.bind((x, 16), {"pdl": False})
    _, _, on = k.bind((x, 16), {"pdl": True})
    assert plain == off and on != plain
    assert k._key_options[on] == {"pdl": True}
    _, _, decorated = kernel(pdl=True).bind((x, 16), {})
    assert decorated == on
    with pytest.raises(CompileError) as info:
        k.bind((x, 16), {"pdl": "on"})
    assert info.value.codes == ["SP0242"]


def test_fresh_ir_gives_sema_pdl_only_when_true(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparsile.driver import kernel as kernel_module

    seen: list[dict] = []

    class Stop(Exception):
        pass

    def record(self: object, node: object, bindings: object, attrs: dict | None = None, notes: object = None) -> None:
        seen.append(dict(attrs or {}))
        raise Stop

    monkeypatch.setattr(kernel_module.Sema, "kernel", record)
    k = kernel()
    x = np.zeros(16, np.float32)
    for options in ({}, {"pdl": False}, {"pdl": True}):
        _, bindings, _ = k.bind((x, 16), {})
        with pytest.raises(Stop):
            k.fresh_ir(bindings, options)
    assert ["pdl" in attrs for attrs in seen] == [False, False, True] and seen[2]["pdl"] is True
    with pytest.raises(Stop):
        kernel(pdl=True).fresh_ir(bindings)
    assert seen[3]["pdl"] is True


def test_compiled_kernels_carry_pdl_into_their_cache_metadata() -> None:
    from sparsile.driver.compiler import CompiledKernel, compile_function

    k = sp.loads(SOURCE.replace("    offs =", "    pdl.wait()\n    offs ="), "case.spk").kernels["add_one"]
    x = np.zeros(16, np.float32)
    _, bindings, _ = k.bind((x, 16), {})
    plain = compile_function(k.fresh_ir(bindings), "sm_90a", stop_after="llvm")
    assert plain.pdl is False and plain.metadata()["pdl"] is False
    func = k.fresh_ir(bindings)
    func.attrs["pdl"] = True  # what sema's IR of a pdl=True launch holds (attrs given to Sema.kernel)
    ck = compile_function(func, "sm_90a", stop_after="llvm")
    assert ck.pdl is True and ck.metadata()["pdl"] is True
    assert CompiledKernel.from_cache(ck.metadata(), {}).pdl is True
    older = {key: value for key, value in ck.metadata().items() if key != "pdl"}  # an entry from before pdl
    assert CompiledKernel.from_cache(older, {}).pdl is False
