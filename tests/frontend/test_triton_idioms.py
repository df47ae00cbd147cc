"""Idioms a Triton user writes when porting a kernel: each either works as in Triton (computing
what a float64 numpy reference computes) or is reported at the user's source line with a help line
that names the sparsile spelling (docs/language.md, "Coming from Triton")."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import sparsile as sp


def where(needle: str) -> tuple[int, int]:
    """The (line, 1-based column) of the first ``needle`` in this file."""
    lines = inspect.getsource(inspect.getmodule(where)).splitlines()
    i = next(i for i, ln in enumerate(lines) if needle in ln)
    return i + 1, lines[i].index(needle) + 1


def one_error(excinfo: pytest.ExceptionInfo[sp.CompileError]) -> sp.Diagnostic:
    (d,) = excinfo.value.diagnostics
    return d


RNG = np.random.default_rng(7)


# ------------------------------------------------------------------ sp.cdiv in a grid lambda
@sp.jit
def copy_kernel(x, out, n, BLOCK: sp.constexpr):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    sp.store(out + offs, sp.load(x + offs, mask=offs < n), mask=offs < n)


def test_cdiv_is_callable_on_the_host_in_a_grid_lambda() -> None:
    # triton.cdiv(n, META["BLOCK"]) in a grid function: sp.cdiv raised RuntimeError there
    assert sp.cdiv(1000, 128) == 8 and sp.cdiv(1024, 128) == 8 and sp.cdiv(1, 16) == 1
    x = RNG.standard_normal(1000).astype(np.float32)
    out = np.zeros_like(x)
    copy_kernel.interpret[lambda meta: (sp.cdiv(meta["n"], meta["BLOCK"]),)](x, out, 1000, BLOCK=128)
    assert np.array_equal(out, x)


def test_host_cdiv_refuses_what_the_kernel_cdiv_refuses() -> None:
    with pytest.raises(TypeError, match="cdiv needs integers"):
        sp.cdiv(10.0, 2)
    with pytest.raises(ZeroDivisionError):
        sp.cdiv(10, 0)


def test_other_builtins_still_refuse_a_host_call() -> None:
    with pytest.raises(RuntimeError, match="can only be called inside a kernel"):
        sp.program_id(0)


KERNEL_ONLY = "can only be called inside a kernel (a function decorated with @sparsile.jit or defined in a .spk file)"


def test_a_host_call_of_a_builtin_has_a_code_and_names_the_numpy_function() -> None:
    """`sp.arange(0, 4)` outside a kernel raised a plain RuntimeError: now SP0253 (still a
    RuntimeError), whose help names numpy's function, or how to run the kernel for builtins that
    only mean something inside one."""
    with pytest.raises(sp.SparsileError) as e:
        sp.arange(0, 4)
    assert isinstance(e.value, RuntimeError)
    assert (e.value.code, e.value.message) == ("SP0253", f"`sparsile.arange` {KERNEL_ONLY}")
    assert e.value.help == "on the host, use numpy instead: np.arange"
    with pytest.raises(sp.SparsileError) as e:
        sp.dot(np.ones((2, 2)), np.ones((2, 2)))
    assert e.value.help == "on the host, use numpy instead: np.matmul (a @ b)"
    with pytest.raises(sp.SparsileError) as e:
        sp.tma.load(None, (0, 0), None, None)
    assert (e.value.code, e.value.message) == ("SP0253", f"`sparsile.tma.load` {KERNEL_ONLY}")
    assert e.value.help == ("`tma.load` has no meaning outside a kernel (it works on the program's own tiles, "
                            "memory or hardware); launch the kernel that calls it, `kernel[grid](...)`, or run it "
                            "on the CPU with `kernel.interpret[grid](...)`; on the host, compute on whole arrays "
                            "with numpy")


# ------------------------------------------------------------------ min / max of two scalars
@sp.jit
def grouped_pid(out, M, N, BM: sp.constexpr, BN: sp.constexpr, GROUP_M: sp.constexpr):
    # Triton tutorial 03's grouped ordering: Python's two-argument min on run-time scalars
    pid = sp.program_id(0)
    num_pid_m = sp.cdiv(M, BM)
    num_pid_n = sp.cdiv(N, BN)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    sp.store(out + 2 * pid, pid_m)
    sp.store(out + 2 * pid + 1, max(pid_n, 0, N - N))


def test_two_argument_min_and_max_of_scalars_are_pythons() -> None:
    M, N, BM, BN, G = 300, 200, 32, 64, 4
    pm, pn = -(-M // BM), -(-N // BN)
    out = np.full(2 * pm * pn, -1, np.int32)
    grouped_pid.interpret[(pm * pn,)](out, M, N, BM=BM, BN=BN, GROUP_M=G)
    want = []
    for pid in range(pm * pn):
        first = pid // (G * pn) * G
        size = min(pm - first, G)
        want += [first + pid % (G * pn) % size, pid % (G * pn) // size]
    assert out.tolist() == want
    assert sorted(zip(out[::2], out[1::2], strict=True)) == [(i, j) for i in range(pm) for j in range(pn)]


@sp.jit
def max_of_tile_and_axis(x, out):
    t = sp.load(x + sp.arange(0, 4)[:, None] * 8 + sp.arange(0, 8)[None, :])
    sp.store(out + sp.arange(0, 4), max(t, 1))


def test_min_max_of_a_tile_and_a_second_value_stays_refused() -> None:
    # tl.max(x, 1) reduces along axis 1; Python's max(x, 1) is a ReLU: ambiguous, so refused
    with pytest.raises(sp.CompileError) as info:
        max_of_tile_and_axis.ir(np.zeros(32, np.float32), np.zeros(4, np.float32))
    d = one_error(info)
    assert d.code == "SP0321" and "`max(a, b)` is not the elementwise maximum" in d.message
    line, col = where("max(t, 1))")
    assert (d.span.file_line, d.span.file_col) == (line, col + len("max(t, ")) and "max(x, axis=...)" in (d.help or "")


# ------------------------------------------------------------------ keep_dims=True
@sp.jit
def normalize_rows(x, out, R: sp.constexpr, C: sp.constexpr):
    offs = sp.arange(0, R)[:, None] * C + sp.arange(0, C)[None, :]
    t = sp.load(x + offs)
    m = sp.max(t, axis=1, keep_dims=True)
    s = sp.sum(t - m, axis=1, keep_dims=True)
    lo = t.min(axis=0, keep_dims=True)
    i = sp.argmax(t, axis=1, keep_dims=True)
    sp.static_assert(m.shape == (R, 1) and s.shape == (R, 1) and lo.shape == (1, C) and i.shape == (R, 1))
    sp.static_assert(sp.sum(t, keep_dims=True).shape == (1, 1) and sp.sum(t, 0, keep_dims=None).shape == (C,))
    sp.store(out + offs, (t - m) / s + lo + sp.sum(t, keep_dims=True) + i)


def test_reductions_keep_dims() -> None:
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    out = np.zeros_like(x)
    normalize_rows.interpret[(1,)](x, out, R=8, C=16)
    x64 = x.astype(np.float64)
    m = x64.max(1, keepdims=True)
    ref = (x64 - m) / (x64 - m).sum(1, keepdims=True) + x64.min(0, keepdims=True) + x64.sum() + x64.argmax(1)[:, None]
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


# ------------------------------------------------------------------ None for an optional pointer
@sp.jit
def bias_add(x, out, n, bias_ptr, HAS_BIAS: sp.constexpr, BLOCK: sp.constexpr = 64):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    y = sp.load(x + offs, mask=offs < n)
    if bias_ptr is not None:
        y += sp.load(bias_ptr + offs, mask=offs < n)
    sp.static_assert(HAS_BIAS == (bias_ptr is not None))
    sp.store(out + offs, y, mask=offs < n)


def test_none_for_an_unannotated_parameter_is_a_constexpr_none() -> None:
    x, b = RNG.standard_normal(100).astype(np.float32), RNG.standard_normal(100).astype(np.float32)
    out = np.zeros_like(x)
    bias_add.interpret[(2,)](x, out, 100, None, HAS_BIAS=False)
    assert np.array_equal(out, x)
    bias_add.interpret[(2,)](x, out, 100, b, HAS_BIAS=True)
    assert np.array_equal(out, x + b)
    ir = bias_add.ir(x, out, 100, None, HAS_BIAS=False)
    assert [p.name for p in ir.runtime_params] == ["x", "out", "n"]
    f32 = sp.ptr[sp.f32]
    for bias in (None, f32):  # ahead of time too: None in the signature, or a pointer type
        ptx = bias_add.compile({"x": f32, "out": f32, "n": sp.i32, "bias_ptr": bias, "HAS_BIAS": bias is not None},
                               target="sm_90a", stop_after="ptx").ptx
        assert ptx.count(".param .u64") == 2 + (bias is not None)


@sp.jit
def needs_bias(x, out, bias_ptr: sp.ptr[sp.f32]):
    sp.store(out, sp.load(x) + sp.load(bias_ptr))


def test_none_for_a_used_pointer_is_reported_where_it_is_used() -> None:
    x = np.ones(1, np.float32)
    with pytest.raises(sp.CompileError) as info:
        needs_bias.interpret[(1,)](x, x, None)
    d = one_error(info)
    line, col = where("sp.load(bias_ptr)")
    assert d.code == "SP0304" and (d.span.file_line, d.span.file_col) == (line, col + len("sp.load("))
    assert d.message == "expected a value as the pointer, found None"


def test_none_for_an_unannotated_scalar_is_reported_where_it_is_used() -> None:
    # Triton's rule too: None is a constant; the kernel then compares it with a tile
    with pytest.raises(sp.CompileError) as info:
        copy_kernel.interpret[(1,)](np.zeros(4, np.float32), np.zeros(4, np.float32), None, BLOCK=4)
    d = info.value.diagnostics[0]
    line, col = where("mask=offs < n)")
    assert d.code == "SP0329" and d.message == "`<` needs numbers or tiles, found None"
    assert (d.span.file_line, d.span.file_col) == (line, col + len("mask=offs < "))


@sp.jit
def scalar_param(out, n: sp.i32):
    sp.store(out, n)


def test_none_for_an_annotated_scalar_is_refused_at_the_launch() -> None:
    with pytest.raises(sp.LaunchError) as info:
        scalar_param.interpret[(1,)](np.zeros(1, np.int32), None)
    assert info.value.code == "SP0708" and info.value.message == "argument `n` expects a scalar i32, found NoneType"


# ------------------------------------------------------------------ range(..., num_stages=)
@sp.jit
def staged_sum(x, out, n, BLOCK: sp.constexpr, STAGES: sp.constexpr):
    acc = sp.zeros((BLOCK,), sp.float32)
    for start in sp.range(0, n, BLOCK, num_stages=STAGES):
        offs = start + sp.arange(0, BLOCK)
        acc += sp.load(x + offs, mask=offs < n)
    for i in range(0, 2, loop_unroll_factor=2):
        acc += i
    sp.store(out, sp.sum(acc))


def test_range_takes_trittons_pipelining_hints() -> None:
    x = RNG.standard_normal(300).astype(np.float32)
    out = np.zeros(1, np.float32)
    staged_sum.interpret[(1,)](x, out, 300, BLOCK=64, STAGES=3)
    assert abs(out[0] - (x.astype(np.float64).sum() + 64)) <= 1e-5 * (np.abs(x).sum() + 64)


@sp.jit
def range_bad_hint(out, n):
    for i in range(0, n, flatten=True):
        sp.store(out + i, i)


@sp.jit
def range_run_time_stages(out, n):
    for i in range(0, 4, num_stages=n):
        sp.store(out + i, i)


def test_range_refuses_other_keywords_with_the_fix() -> None:
    with pytest.raises(sp.CompileError) as info:
        range_bad_hint.ir(np.zeros(4, np.int32), 4)
    d = one_error(info)
    assert d.code == "SP0219" and d.message == "`range` takes no keyword argument `flatten`"
    assert (d.span.file_line, d.span.file_col) == where("flatten=True")
    assert "num_stages" in (d.help or "")
    with pytest.raises(sp.CompileError) as info:
        range_run_time_stages.ir(np.zeros(4, np.int32), 4)
    d = one_error(info)
    line, col = where("num_stages=n")
    assert d.code == "SP0201" and (d.span.file_line, d.span.file_col) == (line, col + len("num_stages="))


# ------------------------------------------------------------------ x.T
@sp.jit
def transpose_t(x, out, N: sp.constexpr):
    offs = sp.arange(0, N)[:, None] * N + sp.arange(0, N)[None, :]
    sp.store(out + offs, sp.load(x + offs).T)


def test_tile_T_is_the_transpose() -> None:
    x = RNG.standard_normal((8, 8)).astype(np.float32)
    out = np.zeros_like(x)
    transpose_t.interpret[(1,)](x, out, N=8)
    assert np.array_equal(out, x.T)


# ------------------------------------------------------------------ Triton spellings: the help names sparsile's
def spk_error(line: str) -> sp.Diagnostic:
    """The one diagnostic of a .spk kernel whose last line is ``line`` (``t`` is a 16x16 f32 tile)."""
    src = ("import sparsile as sp\n\n\n@kernel\ndef k(p: ptr[f32], o: ptr[f32]):\n"
           "    r = arange(0, 16)\n    t = load(p + r[:, None] * 16 + r[None, :])\n"
           f"    {line}\n")
    kernel = sp.loads(src, "case.spk").kernels["k"]
    with pytest.raises(sp.CompileError) as info:
        kernel.ir(np.zeros(256, np.float32), np.zeros(16, np.float32))
    (d,) = info.value.diagnostics
    assert d.span.file_line == 8
    return d


@pytest.mark.parametrize(("line", "needle", "code", "message", "help_part"), [
    ("store(o + r, sp.cast(t, f16))", "cast", "SP0204", "`sparsile` has no member `cast`", "`x.to(dtype)`"),
    ("store(o + sp.multiple_of(r, 16), t)", "multiple_of", "SP0204", "`sparsile` has no member `multiple_of`",
     "use the value as it is"),
    ("store(o + r, sp.math.exp(t))", "math", "SP0204", "`sparsile` has no member `math`", "`sp.exp(x)`"),
    ("store(o + r, sp.libdevice.erf(t))", "libdevice", "SP0204", "`sparsile` has no member `libdevice`",
     "`tanh`, `erf`"),
    ("store(o + r, sp.zeros_like(t))", "zeros_like", "SP0204", "`sparsile` has no member `zeros_like`",
     "`zeros(x.shape, x.dtype)`"),
    ("debug_barrier()", "debug_barrier", "SP0202", "unknown name `debug_barrier`", "`barrier()`"),
    ("store(o + r, sp.load(p).to(sp.pointer_type(f32)))", "pointer_type", "SP0204",
     "`sparsile` has no member `pointer_type`", "integer offsets"),
    ("store(o + r, load(p + r, eviction_policy=\"evict_last\"))", "eviction_policy", "SP0321",
     "wrong arguments to `load`: got an unexpected keyword argument `eviction_policy`", "drop `eviction_policy=`"),
    ("store(o + r, sum(dot(t, t, allow_tf32=False), axis=1))", "allow_tf32", "SP0321",
     "wrong arguments to `dot`: got an unexpected keyword argument `allow_tf32`", "rounds them to tf32"),
    ("store(o + r, sum(dot(t, t, out_dtype=f16), axis=1))", "out_dtype", "SP0321",
     "wrong arguments to `dot`: got an unexpected keyword argument `out_dtype`", "give `acc` of that type"),
    ("store(o + r, t.to(i32, bitcast=True))", "bitcast", "SP0321",
     "wrong arguments to `to`: got an unexpected keyword argument `bitcast`", "reinterpreting bits"),
    ("store(o + r, zeros((16,), f32, order=1))", "order", "SP0321",
     "wrong arguments to `zeros`: got an unexpected keyword argument `order`", "signature: zeros(shape, dtype)"),
])
def test_triton_spellings_get_the_sparsile_spelling(line: str, needle: str, code: str, message: str,
                                                    help_part: str) -> None:
    d = spk_error(line)
    assert (d.code, d.message) == (code, message)
    assert d.span.file_col == 5 + line.index(needle)
    assert help_part in (d.help or ""), d.help


# ------------------------------------------------------------------ the lifted idioms compile for the GPU
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a", "sm_80"])
def test_lifted_idioms_compile_to_ptx(target: str) -> None:
    f32 = sp.ptr[sp.f32]
    kernels = [(normalize_rows, {"x": f32, "out": f32, "R": 8, "C": 16}),  # (its numbers: test_reductions_keep_dims)
               (transpose_t, {"x": f32, "out": f32, "N": 16}),
               (grouped_pid, {"out": sp.ptr[sp.i32], "M": sp.i32, "N": sp.i32, "BM": 32, "BN": 64, "GROUP_M": 4}),
               (staged_sum, {"x": f32, "out": f32, "n": sp.i32, "BLOCK": 64, "STAGES": 3})]
    for kernel, signature in kernels:
        assert ".entry" in kernel.compile(signature, target=target, stop_after="ptx").ptx


# ------------------------------------------------------------------ host helpers: next_power_of_2, heuristics
def test_next_power_of_2_on_the_host() -> None:
    # triton.next_power_of_2(n_cols): the block size of tutorial 02's softmax
    assert [sp.next_power_of_2(n) for n in (0, 1, 2, 3, 181, 256, 257, 2**40 + 1)] == [1, 1, 2, 4, 256, 256, 512, 2**41]
    with pytest.raises(TypeError, match="an integer"):
        sp.next_power_of_2(3.5)


def test_heuristics_names_the_sparsile_way() -> None:
    with pytest.raises(AttributeError, match="constexpr argument") as info:
        sp.heuristics  # noqa: B018
    assert "has no attribute 'heuristics'" in str(info.value)
    assert not hasattr(sp, "heuristics")


# ------------------------------------------------------------------ out_ptr.dtype.element_ty
@sp.jit
def store_as_pointee(x, out_ptr, BLOCK: sp.constexpr):
    offs = sp.arange(0, BLOCK)
    acc = sp.load(x + offs) * 3.0
    sp.static_assert(out_ptr.dtype == sp.f16 and out_ptr.dtype.element_ty == sp.f16)
    sp.static_assert((out_ptr + offs).dtype == sp.f16)
    sp.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty))


def test_pointer_dtype_element_ty() -> None:
    x = RNG.standard_normal(16).astype(np.float32)
    out = np.zeros(16, np.float16)
    store_as_pointee.interpret[(1,)](x, out, BLOCK=16)
    assert np.array_equal(out, (x.astype(np.float64) * 3).astype(np.float32).astype(np.float16))
    store_as_pointee.compile({"x": sp.ptr[sp.f32], "out_ptr": sp.ptr[sp.f16], "BLOCK": 16}, target="sm_90a",
                             stop_after="ptx")


# ------------------------------------------------------------------ tl.argmax compiles for the GPU as written
@sp.jit
def row_argmax(x, out, R: sp.constexpr, C: sp.constexpr):
    t = sp.load(x + sp.arange(0, R)[:, None] * C + sp.arange(0, C)[None, :])
    sp.store(out + sp.arange(0, R), sp.argmax(t, axis=1))


def test_argmax_compiles_for_the_gpu() -> None:
    """It was SP0622 (interpreter only), with a help line spelling it as `max` and `min`."""
    signature = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.i32], "R": 8, "C": 16}
    ptx = row_argmax.compile(signature, target="sm_90a", stop_after="ptx").ptx
    assert ".entry" in ptx and "shfl.sync.bfly" in ptx
    x = RNG.integers(0, 5, (8, 16)).astype(np.float32)  # ties: the first maximum
    out = np.full(8, -1, np.int32)
    row_argmax.interpret[(1,)](x, out, R=8, C=16)
    assert np.array_equal(out, x.argmax(1))


def test_triton_jit_options_say_what_to_do_instead() -> None:
    with pytest.raises(TypeError, match="unknown kernel option `do_not_specialize`") as info:
        sp.jit(do_not_specialize=["n"])
    assert "prepare(..., vary=" in str(info.value)
    with pytest.raises(TypeError, match="unknown kernel option `bogus`; options: num_warps") as info:
        sp.jit(bogus=1)
    assert "(" not in str(info.value).split("options:")[1]
