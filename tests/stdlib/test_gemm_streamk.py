"""stdlib/kernels/gemm_streamk.py and sparse_gemm_sm90_streamk.spk: the stream-K sparse GEMM. Its
split of the (tile, K step) units as a property, its configs in the tuner's space and the table,
its launches in the interpreter against float64 with poisoned outputs and workspace (runs that
share tiles, empty runs, ragged M, N and K, odd step counts), its compilation; on the GPU marked."""

from __future__ import annotations

import itertools
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.stdlib.kernels import KERNELS, plan_sparse_matmul
from sparsile.stdlib.kernels.gemm import SparseMatmul
from sparsile.stdlib.kernels.gemm_config import GemmConfig
from sparsile.stdlib.kernels.gemm_streamk import StreamKMatmul, streamk_ctas, streamk_plan, streamk_units
from sparsile.stdlib.kernels.linear import plan_sparse_linear
from sparsile.stdlib.kernels.linear_tuning import layer_space, with_linear_config
from sparsile.stdlib.kernels.tuning import (
    TABLE_FORMAT,
    config_space,
    index_table,
    launch,
    run_with_table,
    table_key,
    with_config,
)
from sparsile.tests.stdlib.test_gemm_api import assert_close, problem, reference


def runs(units: int, ctas: int) -> list[tuple[int, int]]:
    """The kernel's split (``run_of_units``): CTA p's units [p * units // P, (p + 1) * units // P)."""
    return [(p * units // ctas, (p + 1) * units // ctas) for p in range(ctas)]


def owner(u: int, units: int, ctas: int) -> int:
    """The kernel's ``owner``."""
    return ((u + 1) * ctas - 1) // units


@given(tiles=st.integers(1, 60), per_tile=st.integers(1, 40), ctas=st.integers(1, 300))
def test_every_cta_between_a_tiles_owners_reports_a_part(tiles, per_tile, ctas):
    """The runs tile the units in order; a unit's owner holds it; the arrivals a shared tile waits
    for (owner of its last unit - owner of its first + 1) are exactly the CTAs whose tile loop
    visits it with a part (``consumer``: tiles first // per_tile .. cdiv(last, per_tile) - 1, an
    empty run included); each part goes to a workspace tile no other part uses (2 p + j)."""
    units = tiles * per_tile
    split = runs(units, ctas)
    assert split[0][0] == 0 and split[-1][1] == units
    assert all(a[1] == b[0] for a, b in itertools.pairwise(split))
    visits: dict[int, list[int]] = {}
    used = set()
    for p, (first, last) in enumerate(split):
        for u in range(first, last):
            assert owner(u, units, ctas) == p
        for t in range(first // per_tile, -(-last // per_tile)):
            lo, hi = max(first, t * per_tile), min(last, t * per_tile + per_tile)
            if hi - lo != per_tile:
                visits.setdefault(t, []).append(p)
                slot = 2 * p + min(t - first // per_tile, 1)
                assert slot not in used
                used.add(slot)
    for t, ps in visits.items():
        assert ps == list(range(owner(t * per_tile, units, ctas), owner(t * per_tile + per_tile - 1, units, ctas) + 1))


def test_streamk_grid_and_units():
    assert streamk_units(6144, 512, 64, 256, 2) == 48 * 2 * 32
    assert streamk_ctas(3072, 132) == 132 and streamk_ctas(5, 132) == 5
    assert streamk_ctas(2 ** 24, 132) == 0  # (units + 1) x CTAs beyond 32 bits


# dtype, M, N, K, BN, SMs: runs sharing tiles (more units than CTAs), a tile shared by several runs,
# empty runs (more CTAs than units), ragged M / N / K, e4m3 (BK 128, one step a metadata box) with an
# odd step count. 16-bit operands always have an even step count here: their metadata rows are a
# multiple of 4 words (TMA), K a multiple of 128 once padded.
CASES = [
    ("bf16", 700, 40, 512, 64, 3),     # 6 tiles x 4 units on 3 CTAs: 8 units each, tiles shared
    ("f16", 300, 100, 1000, 32, 5),    # 12 tiles x 8 units (16 steps, K ragged) on 5 CTAs
    ("bf16", 130, 24, 512, 32, 7),     # 2 tiles x 4 units on 7 CTAs: runs of one unit, one empty
    ("e4m3", 200, 40, 384, 64, 4),     # 2 tiles x 3 units (odd) on 4 CTAs
    ("e4m3", 520, 48, 1024, 64, 3),    # 5 tiles x 8 units (8 steps of 128, one a box) on 3 CTAs
    ("f16", 128, 16, 256, 16, 9),      # one tile of 2 units on 9 CTAs: 7 runs empty
]


@pytest.mark.parametrize("dtype,m,n,k,bn,sms", CASES)
def test_streamk_matches_float64(dtype, m, n, k, bn, sms):
    weight, b = problem(dtype, m, n, k, seed=m + n + k)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    config = GemmConfig(bn, 4, streamk=True)
    plan = with_config(base, config, sms, interpret=True)
    assert isinstance(plan, StreamKMatmul) and plan.kernel.name.endswith("_streamk")
    steps = -(-plan.plan.k_padded // base.choice.block_k)
    per_tile = -(-steps // (2 if base.choice.block_k == 64 else 1))  # units of MK steps
    assert plan.ctas == min(sms, plan.counters.shape[0] * per_tile)
    ref, absprod = reference(weight, b)
    for _ in range(2):  # the counters are back at zero after each run
        plan.out[...] = np.nan
        plan.workspace[...] = np.nan
        c = launch(plan, config, interpret=True)
        assert c is plan.out
        assert_close(c, ref, absprod, k, dtype)
        assert not plan.counters.any()


def test_the_kernels_32_bit_arithmetic_fits_wherever_the_plan_launches():
    """streamk_ctas admits (units + 1) x CTAs <= 2^31 - 1: every product the kernel forms (p * units,
    (u + 1) * P in ``owner``) is at most units x CTAs. 1045376 x 2048 x 31872 bf16 at 132 SMs is
    admitted with (units + 1) x 132 within 146 of the bound; ``owner``'s old numerator
    (u + 1) P + units - 1 reached units x 133 - 1 there and wrapped."""
    units = streamk_units(1045376, 2048, 31872 // 64, 256, 2)
    ctas = streamk_ctas(units, 132)
    assert ctas == 132 and units * ctas <= 2 ** 31 - 1 < units * (ctas + 1) - 1
    for u in (0, units // 2, units - 1):
        assert owner(u, units, ctas) == max(p for p, (first, _) in enumerate(runs(units, ctas)) if first <= u)


@pytest.fixture
def cta_order_reversed(monkeypatch):
    """The interpreter runs a grid's CTAs one after another in order, so that a tile's last arrival is
    always its highest CTA and a CTA's writes beyond its own tile are overwritten by later CTAs; on the
    GPU they run at once. Reversed, those orders change."""
    import types

    from sparsile.frontend.interp import interpreter

    monkeypatch.setattr(interpreter, "itertools", types.SimpleNamespace(
        product=lambda *ranges: reversed(list(itertools.product(*ranges)))))


@pytest.mark.parametrize("dtype,m,n,k,bn,sms,group_m", [
    ("f16", 339, 61, 240, 16, 13, 2),   # BN 16: fix_up's 32-column windows reached into the next tile
    ("bf16", 700, 100, 512, 32, 7, 16),
    ("e4m3", 520, 48, 1024, 16, 5, 1),
])
def test_streamk_matches_float64_cta_order_reversed(cta_order_reversed, dtype, m, n, k, bn, sms, group_m):
    plan = check_streamk(dtype, m, n, k, GemmConfig(bn, 4, group_m=group_m, streamk=True), sms)
    assert not plan.counters.any()


def check_streamk(dtype: str, m: int, n: int, k: int, config: GemmConfig, sms: int) -> StreamKMatmul:
    """The stream-K launch of ``config`` for a random problem, C and the workspace poisoned, checked
    against float64; its plan."""
    weight, b = problem(dtype, m, n, k, seed=m * n + k)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    plan = with_config(base, config, sms, interpret=True)
    assert isinstance(plan, StreamKMatmul)
    plan.out[...] = np.nan
    plan.workspace[...] = np.nan
    ref, absprod = reference(weight, b)
    assert_close(launch(plan, config, interpret=True), ref, absprod, k, dtype)
    return plan


@settings(max_examples=10, deadline=None)
@given(st.data())
def test_any_streamk_launch_matches_float64(data):
    """Random operand types, ragged shapes, BN, STAGES and SM counts: C as float64 computes it."""
    dtype = data.draw(st.sampled_from(["f16", "bf16", "e4m3"]))
    bn = data.draw(st.sampled_from([16, 32, 64]))
    m, n = data.draw(st.integers(1, 400)), data.draw(st.integers(1, 3 * bn))
    # K whose metadata rows are whole 16-byte pieces (the kernel reads them by TMA): K in (128 j - 32, 128 j]
    k = data.draw(st.integers(1, 8)) * 128 - data.draw(st.sampled_from([0, KERNELS[dtype].k_align]))
    sms, stages = data.draw(st.integers(1, 12)), data.draw(st.sampled_from([2, 3, 4]))
    check_streamk(dtype, m, n, k, GemmConfig(bn, stages, streamk=True), sms)


def test_streamk_applies_only_where_its_kernel_does():
    """No stream-K kernel for s8 / tf32, for metadata words TMA cannot read (17 words a row), or for
    C of another type: the config then runs on the other kernels (a table entry found for them)."""
    for dtype, k in (("s8", 1024), ("tf32", 256), ("f16", 520)):
        weight, b = problem(dtype, 300, 40, k, seed=2)
        base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
        assert streamk_plan(base, 4, interpret=True) is None
        plan = with_config(base, GemmConfig(64, 4, streamk=True), 4, interpret=True)
        assert isinstance(plan, SparseMatmul)
        plan.out[...] = np.nan if plan.out.dtype.kind == "f" else -12345
        ref, absprod = reference(weight, b)
        assert_close(launch(plan, GemmConfig(64, 4, streamk=True), interpret=True), ref, absprod, k, dtype)
    weight, b = problem("bf16", 300, 40, 512, seed=2)
    converting = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm", out_dtype="float32")
    assert streamk_plan(converting, 4, interpret=True) is None


def test_config_space_offers_streamk_where_the_last_wave_is_part_full_when_asked():
    space = config_space(KERNELS["bf16"], 6144, 512, 4096, 132, streamk=True)  # 96 tiles of BN 256: < a wave
    sk = [c for c in space if c.streamk]
    assert {(c.bn, c.stages) for c in sk} == {(256, 4), (256, 5), (128, 4), (128, 5)}
    assert not any(c.streamk for c in config_space(KERNELS["bf16"], 6144, 512, 4096, 132))  # off by default
    assert not any(c.streamk for c in config_space(KERNELS["bf16"], 132 * 128, 256, 4096, 132, streamk=True))
    assert not any(c.streamk for c in config_space(KERNELS["s8"], 6144, 512, 4096, 132, streamk=True))
    assert not any(c.streamk for c in config_space(KERNELS["bf16"], 6144, 512, 4096, 132, tails=False,
                                                   streamk=True))
    assert not any(c.streamk for c in layer_space(KERNELS["bf16"], 6144, 512, 4096, 132))


def test_streamk_config_json_and_checks():
    config = GemmConfig(256, 5, streamk=True)
    assert GemmConfig.from_json(config.to_json()) == config and str(config).endswith("streamk")
    assert "streamk" not in GemmConfig(256).to_json()
    for bad in (dict(split_k=2), dict(pair=True), dict(tail_split=2)):
        with pytest.raises(ValueError, match="streamk takes"):
            GemmConfig(128, streamk=True, **bad)
    weight, x = problem("bf16", 300, 80, 512, seed=1)
    layer = plan_sparse_linear(weight.values, weight.meta, x, interpret=True, num_sms=4, kernel="gemm")
    with pytest.raises(ValueError, match="no stream-K kernel"):
        with_linear_config(layer, GemmConfig(64, 4, streamk=True), 4, interpret=True)


def test_a_table_entry_runs_the_streamk_kernel():
    """sparse_matmul's table lookup (``run_with_table``) with a stream-K entry launches that kernel."""
    weight, b = problem("bf16", 700, 40, 512, seed=5)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    table = {"format": TABLE_FORMAT, "entries": {
        table_key("bf16", 700, 40, 512): {"config": GemmConfig(64, 3, streamk=True).to_json(), "us": 1.0}}}
    assert [c.streamk for _, c in index_table(table["entries"])[("bf16", 700, 512)]] == [True]
    base.out[...] = np.nan
    assert run_with_table(base, table=table, interpret=True, sms=3)
    ref, absprod = reference(weight, b)
    assert_close(base.out, ref, absprod, 512, "bf16")


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_streamk_compiles_for_sm90a_without_spills(dtype, tmp_path):
    weight, b = problem(dtype, 1024, 512, 1024, seed=4)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    plan = streamk_plan(base, 132, interpret=True)
    ck = plan.compile("sm_90a")
    assert "atom.acq_rel.gpu.global.add.s32" in ck.ptx
    if shutil.which("ptxas") is None:
        pytest.skip("ptxas is not installed")
    path = tmp_path / "k.ptx"
    path.write_text(ck.ptx)
    proc = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(path), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in proc.stderr, proc.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k,bn,sms", [
    ("bf16", 6144, 512, 4096, 256, 132),   # 8B qkv at T = 512: 96 tiles on 132 SMs
    ("f16", 1000, 300, 1000, 128, 7),      # ragged, tiles shared by runs on few SMs
    ("e4m3", 2000, 256, 2048, 256, 20),
])
def test_gpu_streamk_matches_float64(dtype, m, n, k, bn, sms):
    torch = pytest.importorskip("torch")
    from sparsile.tests.stdlib.test_linear_api import cuda_copy

    weight, b = problem(dtype, m, n, k, seed=m + n)
    base = plan_sparse_matmul(cuda_copy(np.asarray(weight.values)), weight.meta, cuda_copy(b), kernel="gemm")
    config = GemmConfig(bn, 4, streamk=True)
    plan = with_config(base, config, sms)
    assert isinstance(plan, StreamKMatmul)
    ref, absprod = reference(weight, b)
    for _ in range(3):
        plan.out.fill_(float("nan"))
        plan.workspace.fill_(float("nan"))
        launch(plan, config)
        torch.cuda.synchronize()
        assert_close(plan.out.cpu().numpy(), ref, absprod, k, dtype)
        assert not plan.counters.any()
