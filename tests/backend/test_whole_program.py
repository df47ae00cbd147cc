"""backend/toolchain/whole_program.py: kernels with register budgets (``setmaxnreg``) are assembled by
a whole-program ptxas when one is configured, else by nvJitLink with warning SP0612; the choice of
ptxas (SPARSILE_PTXAS, the nvidia-cuda-nvcc wheel, never PATH by itself) and SP0613."""

from __future__ import annotations

import re
import warnings

import pytest

import sparsile as sp
from sparsile.backend.toolchain import linker as K
from sparsile.backend.toolchain import whole_program as W
from sparsile.driver import cache
from sparsile.frontend.diagnostics import CompileError

BUDGETS = """\
def produce(bar):
    mbarrier.arrive(bar[0], per="warpgroup")


def consume(bar):
    mbarrier.arrive(bar[0], per="warpgroup")


@kernel(num_warps=8)
def k(C: ptr[f32]):
    bar = mbarrier.alloc(1, 2)
    warp_specialize(partition(produce, bar, warps=4, regs=40), partition(consume, bar, warps=4, regs=232))
"""


def _ptx() -> str:
    kernel = sp.loads(BUDGETS, "budgets.spk").kernels["k"]
    return kernel.compile(target="sm_90a", stop_after="ptx", cache=False).ptx


@pytest.fixture
def no_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(W, "_wheel_ptxas", lambda: None)


def test_budgets_reach_the_ptx() -> None:
    ptx = _ptx()
    assert W.needs_whole_program(ptx)
    budgets = sorted(int(m) for m in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert budgets == [40, 232]
    assert ".minnctapersm 1" in ptx  # whole-program ptxas needs the register count at entry


def test_without_a_ptxas_nvjitlink_assembles_with_a_warning(monkeypatch, no_wheel) -> None:
    monkeypatch.setenv(W.ENV_PTXAS, "0")
    with pytest.warns(W.RegisterBudgetWarning, match=r"warning\[SP0612\]: k.ptx: the register budgets") as caught:
        linked = K.ptx_to_cubin(_ptx(), _sm90(), name="k.ptx")
    # the help installs the ptxas extra as README.md installs sparsile: from the checkout
    assert str(caught[0].message).endswith(
        " help: install nvidia-cuda-nvcc>=13.0: `pip install -e '.[ptxas]'` in the sparsile checkout, or "
        "`pip install 'nvidia-cuda-nvcc>=13.0'`, whose ptxas assembles it whole-program (or set "
        "SPARSILE_PTXAS=/path/to/ptxas)")
    assert K.is_cuda_elf(linked.cubin) and "C7504" in linked.info_log
    monkeypatch.delenv(W.ENV_PTXAS)
    assert W.whole_program_ptxas() is None  # no wheel, and a ptxas on PATH is not taken by itself


def _sm90():
    from sparsile.target.targets import get_target

    return get_target("sm_90a")


def test_a_kernel_without_budgets_never_warns(monkeypatch, no_wheel) -> None:
    kernel = sp.loads(BUDGETS.replace(", regs=40", "").replace(", regs=232", ""), "plain.spk").kernels["k"]
    ptx = kernel.compile(target="sm_90a", stop_after="ptx", cache=False).ptx
    assert not W.needs_whole_program(ptx)
    with warnings.catch_warnings():
        warnings.simplefilter("error", W.RegisterBudgetWarning)
        K.ptx_to_cubin(ptx, _sm90())


def test_a_bad_ptxas_path_is_sp0613(monkeypatch) -> None:
    monkeypatch.setenv(W.ENV_PTXAS, "/nowhere/ptxas")
    with pytest.raises(CompileError) as exc:
        K.ptx_to_cubin(_ptx(), _sm90())
    assert exc.value.code == "SP0613" and "SPARSILE_PTXAS=/nowhere/ptxas is not an executable ptxas" in str(exc.value)
    assert W.identity() == "invalid"


def test_the_cache_key_names_the_assembler(monkeypatch, no_wheel) -> None:
    monkeypatch.setenv(W.ENV_PTXAS, "0")
    assert W.identity() == "none"
    cache.toolchain_versions.cache_clear()
    try:
        assert cache.toolchain_versions()["ptxas"] == "none"
    finally:
        cache.toolchain_versions.cache_clear()


@pytest.mark.skipif(not K.ptxas_available(), reason="no ptxas here (pip install -e '.[ptxas]' brings one)")
def test_a_configured_ptxas_keeps_the_budgets(monkeypatch) -> None:
    monkeypatch.setenv(W.ENV_PTXAS, K.ptxas_path())
    with warnings.catch_warnings():
        warnings.simplefilter("error", W.RegisterBudgetWarning)
        linked = K.ptx_to_cubin(_ptx(), _sm90(), name="k.ptx")
    assert K.is_cuda_elf(linked.cubin) and K.elf_sm_arch(linked.cubin) == 90
    assert "C7504" not in linked.info_log and "C7508" not in linked.info_log
    sass = K.nvdisasm_sass(linked.cubin)
    if sass is None:
        pytest.skip("nvdisasm is not installed")
    assert sass.count("USETMAXREG") == 2  # both budgets (below the 255 registers at entry: two releases)


def test_a_rejected_ptx_is_sp0610(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho 'ptxas fatal   : broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(W.ENV_PTXAS, str(fake))
    with pytest.raises(CompileError) as exc:
        K.ptx_to_cubin(_ptx(), _sm90(), name="k.ptx")
    assert exc.value.code == "SP0610" and "could not turn k.ptx into a cubin for sm_90a" in str(exc.value)
    assert "ptxas fatal   : broken" in str(exc.value)
