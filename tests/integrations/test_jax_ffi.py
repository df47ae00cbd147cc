"""The FFI handler of sparsile.jax against call frames built here in C memory, as XLA lays them out
(xla/ffi/api/c_api.h): the CUDA branch (stream, device ordinal, buffers, the plan attribute) without
a GPU, the metadata query, the error path through XLA_FFI_Error_Create, other stages."""

from __future__ import annotations

import ctypes as c
from typing import Any

import pytest

pytest.importorskip("jax")

from sparsile.integrations.jax import JaxCallError, ffi


class Frame:
    """A call frame with one f32 (4, 8) argument, one bf16 (3,) result and ``sparsile_plan``."""

    def __init__(self, plan: int, stage: int = 3, extension: int = 0):
        self.calls: dict[str, Any] = {}
        self.dims_in, self.dims_out = (c.c_int64 * 2)(4, 8), (c.c_int64 * 1)(3)
        self.buf_in = ffi._Buffer(c.sizeof(ffi._Buffer), None, 11, 0xDEAD00, 2, c.addressof(self.dims_in))
        self.buf_out = ffi._Buffer(c.sizeof(ffi._Buffer), None, 16, 0xBEEF00, 1, c.addressof(self.dims_out))
        self.in_items = (c.c_void_p * 1)(c.addressof(self.buf_in))
        self.out_items = (c.c_void_p * 1)(c.addressof(self.buf_out))
        self.name = c.create_string_buffer(b"sparsile_plan")
        self.span = (c.c_uint64 * 2)(c.addressof(self.name), len(b"sparsile_plan"))
        self.value = c.c_int64(plan)
        self.scalar = ffi._Scalar(5, c.addressof(self.value))
        self.names = (c.c_void_p * 1)(c.addressof(self.span))
        self.attrs = (c.c_void_p * 1)(c.addressof(self.scalar))

        def error_create(args: Any) -> int:
            self.calls["error"] = (args.contents.message.decode(), args.contents.errc)
            return 0xE770

        def stream_get(args: Any) -> int:
            self.calls["stream_ctx"] = args.contents.ctx
            args.contents.stream = 0x5100
            return 0

        def ordinal_get(args: Any) -> int:
            args.contents.device_ordinal = 1
            return 0

        self.callbacks = (ffi._ERROR_CREATE(error_create), ffi._STREAM_GET(stream_get), ffi._ORDINAL_GET(ordinal_get))
        self.api = ffi._Api(struct_size=c.sizeof(ffi._Api))
        for field, fn in zip(("Error_Create", "Stream_Get", "DeviceOrdinal_Get"), self.callbacks):
            setattr(self.api, field, c.cast(fn, c.c_void_p).value)
        self.frame = ffi._CallFrame(
            c.sizeof(ffi._CallFrame), extension or None, c.addressof(self.api), 0xC7, stage,
            ffi._List(c.sizeof(ffi._List), None, 1, None, c.addressof(self.in_items)),
            ffi._List(c.sizeof(ffi._List), None, 1, None, c.addressof(self.out_items)),
            ffi._Attrs(c.sizeof(ffi._Attrs), None, 1, None, c.addressof(self.names), c.addressof(self.attrs)), None)

    def call(self, platform: str = "cuda") -> Any:
        ffi._apis.pop(c.addressof(self.api), None)  # a fresh API table for each frame
        return ffi._make_handler(platform)(c.addressof(self.frame))


class Recorder:
    def __init__(self, fail: bool = False):
        self.fail, self.seen = fail, []

    def run_cuda(self, ins: list, outs: list, stream: int, ordinal: int) -> None:
        self.seen.append(([(b.ptr, b.dtype, b.shape) for b in ins], [(b.ptr, b.dtype, b.shape) for b in outs],
                          stream, ordinal))
        if self.fail:
            raise JaxCallError("SP0938", "a planned failure", located=False)


def test_cuda_branch_decodes_buffers_stream_and_device() -> None:
    plan = Recorder()
    f = Frame(ffi.add_plan(plan))
    assert f.call() is None
    assert plan.seen == [([(0xDEAD00, "float32", (4, 8))], [(0xBEEF00, "bfloat16", (3,))], 0x5100, 1)]
    assert f.calls["stream_ctx"] == 0xC7 and "error" not in f.calls


def test_errors_go_back_through_xla_ffi_error_create() -> None:
    f = Frame(ffi.add_plan(Recorder(fail=True)))
    assert f.call() == 0xE770
    message, errc = f.calls["error"]
    assert errc == 13  # XLA_FFI_Error_Code_INTERNAL
    assert message == ("error[SP0936]: a sparsile kernel call failed while XLA ran it\n"
                       "error[SP0938]: a planned failure")


def test_unknown_plan_is_an_error_not_a_crash() -> None:
    f = Frame(10**9)
    assert f.call() == 0xE770
    assert f.calls["error"][0].startswith("error[SP0936]: a sparsile kernel call failed while XLA ran it\n")


def test_other_stages_do_nothing() -> None:
    plan = Recorder()
    assert Frame(ffi.add_plan(plan), stage=0).call() is None
    assert plan.seen == []


def test_metadata_query_answers_the_jaxlib_api_version() -> None:
    metadata = ffi._Metadata(c.sizeof(ffi._Metadata))
    ext = ffi._MetadataExtension(ffi._ExtensionBase(c.sizeof(ffi._MetadataExtension), 1, None), c.pointer(metadata))
    plan = Recorder()
    assert Frame(ffi.add_plan(plan), extension=c.addressof(ext)).call() is None
    assert (metadata.api_version.major_version, metadata.api_version.minor_version) == ffi.api_version()
    assert metadata.traits == 0 and plan.seen == []


def test_struct_layouts_match_c_api_h() -> None:
    """Sizes and offsets of the 64-bit layouts of c_api.h (the handler reads them in place)."""
    assert c.sizeof(ffi._CallFrame) == 176 and ffi._CallFrame.args.offset == 40 and ffi._CallFrame.attrs.offset == 120
    assert c.sizeof(ffi._Buffer) == 48 and ffi._Buffer.data.offset == 24 and ffi._Buffer.dims.offset == 40
    assert ffi._Api.Error_Create.offset == 48 and ffi._Api.Stream_Get.offset == 80
    assert ffi._Api.DeviceOrdinal_Get.offset == 48 + 17 * 8
