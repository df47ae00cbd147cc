"""GPU tests of the runtime (run by the lead on an H200; skipped without a GPU).

Every kernel here is hand-written PTX linked with ``cuda.bindings.nvjitlink`` directly, so these
tests depend on nothing but the runtime under test. Inputs are random, outputs are poisoned
before the launch, results are compared with numpy. ``test_ptx_kernels_link`` runs on the CPU
too: it proves the PTX itself is valid for sm_90a and sm_100a before a GPU ever sees it.
"""

from __future__ import annotations

import ctypes
import math
import struct

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver, nvjitlink

from sparsile.backend import runtime
from sparsile.backend.runtime import DeviceBuffer, Launcher, check, dlpack
from sparsile.backend.runtime import arguments as A
from sparsile.backend.runtime.tensormap import (
    Swizzle,
    TensorMapParam,
    TensorMapSpec,
    encode_tensor_map,
    make_tensor_map,
)
from sparsile.frontend.diagnostics import LaunchError

HEADER = ".version 8.0\n.target sm_90\n.address_size 64\n"

AXPY = HEADER + r"""
// out[i] = alpha * x[i] + y[i] for i < n
.visible .entry axpy(.param .u64 px, .param .u64 py, .param .u64 pout, .param .f32 alpha, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<5>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [px];
    ld.param.u64 %rd2, [py];
    ld.param.u64 %rd3, [pout];
    ld.param.f32 %f1, [alpha];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd4, %r5, 4;
    add.u64 %rd5, %rd1, %rd4;
    add.u64 %rd6, %rd2, %rd4;
    add.u64 %rd7, %rd3, %rd4;
    ld.global.f32 %f2, [%rd5];
    ld.global.f32 %f3, [%rd6];
    fma.rn.f32 %f4, %f1, %f2, %f3;
    st.global.f32 [%rd7], %f4;
DONE:
    ret;
}
"""

COPY16 = HEADER + r"""
// dst[i] = src[i] for 16-bit elements, i < n
.visible .entry copy16(.param .u64 psrc, .param .u64 pdst, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b16 %h<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [psrc];
    ld.param.u64 %rd2, [pdst];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd3, %r5, 2;
    add.u64 %rd4, %rd1, %rd3;
    add.u64 %rd5, %rd2, %rd3;
    ld.global.u16 %h1, [%rd4];
    st.global.u16 [%rd5], %h1;
DONE:
    ret;
}
"""

SCALARS = HEADER + r"""
// out[k] = the raw bits of scalar parameter k, zero-extended to 64 bits
.visible .entry scalars(.param .u64 pout, .param .u8 a, .param .u16 b, .param .u64 c, .param .b16 d,
                        .param .b16 e, .param .f64 f, .param .u32 g, .param .u8 h)
{
    .reg .b16 %h<6>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [pout];
    ld.param.u8 %h1, [a];
    cvt.u64.u16 %rd2, %h1;
    st.global.u64 [%rd1], %rd2;
    ld.param.u16 %h2, [b];
    cvt.u64.u16 %rd3, %h2;
    st.global.u64 [%rd1+8], %rd3;
    ld.param.u64 %rd4, [c];
    st.global.u64 [%rd1+16], %rd4;
    ld.param.b16 %h3, [d];
    cvt.u64.u16 %rd5, %h3;
    st.global.u64 [%rd1+24], %rd5;
    ld.param.b16 %h4, [e];
    cvt.u64.u16 %rd6, %h4;
    st.global.u64 [%rd1+32], %rd6;
    ld.param.b64 %rd7, [f];
    st.global.u64 [%rd1+40], %rd7;
    ld.param.u32 %r1, [g];
    cvt.u64.u32 %rd8, %r1;
    st.global.u64 [%rd1+48], %rd8;
    ld.param.u8 %h5, [h];
    cvt.u64.u16 %rd9, %h5;
    st.global.u64 [%rd1+56], %rd9;
    ret;
}
"""

