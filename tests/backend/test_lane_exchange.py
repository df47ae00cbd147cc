"""The lane exchange of wgmma-accumulator stores (backend/lower/lane_exchange.py): 16-byte stores
where axis analysis proves them aligned and contiguous, the layout's own 4-byte runs where it does
not, and the switch that turns it off (keyed by the compile cache). The GPU tests of the sparse
GEMM (tests/gpu/test_sparse_gemm_sm90.py, float64 with C poisoned) check the stored values."""

from __future__ import annotations

import re

import pytest

import sparsile as sp
from sparsile.backend.lower import lane_exchange
from sparsile.driver.cache import make_key
from sparsile.frontend.sema.core import ArgSpec
from sparsile.tests.support import compile_stdlib, signature, stdlib_module


def _stores(ptx: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in re.findall(r"st\.global[.\w]*", ptx):
        out[s] = out.get(s, 0) + 1
    return out


def test_the_accumulator_is_stored_16_bytes_at_a_time_after_the_exchange() -> None:
    """A consumer thread of the bf16 GEMM holds 128 accumulator values of a 128 x 256 tile: 16
    stores of 8 f16 each (was 64 of 2), after 4 shuffles per 16 bytes."""
    ptx = compile_stdlib("sparse_gemm_sm90.spk", "sparse_gemm_bf16", "sm_90a", stop_after="ptx").ptx
    assert _stores(ptx) == {"st.global.v4.b32": 16}
    assert ptx.count("shfl.sync.bfly.b32") == 64


def test_the_split_k_partials_are_stored_16_bytes_at_a_time_after_one_round() -> None:
    """f32 partial sums: a thread's own run is 8 bytes; exchanging lane bit 0 with the register bit
    above both lane bits gives 4 adjacent f32 (16 bytes): 32 stores per thread instead of 64, after
    one shuffle round (two 32-bit words per exchanged run)."""
    ptx = compile_stdlib("sparse_gemm_sm90.spk", "sparse_gemm_bf16_splitk", "sm_90a", stop_after="ptx").ptx
    assert _stores(ptx) == {"st.global.v4.b32": 32}
    rounds = re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+), 31, -1", ptx)
    assert rounds == ["1"] * 64  # lane ^ 1 only


def test_no_exchange_where_the_rows_are_not_proven_aligned() -> None:
    """With ldc not known to be a multiple of 16, a row's start is only 2-byte aligned: the stores
    keep what the layout alone allows, and no shuffle is emitted."""
    kern = stdlib_module("sparse_gemm_sm90.spk").sparse_gemm_bf16
    sig = signature(kern, aligned=True)
    sig["ldc"] = ArgSpec(sp.i32, False)
    ptx = kern.compile(sig, target="sm_90a", stop_after="ptx", cache=False).ptx
    assert "shfl.sync" not in ptx and "st.global.v4" not in ptx and _stores(ptx)


def test_the_switch_turns_it_off_and_keys_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    def key() -> str:
        return make_key(target="sm_90a", source="src", kernel_name="k")

    on = key()
    monkeypatch.setenv(lane_exchange.ENV_SWITCH, "0")
    assert key() != on
    kern = stdlib_module("sparse_gemm_sm90.spk").sparse_gemm_bf16
    ptx = kern.compile(signature(kern, aligned=True), target="sm_90a", stop_after="ptx", cache=False).ptx
    assert _stores(ptx) == {"st.global.b32": 64} and "shfl.sync" not in ptx


def _plan_for(bases: dict, shape: tuple[int, int], run: int, allowed: int, elem_bytes: int):
    from types import SimpleNamespace

    from sparsile.frontend.ir import types as T
    from sparsile.frontend.layout.layouts import LinearLayout

    layout = LinearLayout.from_bases(bases, [("dim0", shape[0]), ("dim1", shape[1])])
    v = SimpleNamespace(layout=layout, type=T.TileType(T.f16, shape))
    return lane_exchange.exchange_plan(v, v, None, run, allowed, shape[1], elem_bytes)


@pytest.mark.parametrize("other", [{"lane": 2, "basis": (1, 2)}, {"warp": 0, "basis": (16, 8)},
                                   {"reg": 1, "basis": (8, 4)}])
def test_no_exchange_where_another_basis_moves_the_exchanged_columns(other: dict) -> None:
    """Coordinates are XORs of bases: a lane, warp or register basis with a column component below
    the exchanged span (run << (lanes + k)) would move the thread's own first element away from
    where the exchanged block's address assumes it (found by simulating the emitted transpose)."""
    bases = {"reg": [(0, 1), (8, 0), (0, 8), (0, 16)], "lane": [(0, 2), (0, 4), (1, 0), (2, 0), (4, 0)],
             "warp": [(16, 0), (32, 0)]}
    assert _plan_for(bases, (64, 32), 2, 8, 2) is not None
    name = next(k for k in other if k != "basis")
    bases[name][other[name]] = other["basis"]
    assert _plan_for(bases, (64, 32), 2, 8, 2) is None


F64_COPY = """
@kernel(num_warps=4)
def k(X: ptr[f64], Y: ptr[f64]):
    r = arange(0, 16)
    c = arange(0, 128)
    store(Y + r[:, None] * 128 + c[None, :], load(X + r[:, None] * 128 + c[None, :]))
"""


def _one_element_per_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import sparsile.frontend.layout.inference as inference

    one = inference.default_blocked
    monkeypatch.setattr(inference, "default_blocked", lambda shape, warps, vec=1: one(shape, warps, 1))


def test_an_8_byte_element_exchanged_from_a_one_element_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """f64 in a layout of one element per thread (lanes along the columns, registers above them),
    with the sector rule lifted: exchange_plan offers k = 1, and the exchanged runs travel as 64-bit
    words (pack_words had no 32-bit packing of an 8-byte element: range(..., 0) raised)."""
    from sparsile.tests.support import compile_src

    _one_element_per_thread(monkeypatch)
    monkeypatch.setattr(lane_exchange, "SECTOR_BYTES", 1 << 20)
    ptx = compile_src(F64_COPY, aligned=True, cache=False).ptx
    assert _stores(ptx) == {"st.global.v2.b64": 8} and ptx.count("shfl.sync.bfly.b32") == 16


def test_no_exchange_where_the_lanes_already_store_whole_sectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same copy as it ships: 32 lanes along a row store 256 bytes of it per instruction, whole
    sectors, so the stores stay as the layout gives them (no shuffles)."""
    from sparsile.tests.support import compile_src

    _one_element_per_thread(monkeypatch)
    ptx = compile_src(F64_COPY, aligned=True, cache=False).ptx
    assert "shfl.sync" not in ptx and _stores(ptx) == {"st.global.b64": 16}
