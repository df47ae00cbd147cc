"""The ctypes nvJitLink binding against cuda-python's binding of the same library."""

from __future__ import annotations

import pytest

from sparsile.backend.toolchain import nvjitlink

PTX = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry scale(.param .u64 p, .param .f32 s)
{
    .reg .b64 %rd<3>;
    .reg .f32 %f<3>;
    .reg .b32 %r<3>;
    ld.param.u64 %rd1, [p];
    ld.param.f32 %f1, [s];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd1, %rd1, %rd2;
    ld.global.f32 %f2, [%rd1];
    mul.f32 %f2, %f2, %f1;
    st.global.f32 [%rd1], %f2;
    ret;
}
"""


def _cuda_python_link(ptx: bytes, options: list[str]) -> bytes:
    from cuda.bindings import nvjitlink as ref

    handle = ref.create(len(options), options)
    try:
        ref.add_data(handle, ref.InputType.PTX, ptx, len(ptx), "k.ptx")
        ref.complete(handle)
        cubin = bytearray(ref.get_linked_cubin_size(handle))
        ref.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    finally:
        ref.destroy(handle)


def test_library_loads_from_the_wheel():
    lib = nvjitlink.library()
    assert nvjitlink.library_file() == lib.path
    major, minor = lib.version()
    assert major >= 13 and minor >= 0


def test_version_matches_cuda_python():
    ref = pytest.importorskip("cuda.bindings.nvjitlink")
    assert nvjitlink.library().version() == tuple(ref.version())


@pytest.mark.parametrize("options", [["-arch=sm_90a", "-O3"], ["-arch=sm_80", "-O0", "-verbose"]])
def test_cubin_is_byte_identical_to_cuda_pythons(options):
    pytest.importorskip("cuda.bindings.nvjitlink")
    ptx = PTX.replace("sm_90a", options[0].removeprefix("-arch=")).encode()
    ours = nvjitlink.library().link_ptx(ptx, options, "k.ptx")
    assert ours.cubin[:4] == b"\x7fELF"
    assert ours.cubin == _cuda_python_link(ptx, options)
    if "-verbose" in options:
        assert "scale" in ours.info_log and "registers" in ours.info_log


def test_bad_ptx_reports_the_error_log():
    bad = PTX.replace("mul.f32 %f2, %f2, %f1;", "mul.f32 %f2, %f2, %f9;").encode()
    with pytest.raises(nvjitlink.NvJitLinkError) as info:
        nvjitlink.library().link_ptx(bad, ["-arch=sm_90a"], "bad.ptx")
    assert info.value.call == "nvJitLinkAddData"  # nvJitLink assembles PTX as it is added
    assert info.value.result == 4 and "ERROR_PTX_COMPILE" in str(info.value)
    assert "%f9" in info.value.log


def test_unknown_option_fails_at_create():
    with pytest.raises(nvjitlink.NvJitLinkError) as info:
        nvjitlink.library().link_ptx(PTX.encode(), ["-arch=sm_90a", "-no-such-option"])
    assert info.value.call == "nvJitLinkCreate"
    assert info.value.result != 0


def test_env_override_to_a_non_library(monkeypatch, tmp_path):
    bogus = tmp_path / "libnvJitLink.so"
    bogus.write_bytes(b"not an ELF")
    monkeypatch.setenv(nvjitlink.ENV_LIBRARY, str(bogus))
    assert nvjitlink.library_file() == str(bogus)
    nvjitlink._load.cache_clear()
    try:
        with pytest.raises(nvjitlink.NvJitLinkUnavailable, match=r"libnvJitLink\.so"):
            nvjitlink.library()
    finally:
        nvjitlink._load.cache_clear()


def test_without_a_wheel_on_sys_path_cuda_pathfinder_is_asked(monkeypatch):
    pytest.importorskip("cuda.pathfinder")
    monkeypatch.delenv(nvjitlink.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(nvjitlink, "_wheel_candidates", lambda: [])
    asked = []
    real = nvjitlink._pathfinder_path
    monkeypatch.setattr(nvjitlink, "_pathfinder_path", lambda: asked.append(1) or real())
    nvjitlink._load.cache_clear()
    try:
        lib = nvjitlink.library()
    finally:
        nvjitlink._load.cache_clear()
    assert asked == [1]
    assert lib.version()[0] >= nvjitlink.MIN_MAJOR


def test_no_cache_gives_the_same_cubin():
    lib = nvjitlink.library()
    plain = lib.link_ptx(PTX.encode(), ["-arch=sm_90a", "-O3"]).cubin
    assert lib.link_ptx(PTX.encode(), ["-arch=sm_90a", "-O3", "-no-cache"]).cubin == plain