REVERSE_SMEM = HEADER + r"""
// Fill nwords u32 of dynamic shared memory with 0..nwords-1, then out[i] = smem[nwords-1-i].
.extern .shared .align 16 .b8 dsmem[];
.visible .entry reverse_smem(.param .u64 pout, .param .u32 nwords)
{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [pout];
    ld.param.u32 %r1, [nwords];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, dsmem;
    mov.u32 %r5, %r2;
FILL:
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra FILLED;
    shl.b32 %r6, %r5, 2;
    add.u32 %r7, %r4, %r6;
    st.shared.u32 [%r7], %r5;
    add.u32 %r5, %r5, %r3;
    bra FILL;
FILLED:
    bar.sync 0;
    mov.u32 %r5, %r2;
READ:
    setp.ge.u32 %p2, %r5, %r1;
    @%p2 bra DONE;
    sub.u32 %r8, %r1, 1;
    sub.u32 %r8, %r8, %r5;
    shl.b32 %r9, %r8, 2;
    add.u32 %r10, %r4, %r9;
    ld.shared.u32 %r11, [%r10];
    mul.wide.u32 %rd2, %r5, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r11;
    add.u32 %r5, %r5, %r3;
    bra READ;
DONE:
    ret;
}
"""

CLUSTER_IDS = HEADER + r"""
// out[3*ctaid.x + (0, 1, 2)] = (%cluster_ctarank, %cluster_nctarank, %clusterid.x)
.visible .entry cluster_ids(.param .u64 pout)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<4>;
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra DONE;
    ld.param.u64 %rd1, [pout];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %cluster_ctarank;
    mov.u32 %r4, %cluster_nctarank;
    mov.u32 %r5, %clusterid.x;
    mul.lo.u32 %r6, %r2, 12;
    cvt.u64.u32 %rd2, %r6;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r3;
    st.global.u32 [%rd3+4], %r4;
    st.global.u32 [%rd3+8], %r5;
DONE:
    ret;
}
"""

TMA_LOAD = HEADER + r"""
// One CTA: TMA-load the box at element coordinates (c1 = row, c0 = column) into 1024-byte
// aligned shared memory (docs/hardware.md 5.1-5.3), then copy the raw shared-memory bytes to out,
// so that a swizzled arrangement stays visible.
.visible .entry tma_load_2d(.param .align 64 .b8 tmap[128], .param .u64 pout, .param .u32 c0,
                            .param .u32 c1, .param .u32 nbytes)
{
    .shared .align 1024 .b8 tile[16384];
    .shared .align 8 .b64 mbar;
    .reg .pred %p<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    mov.u32 %r1, %tid.x;
    ld.param.u64 %rd1, [pout];
    ld.param.u32 %r2, [c0];
    ld.param.u32 %r3, [c1];
    ld.param.u32 %r4, [nbytes];
    mov.b64 %rd2, tmap;
    cvta.param.u64 %rd3, %rd2;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra INITIALIZED;
    mbarrier.init.shared::cta.b64 [mbar], 1;
    fence.mbarrier_init.release.cluster;
    fence.proxy.async.shared::cta;
INITIALIZED:
    bar.sync 0;
    @%p1 bra WAIT;
    mbarrier.arrive.expect_tx.shared::cta.b64 %rd4, [mbar], %r4;
    cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [tile], [%rd3, {%r2, %r3}], [mbar];
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [mbar], 0;
    @!%p2 bra WAIT;
    shr.u32 %r5, %r4, 4;
    mov.u32 %r6, %r1;
    mov.u32 %r8, tile;
    mov.u32 %r14, %ntid.x;
COPY:
    setp.ge.u32 %p3, %r6, %r5;
    @%p3 bra DONE;
    shl.b32 %r7, %r6, 4;
    add.u32 %r9, %r8, %r7;
    ld.shared.v4.u32 {%r10, %r11, %r12, %r13}, [%r9];
    cvt.u64.u32 %rd5, %r7;
    add.u64 %rd6, %rd1, %rd5;
    st.global.v4.u32 [%rd6], {%r10, %r11, %r12, %r13};
    add.u32 %r6, %r6, %r14;
    bra COPY;
DONE:
    ret;
}
"""

