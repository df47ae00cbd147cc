"""``sparsile check`` on kernels whose constexprs have no default (checked with representative
values, frontend/sema/check_kernels.py), files without kernels (SP0251), ``--strict``; and kernel
options refused before anything uses them (SP0558) and layouts that cannot be built
reported at the op (SP0250), not as tracebacks."""

from __future__ import annotations

import io
import re

import pytest

import sparsile
from sparsile.cli import EXIT_DIAGNOSTICS, EXIT_OK, main
from sparsile.frontend.diagnostics import CompileError

HEAD = """\
@kernel
def k(x: ptr[f32], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
"""


def check(tmp_path, source: str, *flags: str) -> tuple[int, str, str]:
    path = tmp_path / "k.spk"
    path.write_text(source)
    out, err = io.StringIO(), io.StringIO()
    code = main(["check", str(path), *flags], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


# Each error kind, in a kernel whose only constexpr has no default: (line 4, code, message, column).
ERRORS = {
    "unknown name": ("    store(x + offs, load(x + offs, mask=offs < n) + undefined_name, mask=offs < n)",
                     "SP0202", "unknown name `undefined_name`", 53),
    "unknown builtin": ("    store(x + offs, frobnicate(load(x + offs, mask=offs < n)), mask=offs < n)",
                        "SP0202", "unknown name `frobnicate`", 21),
    "wrong arity": ("    store(x + offs, load(x + offs, offs < n, 0.0, 1), mask=offs < n)",
                    "SP0321", "wrong arguments to `load`: too many positional arguments", 21),
    "shape mismatch": ("    store(x + offs, load(x + offs, mask=offs < n) + arange(0, BLOCK)[:, None], mask=offs < n)",
                       "SP0305", "cannot store a value of shape (16, 16) through pointers of shape (16,)", 21),
    "mask of the wrong type": ("    store(x + offs, load(x + offs, mask=offs), mask=offs < n)",
                               "SP0312", "a mask must be bool, found tile<16xi32>", 41),
    "float pointer offset": ("    store(x + offs * 0.5, load(x + offs, mask=offs < n), mask=offs < n)",
                             "SP0310", "a pointer offset must be an integer, found tile<16xf32>", 15),
}


@pytest.mark.parametrize("kind", ERRORS)
def test_errors_of_a_kernel_whose_constexpr_has_no_default_are_reported(tmp_path, kind: str) -> None:
    line, code, message, col = ERRORS[kind]
    status, out, err = check(tmp_path, HEAD + line + "\n")
    assert status == EXIT_DIAGNOSTICS and "ok" not in out
    assert f"error[{code}]: {message}\n --> {tmp_path / 'k.spk'}:4:{col}\n" in err


def test_a_clean_kernel_is_checked_with_named_representative_values(tmp_path) -> None:
    status, out, err = check(tmp_path, HEAD + "    store(x + offs, load(x + offs, mask=offs < n), mask=offs < n)\n")
    assert status == EXIT_OK and err == ""
    assert "k.spk: ok (1 kernel checked: k)" in out
    assert "note: `k` was checked with representative values BLOCK=16; give yours with --signature" in out


def test_a_candidate_that_fails_is_no_error_when_another_one_works(tmp_path) -> None:
    # 16 fails the static_assert and the shape; 32 satisfies both: no spurious error
    body = ("    static_assert(BLOCK % 32 == 0, \"BLOCK is a multiple of 32\")\n"
            "    store(x + offs + arange(0, 32), load(x + offs, mask=offs < n), mask=offs < n)\n")
    status, out, err = check(tmp_path, HEAD + body)
    assert status == EXIT_OK and err == "", err
    assert "representative values BLOCK=32" in out


def test_a_kernel_every_candidate_fails_on_a_value_check_is_reported_as_checked_partially(tmp_path) -> None:
    body = "    static_assert(BLOCK >= 4096, \"big blocks only\")\n"
    status, out, err = check(tmp_path, HEAD + body)
    assert status == EXIT_OK and err == ""
    assert "no errors found, but only 0 of 1 kernels fully checked" in out
    assert re.search(r"warning: `k` was checked partially: every representative value tried \(BLOCK=16; BLOCK=64; "
                     r"BLOCK=128; BLOCK=32\) stops at a check that depends on the value \(first: error\[SP0320\] at "
                     r".*k\.spk:4:19: static assertion failed: big blocks only\)", out), out
    assert check(tmp_path, HEAD + body, "--strict")[0] == EXIT_DIAGNOSTICS


def test_a_constexpr_used_as_a_dtype_gets_a_dtype(tmp_path) -> None:
    src = HEAD.replace("BLOCK: constexpr", "BLOCK: constexpr, DT: constexpr")
    good = src + "    store(x + offs, load(x + offs, mask=offs < n).to(DT).to(f32), mask=offs < n)\n"
    status, out, err = check(tmp_path, good)
    assert status == EXIT_OK and err == "" and "representative values BLOCK=16, DT=f32" in out
    bad = src + "    store(x + offs, load(x + offs, mask=offs < n).to(DT) + nope, mask=offs < n)\n"
    status, out, err = check(tmp_path, bad)
    assert status == EXIT_DIAGNOSTICS
    assert "error[SP0202]: unknown name `nope`" in err and "SP0302" not in err


def test_a_kernel_without_parameter_types_is_checked_where_they_are_not_used(tmp_path) -> None:
    src = "@kernel\ndef k(x, n: i32):\n    v = load(x + arange(0, 16))\n    w = frobnicate(n)\n"
    status, _, err = check(tmp_path, src)
    assert status == EXIT_DIAGNOSTICS
    assert f"error[SP0202]: unknown name `frobnicate`\n --> {tmp_path / 'k.spk'}:4:9\n" in err
    assert "SP0202" not in err.split("frobnicate")[1]  # nothing reported about `x`, whose type is unknown


def test_a_kernel_without_parameter_types_is_reported_as_checked_partially(tmp_path) -> None:
    src = "@kernel\ndef k(x, n: i32):\n    store(x + arange(0, 16), 1.0)\n"
    status, out, _ = check(tmp_path, src)
    assert status == EXIT_OK
    assert ("warning: `k` was checked partially: `x` has no type, so what depends on it was not checked; give them "
            "with --signature") in out
    assert check(tmp_path, src, "--strict")[0] == EXIT_DIAGNOSTICS
    assert check(tmp_path, src, "--strict", "--signature", "x=ptr[f32]")[0] == EXIT_OK


def test_a_file_without_kernels_is_a_warning(tmp_path) -> None:
    status, out, err = check(tmp_path, "SCALE = 2\n\n\ndef helper(x):\n    return x * SCALE\n")
    assert status == EXIT_OK and out == ""
    assert "warning[SP0251]: `" in err and "k.spk` defines no kernel: nothing was checked" in err
    assert check(tmp_path, "SCALE = 2\n", "--strict")[0] == EXIT_DIAGNOSTICS


# ------------------------------------------------------------------------------------------- options
KERNEL = """\
@kernel({options})
def k(x: ptr[f32], n: i32, BLOCK: constexpr = 64):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    v = load(x + offs, mask=offs < n)
    store(x + offs, v + sum(v, axis=0), mask=offs < n)
"""


@pytest.mark.parametrize("cluster", ["(2**63, 1, 1)", "(2, 1, -7)", "(2**36, 1, 1)", "(4, 4, 1)", "(0, 1, 1)",
                                     "(2.0, 1, 1)", "(1, 1, 1, 1)", "()"])
def test_a_bad_cluster_shape_is_refused_at_the_option(cluster: str) -> None:
    with pytest.raises(CompileError) as e:
        sparsile.loads(KERNEL.format(options=f"cluster={cluster}"), "c.spk")
    (d,) = e.value.diagnostics
    assert d.code == "SP0558" and d.message.startswith("a cluster is 1 to 3 positive ints of at most 8 CTAs in all")
    assert (d.span.line, d.span.col) == (1, 9)


def test_a_bad_cluster_given_to_compile_is_refused_before_sema() -> None:
    k = sparsile.loads(KERNEL.format(options=""), "c.spk").kernels["k"]
    with pytest.raises(CompileError) as e:
        k.compile("x=ptr[f32], n=i32", target="sm_90a", stop_after="ir", cluster=(2**63, 1, 1))
    assert e.value.codes == ["SP0558"] and e.value.diagnostics[0].span.line == 2


def test_a_huge_num_warps_is_the_thread_limit_diagnostic_not_a_crash() -> None:
    k = sparsile.loads(KERNEL.format(options="num_warps=2**40"), "w.spk").kernels["k"]
    with pytest.raises(CompileError) as e:
        k.compile("x=ptr[f32], n=i32", target="sm_90a", stop_after="ptx")
    assert e.value.codes == ["SP0580"]


@pytest.mark.parametrize("warps", [6, 3, 9])
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_a_tile_on_a_non_power_of_two_warp_count_is_a_located_diagnostic(tmp_path, target: str, warps: int) -> None:
    """3 and 9 warps compiled: the tile was spread over 2 / 8 warps and the others computed copies of it
    (an atomic or a shared-memory reduction counted them too, on the GPU only). 6 failed later, elsewhere."""
    k = sparsile.loads(KERNEL.format(options=f"num_warps={warps}"), "w.spk").kernels["k"]
    with pytest.raises(CompileError) as e:
        k.compile("x=ptr[f32], n=i32", target=target, stop_after="ptx")
    (d,) = e.value.diagnostics
    assert d.code == "SP0250"
    assert d.message == ("a tile<64xi32> needs a power-of-two number of warps to spread over, but this code runs "
                         f"on {warps} warps")
    assert (d.span.line, d.span.col) == (3, 36)  # the kernel's first tile: arange(0, BLOCK)


def test_a_compile_time_operation_the_representative_value_lacks_is_partial(tmp_path) -> None:
    """``len(T)`` of a tuple constexpr fails for every integer candidate: a partial check, no error."""
    path = tmp_path / "tuple_constexpr.spk"
    path.write_text("@kernel\ndef k(x: ptr[f32], T: constexpr):\n"
                    "    for i in static_range(len(T)):\n        store(x + i, T[i] * 1.0)\n")
    out, err = io.StringIO(), io.StringIO()
    assert main(["check", str(path)], stdout=out, stderr=err) == EXIT_OK
    printed = out.getvalue() + err.getvalue()
    assert not any(line.startswith("error[") for line in printed.splitlines())
    assert "`k` was checked partially" in printed and "SP0331" in printed
