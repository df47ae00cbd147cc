"""Issue 15 item 3: the interpreter writes back only what the kernel writes, identical views share
one copy (``out=x`` works for a strided x), and other overlapping arguments with a write through a
copy are refused (SP0750). Also: the written-parameter analysis follows loop-carried pointers."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import LaunchError
from sparsile.frontend.interp.host_arrays import stored_params

SOURCE = """
@kernel
def add(x: ptr[f32], y: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 32):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n) + load(y + offs, mask=offs < n), mask=offs < n)

@kernel
def walk(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 8):
    p = out
    q = x
    for i in range(0, n // BLOCK):
        offs = arange(0, BLOCK)
        store(p + offs, load(q + offs) * 2.0)
        p = p + BLOCK
        q = q + BLOCK

@kernel
def twice(a: ptr[f32], b: ptr[f32], n: i32, BLOCK: constexpr = 32):
    offs = arange(0, BLOCK)
    m = offs < n
    store(a + offs, load(a + offs, mask=m) + 1.0, mask=m)
    store(b + offs, load(b + offs, mask=m) * 10.0, mask=m)
"""


def module() -> sp.Module:
    return sp.loads(SOURCE, "alias.spk")


def test_output_aliasing_a_strided_input_keeps_the_writes() -> None:
    rng = np.random.default_rng(0)
    base = np.full(64, np.nan, np.float32)
    x = base[::2]
    x[...] = rng.standard_normal(32).astype(np.float32)
    before = x.astype(np.float64)
    y = rng.standard_normal(32).astype(np.float32)
    module().kernels["add"].interpret[(1,)](x, y, x, 32)
    np.testing.assert_array_equal(x, (before + y).astype(np.float32))
    assert np.isnan(base[1::2]).all()  # the gaps are untouched


def test_identical_strided_views_written_twice_share_one_copy() -> None:
    base = np.zeros(64, np.float32)
    module().kernels["twice"].interpret[(1,)](base[::2], base[::2], 32)
    np.testing.assert_array_equal(base[::2], np.full(32, 10.0, np.float32))  # (0 + 1) * 10
    np.testing.assert_array_equal(base[1::2], np.zeros(32, np.float32))


def test_read_only_copies_are_not_written_back() -> None:
    """A strided input the kernel only reads is not copied back (it used to be, after the output,
    so an output aliasing it lost its writes); here a later change to x's memory shows it."""
    x = np.arange(64, dtype=np.float32)[::2]
    out = np.zeros(32, np.float32)
    module().kernels["add"].interpret[(1,)](x, x, out, 32)
    np.testing.assert_array_equal(out, 2 * np.arange(0, 64, 2, dtype=np.float32))
    np.testing.assert_array_equal(x, np.arange(0, 64, 2, dtype=np.float32))


def test_overlapping_different_views_with_a_write_through_a_copy_are_sp0750() -> None:
    base = np.zeros(80, np.float32)
    with pytest.raises(LaunchError) as info:
        module().kernels["add"].interpret[(1,)](base[::2], np.ones(32, np.float32), base[16::2], 32)
    assert info.value.code == "SP0750"
    assert str(info.value).splitlines()[0] == (
        "error[SP0750]: arguments `x` and `out` overlap in memory but are different views, and the kernel "
        "writes through `out`; the interpreter runs on a copy of non-contiguous (or converted) arrays, so "
        "the writes would be lost")
    assert np.all(base == 0)


def test_interleaved_views_do_not_overlap_and_contiguous_overlaps_alias_in_place() -> None:
    base = np.zeros(64, np.float32)
    module().kernels["add"].interpret[(1,)](base[1::2], np.ones(32, np.float32), base[::2], 32)
    np.testing.assert_array_equal(base[::2], np.ones(32, np.float32))
    flat = np.arange(40, dtype=np.float32)  # out = x shifted by 8, both in place: GPU-like aliasing
    module().kernels["add"].interpret[(1,)](flat[8:40], np.zeros(32, np.float32), flat[0:32], 32)
    expected = np.arange(40, dtype=np.float32)  # one program loads the whole tile, then stores it
    expected[0:32] = np.arange(8, 40, dtype=np.float32)
    np.testing.assert_array_equal(flat, expected)


def test_loop_carried_pointer_is_a_written_parameter() -> None:
    walk = module().kernels["walk"]
    assert stored_params(walk.ir(np.zeros(32, np.float32), np.zeros(32, np.float32), 32)) == {"out"}
    x = np.arange(64, dtype=np.float32)[::2]
    out = np.full(64, np.nan, np.float32)[::2]  # a copy, written back only if `out` is known written
    walk.interpret[(1,)](x, out, 32)
    np.testing.assert_array_equal(out, 2 * x)


def test_read_only_input_carried_in_a_loop_is_accepted() -> None:
    x = np.arange(32, dtype=np.float32)
    x.setflags(write=False)
    out = np.zeros(32, np.float32)
    module().kernels["walk"].interpret[(1,)](x, out, 32)
    np.testing.assert_array_equal(out, 2 * x)


def test_torch_bfloat16_output_aliasing_its_input() -> None:
    torch = pytest.importorskip("torch")
    src = """
@kernel
def inc(x: ptr[bf16], out: ptr[bf16], n: i32, BLOCK: constexpr = 16):
    offs = arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n) + 1.0, mask=offs < n)
"""
    t = torch.arange(16, dtype=torch.bfloat16)
    sp.loads(src, "inc.spk").kernels["inc"].interpret[(1,)](t, t, 16)
    assert torch.equal(t, torch.arange(16, dtype=torch.bfloat16) + 1)
    base = torch.zeros(32, dtype=torch.bfloat16)
    with pytest.raises(LaunchError) as info:
        sp.loads(src, "inc.spk").kernels["inc"].interpret[(1,)](base[:16], base[8:24], 16)
    assert info.value.code == "SP0750"


def test_a_jax_array_written_by_the_kernel_is_sp0719() -> None:
    """A JAX array (immutable) was converted to a writable numpy copy that nothing read back: the
    kernel's writes vanished and the call returned as if it had worked. The GPU launcher refuses a
    read-only array where the kernel writes (SP0719); the interpreter now does too."""
    jnp = pytest.importorskip("jax.numpy")
    x = np.arange(32, dtype=np.float32)
    out = jnp.zeros(32, jnp.float32)
    with pytest.raises(LaunchError) as info:
        module().kernels["add"].interpret[(1,)](x, x, out, 32)
    assert info.value.code == "SP0719"
    assert str(info.value).splitlines() == [
        "error[SP0719]: argument `out` is a read-only ArrayImpl (the interpreter reads it through a host copy "
        "it cannot write back), but the kernel writes through it",
        " = help: pass a numpy array or a torch tensor (e.g. `np.array(x)`), or call the kernel through "
        "sparsile.jax.call, whose outputs JAX allocates"]
    assert not np.asarray(out).any()
    result = np.zeros(32, np.float32)  # read through a JAX array: fine
    module().kernels["add"].interpret[(1,)](jnp.asarray(x), x, result, 32)
    np.testing.assert_array_equal(result, 2 * x)


def test_identical_views_of_a_converted_torch_tensor_share_one_copy() -> None:
    """bfloat16 torch tensors are copied for the interpreter; two tensor objects that are the same
    view (``t`` and ``t[:]``) got a copy each and were refused as an overlap (SP0750), where the
    same object, or numpy's ``a`` and ``a[:]``, share one copy, as the GPU shares the memory."""
    torch = pytest.importorskip("torch")
    src = """
@kernel
def twice(a: ptr[bf16], b: ptr[bf16], n: i32, BLOCK: constexpr = 16):
    offs = arange(0, BLOCK)
    m = offs < n
    store(a + offs, load(a + offs, mask=m) + 1.0, mask=m)
    store(b + offs, load(b + offs, mask=m) * 2.0, mask=m)
"""
    t = torch.arange(16, dtype=torch.bfloat16)
    sp.loads(src, "twice.spk").kernels["twice"].interpret[(1,)](t, t[:], 16)
    assert torch.equal(t, (torch.arange(16, dtype=torch.bfloat16) + 1) * 2)