ALL_KERNELS = {"axpy": AXPY, "copy16": COPY16, "scalars": SCALARS, "reverse_smem": REVERSE_SMEM,
               "cluster_ids": CLUSTER_IDS, "tma_load_2d": TMA_LOAD}


def link(ptx: str, arch: str) -> bytes:
    """PTX -> cubin with nvJitLink (what the project's linker does, written out here so that
    these tests depend only on the runtime)."""
    handle = nvjitlink.create(1, [f"-arch={arch}"])
    try:
        data = ptx.encode()
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "test.ptx")
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError:
            log = bytearray(nvjitlink.get_error_log_size(handle))
            nvjitlink.get_error_log(handle, log)
            raise AssertionError(log.decode(errors="replace")) from None
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    finally:
        nvjitlink.destroy(handle)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name", sorted(ALL_KERNELS))
def test_ptx_kernels_link(name, arch):
    cubin = link(ALL_KERNELS[name], arch)
    assert cubin[:4] == b"\x7fELF" and name.encode() in cubin


# ---------------------------------------------------------------------------------------------
# Helpers for the GPU tests


def device_arch() -> str:
    major, minor = runtime.current_device().compute_capability
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


_modules: dict[str, runtime.Module] = {}


def kernel(name: str) -> runtime.KernelFunction:
    if name not in _modules:
        _modules[name] = runtime.load_module(link(ALL_KERNELS[name], device_arch()))
    return _modules[name].function(name)


AXPY_SPEC = A.ParamSpec((A.PointerParam("x", "f32", aligned16=True, readonly=True),
                         A.PointerParam("y", "f32", aligned16=True, readonly=True),
                         A.PointerParam("out", "f32", aligned16=True), A.ScalarParam("alpha", "f32"),
                         A.ScalarParam("n", "i32")), kernel_name="axpy")


def axpy_launcher(**kw) -> Launcher:
    kw.setdefault("num_warps", 4)
    return Launcher(kernel("axpy"), AXPY_SPEC, **kw)


def axpy_inputs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


def check_axpy(out, x, y, alpha):
    ref = alpha * x.astype(np.float64) + y.astype(np.float64)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def grid_for(n: int, block: int = 128) -> int:
    return (n + block - 1) // block


class CaiView:
    """A view of a DeviceBuffer through ``__cuda_array_interface__`` only (as Numba would see it)."""

    def __init__(self, buf, offset=0, shape=None, strides=None, typestr="<f4", stream=None):
        self.buf = buf
        self.__cuda_array_interface__ = {"shape": shape or buf.shape, "typestr": typestr,
                                         "data": (buf.ptr + offset, False), "version": 3,
                                         "strides": strides, "stream": stream}


class DLPackView:
    """A view of a DeviceBuffer through ``__dlpack__`` only (as JAX would export it)."""

    def __init__(self, buf, device_id=None):
        self.buf, self.device_id = buf, device_id

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if self.device_id is None:
            return self.buf.__dlpack__(stream=stream)
        return dlpack.export_capsule(self.buf.ptr, self.buf.shape, self.buf.dtype, dlpack.DEVICE_CUDA,
                                     self.device_id, owner=self.buf)

    def __dlpack_device__(self):
        kind, ordinal = self.buf.__dlpack_device__()
        return kind, self.device_id if self.device_id is not None else ordinal


# ---------------------------------------------------------------------------------------------
# GPU tests


@pytest.mark.gpu
def test_device_info():
    assert runtime.has_gpu() and runtime.device_count() >= 1
    info = runtime.current_device()
    assert info.sm_count > 0 and info.max_threads_per_block == 1024 and info.warp_size == 32
    assert info.max_grid_dims[0] == 2**31 - 1 and info.max_block_dims == (1024, 1024, 64)
    if info.compute_capability >= (9, 0):
        assert info.max_cluster_size == 8 and info.max_shared_per_block_optin >= 227 * 1024
    if "H200" in info.name:
        assert info.compute_capability == (9, 0) and info.sm_count == 132
    print(info)


@pytest.mark.gpu
def test_axpy_with_numpy_arrays():
    n, alpha = 10_007, 0.75
    x, y = axpy_inputs(n, 1)
    x0, y0 = x.copy(), y.copy()
    out = np.full(n, np.nan, dtype=np.float32)
    axpy_launcher()(grid_for(n), (x, y, out, alpha, n))
    check_axpy(out, x, y, alpha)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)


@pytest.mark.gpu
def test_axpy_with_device_buffers_cai_and_dlpack_on_a_stream():
    n, alpha = 4099, -1.25
    x, y = axpy_inputs(n, 2)
    stream = check("cuStreamCreate", driver.cuStreamCreate(0))
    try:
        dx, dy = DeviceBuffer.from_numpy(x), DeviceBuffer.from_numpy(y)
        launcher = axpy_launcher()
        for wrap in (lambda b: b, CaiView, DLPackView):
            dout = DeviceBuffer.empty((n,), "f32")
            dout.fill_byte(0xFF)  # NaN
            launcher(grid_for(n), (wrap(dx), wrap(dy), wrap(dout), alpha, n), stream=int(stream))
            check_axpy(dout.copy_to_host(stream=int(stream)), x, y, alpha)
    finally:
        check("cuStreamDestroy", driver.cuStreamDestroy(stream))


@pytest.mark.gpu
def test_axpy_with_torch_tensors():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    n, alpha = 3001, 2.5
    x, y = axpy_inputs(n, 3)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    tout = torch.full((n,), float("nan"), device="cuda")
    axpy_launcher()(grid_for(n), (tx, ty, tout, alpha, n), stream=torch.cuda.current_stream())
    check_axpy(tout.cpu().numpy(), x, y, alpha)
    cpu_out = torch.full((n,), float("nan"))  # CPU tensors are copied in and out, like numpy
    axpy_launcher()(grid_for(n), (torch.from_numpy(x), torch.from_numpy(y), cpu_out, alpha, n))
    check_axpy(cpu_out.numpy(), x, y, alpha)
    # bf16 torch tensors (which have no __cuda_array_interface__) through the torch fast path.
    bits = np.random.default_rng(4).integers(0, 2**16, size=777, dtype=np.uint16)
    src = torch.from_numpy(bits.view(np.int16)).cuda().view(torch.bfloat16)
    dst = torch.zeros_like(src)
    spec = A.ParamSpec((A.PointerParam("src", "bf16"), A.PointerParam("dst", "bf16"), A.ScalarParam("n", "i32")))
    Launcher(kernel("copy16"), spec, num_warps=4)(grid_for(777), (src, dst, 777))
    torch.cuda.synchronize()
    assert np.array_equal(dst.view(torch.int16).cpu().numpy().view(np.uint16), bits)
    shared = torch.from_dlpack(DeviceBuffer.from_numpy(x))  # our export, consumed by torch
    assert torch.equal(shared.cpu(), torch.from_numpy(x))


@pytest.mark.gpu
def test_axpy_with_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    n, alpha = 2049, 0.5
    x, y = axpy_inputs(n, 5)
    cx, cy = cupy.asarray(x), cupy.asarray(y)
    cout = cupy.full((n,), cupy.nan, dtype=cupy.float32)
    axpy_launcher()(grid_for(n), (cx, cy, cout, alpha, n), stream=cupy.cuda.get_current_stream())
    check_axpy(cupy.asnumpy(cout), x, y, alpha)


@pytest.mark.gpu
def test_bf16_host_arrays_through_ml_dtypes():
    values = np.random.default_rng(6).standard_normal(513).astype(ml_dtypes.bfloat16)
    out = np.full(513, np.nan, dtype=ml_dtypes.bfloat16)
    spec = A.ParamSpec((A.PointerParam("src", "bf16"), A.PointerParam("dst", "bf16"), A.ScalarParam("n", "i32")))
    Launcher(kernel("copy16"), spec, num_warps=2)(grid_for(513, 64), (values, out, 513))
    assert np.array_equal(out.view(np.uint16), values.view(np.uint16))


@pytest.mark.gpu
def test_every_scalar_kind_reaches_the_kernel_bit_exactly():
    names = ["u8", "u16", "i64", "f16", "bf16", "f64", "u32", "bool"]
    spec = A.ParamSpec((A.PointerParam("out", "u64"), *(A.ScalarParam(f"s{i}", n) for i, n in enumerate(names))))
    rng = np.random.default_rng(7)
    values = [int(rng.integers(0, 256)), int(rng.integers(0, 2**16)), -int(rng.integers(1, 2**62)),
              float(rng.standard_normal()), float(rng.standard_normal()), float(rng.standard_normal()) * 1e200,
              int(rng.integers(0, 2**32)), True]
    out = np.full(8, 0xDEADBEEFDEADBEEF, dtype=np.uint64)
    Launcher(kernel("scalars"), spec, num_warps=1)(1, (out, *values))
    expected = [int.from_bytes(np.array(v, dtype=A.numpy_dtype(n)).tobytes(), "little")
                for n, v in zip(names, values)]
    assert out.tolist() == expected


@pytest.mark.gpu
def test_derived_length_parameter():
    spec = A.ParamSpec((A.PointerParam("x", "f32"), A.PointerParam("y", "f32"), A.PointerParam("out", "f32"),
                        A.ScalarParam("alpha", "f32"), A.DerivedParam("n", "x", "shape", 0)))
    n = 1500
    x, y = axpy_inputs(n, 8)
    out = np.full(n, np.nan, dtype=np.float32)
    Launcher(kernel("axpy"), spec, num_warps=4)(grid_for(n), (x, y, out, 3.0))
    check_axpy(out, x, y, 3.0)


@pytest.mark.gpu
def test_dynamic_shared_memory_above_48_kb():
    nbytes = 200 * 1024
    nwords = nbytes // 4
    fn = kernel("reverse_smem")
    spec = A.ParamSpec((A.PointerParam("out", "u32"), A.ScalarParam("nwords", "u32")))
    out = DeviceBuffer.empty((nwords,), "u32")
    out.fill_byte(0xAB)
    Launcher(fn, spec, num_warps=8, dynamic_shared=nbytes)(1, (out, nwords))
    assert np.array_equal(out.copy_to_host(), np.arange(nwords, dtype=np.uint32)[::-1])
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert check("cuFuncGetAttribute", driver.cuFuncGetAttribute(attr, fn.handle)) >= nbytes
    # Without the opt-in the same launch is refused by the driver: the attribute was needed.
    fresh = runtime.load_module(link(REVERSE_SMEM, device_arch())).function("reverse_smem")
    params = A.ParamBuffer(A.layout_slots([(8, 8), (4, 4)]))
    struct.pack_into("<QI", params.view, 0, out.ptr, 16)  # harmless even if it did run
    err = driver.cuLaunchKernel(fresh.handle, 1, 1, 1, 256, 1, 1, nbytes, 0, params.address, 0)[0]
    assert err != driver.CUresult.CUDA_SUCCESS


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [2, 4])
def test_cluster_launch(cluster):
    blocks = 16
    out = DeviceBuffer.empty((blocks, 3), "u32")
    out.fill_byte(0xFF)
    spec = A.ParamSpec((A.PointerParam("out", "u32"),))
    Launcher(kernel("cluster_ids"), spec, num_warps=1, cluster=(cluster, 1, 1))(blocks, (out,))
    ids = out.copy_to_host()
    b = np.arange(blocks)
    assert ids[:, 0].tolist() == (b % cluster).tolist()
    assert ids[:, 1].tolist() == [cluster] * blocks
    assert ids[:, 2].tolist() == (b // cluster).tolist()


TMA_SPEC_ARGS = (A.PointerParam("out", "u16"), A.ScalarParam("c0", "i32"), A.ScalarParam("c1", "i32"),
                 A.ScalarParam("nbytes", "u32"))


def expected_box(g: np.ndarray, c1: int, c0: int, rows: int, cols: int) -> np.ndarray:
    """The box at (c1, c0) with out-of-bounds elements read as zero."""
    box = np.zeros((rows, cols), dtype=g.dtype)
    r0, r1 = max(c1, 0), min(c1 + rows, g.shape[0])
    k0, k1 = max(c0, 0), min(c0 + cols, g.shape[1])
    if r0 < r1 and k0 < k1:
        box[r0 - c1:r1 - c1, k0 - c0:k1 - c0] = g[r0:r1, k0:k1]
    return box


def swizzle_128b(box: np.ndarray) -> np.ndarray:
    """docs/hardware.md §5.3: 16-byte chunk j of row r lands at chunk j ^ (r % 8)."""
    rows = box.shape[0]
    chunks = box.reshape(rows, -1, 8)  # 8 x u16 = 16 bytes
    out = np.empty_like(chunks)
    for r in range(rows):
        for j in range(chunks.shape[1]):
            out[r, j ^ (r % 8)] = chunks[r, j]
    return out.reshape(box.shape)


@pytest.mark.gpu
@pytest.mark.parametrize("swizzle", [Swizzle.NONE, Swizzle.B128])
@pytest.mark.parametrize("c1,c0", [(32, 64), (96, 0), (0, -16)])
def test_tma_load_with_the_encoded_tensor_map(swizzle, c1, c0):
    rng = np.random.default_rng(9)
    g_bits = rng.integers(0, 2**16, size=(128, 128), dtype=np.uint16)
    spec = A.ParamSpec((TensorMapParam("g", "f16", (64, 64), swizzle=swizzle, readonly=True), *TMA_SPEC_ARGS))
    launcher = Launcher(kernel("tma_load_2d"), spec, num_warps=4)
    out = DeviceBuffer.empty((64, 64), "u16")
    out.fill_byte(0xEE)
    g = DeviceBuffer.from_numpy(g_bits.view(np.float16))
    launcher(1, (g, out, c0, c1, 64 * 64 * 2))
    box = expected_box(g_bits, c1, c0, 64, 64)
    want = box if swizzle == Swizzle.NONE else swizzle_128b(box)
    assert np.array_equal(out.copy_to_host(), want)
    host_out = np.zeros((64, 64), dtype=np.uint16)
    launcher(1, (g_bits.view(np.float16), host_out, c0, c1, 64 * 64 * 2))  # host global: copied
    assert np.array_equal(host_out, want)


@pytest.mark.gpu
def test_tma_load_with_a_map_derived_from_an_array_argument():
    # What the code generator emits for tensor[f16, 2]: the caller passes the array, the kernel
    # receives only the tensor map built from it.
    rng = np.random.default_rng(12)
    g_bits = rng.integers(0, 2**16, size=(256, 64), dtype=np.uint16)
    spec = A.ParamSpec((A.ArrayParam("g", "f16", readonly=True),
                        TensorMapParam("g.tmap0", "f16", (64, 64), swizzle=Swizzle.B128, source="g"),
                        *TMA_SPEC_ARGS))
    out = np.zeros((64, 64), dtype=np.uint16)
    Launcher(kernel("tma_load_2d"), spec, num_warps=4)(1, (g_bits.view(np.float16), out, 0, 200, 8192))
    assert np.array_equal(out, swizzle_128b(expected_box(g_bits, 200, 0, 64, 64)))


@pytest.mark.gpu
def test_tma_load_with_a_prebuilt_strided_map():
    rng = np.random.default_rng(10)
    wide = rng.integers(0, 2**16, size=(128, 192), dtype=np.uint16)
    buf = DeviceBuffer.from_numpy(wide.view(np.float16))
    # The left 128 columns of a 128 x 192 array: row stride 384 bytes, not the row length.
    tspec = TensorMapSpec("f16", (128, 128), (384, 2), (32, 64))
    data = encode_tensor_map(tspec, buf.ptr)
    assert len(data) == 128 and any(data)
    tmap = make_tensor_map(tspec, buf.ptr, owner=buf)
    assert tmap.data == data
    spec = A.ParamSpec((TensorMapParam("g", "f16", (32, 64)), *TMA_SPEC_ARGS))
    out = DeviceBuffer.empty((32, 64), "u16")
    out.fill_byte(0xEE)
    Launcher(kernel("tma_load_2d"), spec, num_warps=4)(1, (tmap, out, 96, 64, 32 * 64 * 2))
    assert np.array_equal(out.copy_to_host(), expected_box(wide[:, :128], 64, 96, 32, 64))


@pytest.mark.gpu
def test_producer_stream_is_waited_for():
    n = 1 << 20
    stream = check("cuStreamCreate", driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
    try:
        x, y, out = (DeviceBuffer.empty((n,), "f32") for _ in range(3))
        for buf in (x, y, out):
            buf.fill_byte(0)
        one = int(np.float32(1.0).view(np.uint32))
        check("cuMemsetD32Async", driver.cuMemsetD32Async(x.ptr, one, n, stream))
        check("cuMemsetD32Async", driver.cuMemsetD32Async(y.ptr, one, n, stream))
        axpy_launcher()(grid_for(n), (CaiView(x, stream=int(stream)), CaiView(y, stream=int(stream)), out, 2.0, n))
        assert (out.copy_to_host() == 3.0).all()
    finally:
        check("cuStreamDestroy", driver.cuStreamDestroy(stream))


@pytest.mark.gpu
def test_measure_launch_overhead():
    result = runtime.measure_launch_overhead(300)
    print(result)
    for value in (result.driver_us, result.launcher_int_us, result.launcher_buffer_us):
        assert math.isfinite(value) and 0 < value < 1000
    # (no ratio to driver_us: that is cuLaunchKernel through cuda-python's binding, while the launcher
    # launches natively, so on a slow host it is well below the "driver" figure: 6.3 against 18.2 us on
    # an H100 host)


def _raises(code, fn):
    with pytest.raises(LaunchError) as exc:
        fn()
    assert exc.value.code == code, str(exc.value)
    return exc.value


@pytest.mark.gpu
def test_every_bad_launch_is_a_clear_error():
    n = 256
    launcher = axpy_launcher()
    x, y = (DeviceBuffer.from_numpy(a) for a in axpy_inputs(n, 11))
    out = DeviceBuffer.empty((n,), "f32")
    good = (x, y, out, 1.0, n)
    launcher(2, good)  # the baseline works
    half = DeviceBuffer.empty((n,), "f16")
    e = _raises(A.ARG_DTYPE, lambda: launcher(2, (half, y, out, 1.0, n)))
    assert "expects a pointer to f32, got a f16 DeviceBuffer" in str(e)
    _raises(A.ARG_ALIGNMENT, lambda: launcher(2, (CaiView(x, offset=4, shape=(n - 1,)), y, out, 1.0, n)))
    _raises(A.ARG_COUNT, lambda: launcher(2, good[:4]))
    _raises(A.ARG_COUNT, lambda: launcher(2, (*good, 1)))
    _raises(A.ARG_KEYWORD, lambda: launcher(2, good, {"beta": 1}))
    _raises(A.GRID, lambda: launcher(-1, good))
    launcher(0, good)  # an empty grid is no error: it launches nothing (docs/language.md)
    _raises(A.GRID, lambda: launcher((1, 70000), good))
    _raises(A.BLOCK, lambda: axpy_launcher(num_warps=33))
    _raises(A.SHARED_MEMORY, lambda: axpy_launcher(dynamic_shared=300 * 1024))
    _raises(A.CLUSTER, lambda: axpy_launcher(cluster=(16, 1, 1)))
    _raises(A.CLUSTER, lambda: axpy_launcher(cluster=(2, 1, 1))(3, good))
    _raises(A.ARG_HOST_MEMORY, lambda: axpy_launcher(allow_host_copies=False)(2, (np.zeros(n, np.float32),
                                                                                 y, out, 1.0, n)))
    _raises(A.ARG_CONTIGUOUS, lambda: launcher(2, (CaiView(x, shape=(n // 2,), strides=(8,)), y, out, 1.0, n)))
    _raises(A.ARG_DEVICE, lambda: launcher(2, (DLPackView(x, device_id=x.device + 1), y, out, 1.0, n)))
    _raises(A.ARG_RANGE, lambda: launcher(2, (x, y, out, 1.0, 2**31)))
    _raises(A.ARG_RANGE, lambda: launcher(2, (x, y, out, 1e39, n)))
    _raises(A.ARG_KIND, lambda: launcher(2, (x, y, out, "1.0", n)))
    _raises(A.STREAM, lambda: launcher(2, good, stream="default"))
    frozen = np.zeros(n, np.float32)
    frozen.flags.writeable = False
    _raises(A.READ_ONLY, lambda: launcher(2, (x, y, frozen, 1.0, n)))
    _raises(A.KERNEL_NOT_FOUND, lambda: kernel("axpy").module.function("nope"))
    const_spec = A.ParamSpec((*AXPY_SPEC.params, A.ConstexprParam("BLOCK", 128)))
    _raises(A.CONSTEXPR, lambda: Launcher(kernel("axpy"), const_spec)(2, (*good, 64)))
    tm_spec = A.ParamSpec((TensorMapParam("g", "f16", (64, 300)), *TMA_SPEC_ARGS))
    g = DeviceBuffer.empty((128, 512), "f16")
    _raises(A.TENSOR_MAP, lambda: Launcher(kernel("tma_load_2d"), tm_spec)(1, (g, out, 0, 0, 16)))
    e = _raises(A.DRIVER, lambda: runtime.load_module(b"\x7fELF" + b"\0" * 60))
    assert "cuModuleLoadData failed" in str(e)
    e = _raises(A.DRIVER, lambda: DeviceBuffer(1 << 50))
    assert "CUDA_ERROR_OUT_OF_MEMORY" in str(e)
    launcher(2, good)  # nothing above broke the context
    runtime.synchronize()


@pytest.mark.gpu
def test_param_buffer_pointer_array_is_what_the_driver_reads():
    # The void* array form of kernelParams, checked against a launch that reads every slot.
    out = np.zeros(8, dtype=np.uint64)
    spec = A.ParamSpec((A.PointerParam("out", "u64"), *(A.ScalarParam(f"s{i}", t) for i, t in
                       enumerate(["u8", "u16", "i64", "f16", "bf16", "f64", "u32", "bool"]))))
    launcher = Launcher(kernel("scalars"), spec, num_warps=1)
    launcher(1, (out, 1, 2, 3, 0.5, 0.25, 0.125, 5, False))
    slots = (ctypes.c_void_p * 9).from_address(launcher._buffer.address)
    assert ctypes.string_at(slots[3], 8) == np.int64(3).tobytes()
    assert out.tolist() == [1, 2, 3, 0x3800, 0x3E80, int(np.float64(0.125).view(np.uint64)), 5, 0]
