"""The tuned-table check of benchmarks/sweep_sparse_gemm.py (``--tuned``, benchmarks/sweep_tuned.py):
every entry of tiny synthetic tables run in the interpreter through the path its readers take,
against float64 with poisoned outputs; a corrupted weight, a perturbed reference, an unwritten
element, an entry that cannot run and invalid entries are failures; the shipped tables parse into
cases whose lookup gives their config; the command line's bounds and its message without a GPU.
The GPU test checks the smallest shipped entries."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from sparsile.stdlib.kernels import decode_tuning as dt
from sparsile.stdlib.kernels.tuning import find, index_table, load_gemm_table
from sparsile.tests.support import load_script

st = load_script("benchmarks/sweep_tuned.py", "sweep_tuned", register=True)  # dataclasses look their module up
sweep = load_script("benchmarks/sweep_sparse_gemm.py", "sweep_sparse_gemm_script")


def gemm_entry(bn: int, stages: int, split_k: int, pair: bool = False) -> dict[str, Any]:
    return {"config": {"BN": bn, "STAGES": stages, "split_k": split_k, "pair": pair, "GROUP_M": 16}}


def decode_entry(split_k: int, stages: int, reduce: str, tokens: int, bm: int = 128) -> dict[str, Any]:
    return {"config": {"split_k": split_k, "stages": stages, "reduce": reduce, "bm": bm}, "tokens": tokens}


DECODE_KEY = dt.table_key("NVIDIA H200", 132, "bf16", 128, 256, 8)


def tiny_tables(**decode: Any) -> Any:
    """One entry of each kind: the GEMM with split-K 2, the layer with BN 16 and split-K 2, the
    decode kernel with split-K 2 reduced in the kernel."""
    gemm = {"format": "sparsile-sparse-gemm-table/1", "gpu": "NVIDIA H200",
            "entries": {"bf16 128x32x256": gemm_entry(32, 3, 2), "linear-bf16 128x32x256": gemm_entry(16, 3, 2)}}
    entries = decode or {DECODE_KEY: decode_entry(2, 2, "kernel", 4)}
    return st.Tables(gemm, {"format": dt.TABLE_FORMAT, "gpu": "NVIDIA H200", "sms": 132, "entries": entries})


def by_kind(rows: list[Any]) -> dict[str, Any]:
    return {row.case.kind: row for row in rows}


def test_every_entry_of_a_tiny_table_passes_in_the_interpreter() -> None:
    rows, bad, left = st.check_tables(tiny_tables(), interpret=True, say=lambda line: None)
    assert bad == [] and left == 0 and len(rows) == 3
    kinds = by_kind(rows)
    for row in rows:
        assert row.ok and row.unwritten == 0 and row.note == "", st.format_row(row)
        assert 0 < row.max_err < 0.3 and row.max_ref > 10  # bf16 / f16 rounding of values up to ~60
    assert kinds["gemm"].via == "table"  # run_with_table with the table, as sparse_matmul does
    assert kinds["linear"].via == "explicit" and kinds["decode"].via == "explicit"  # no table in the interpreter
    assert st.report(rows, bad, left) == 0


def test_cta_pair_entries_pass_in_the_interpreter() -> None:
    """The CTA-pair kernels (the GEMM's and the layer's) on the persistent grid of 132 SMs."""
    gemm = {"format": "sparsile-sparse-gemm-table/1", "gpu": "NVIDIA H200",
            "entries": {"bf16 256x64x256": gemm_entry(32, 5, 1, True),
                        "linear-bf16 256x64x256": gemm_entry(32, 4, 1, True)}}
    rows, bad, _ = st.check_tables(st.Tables(gemm, {}), interpret=True, say=lambda line: None)
    assert bad == [] and [(r.case.kind, r.case.config.pair, r.ok) for r in rows] == [("gemm", True, True),
                                                                                        ("linear", True, True)]


def test_a_decode_entry_of_this_device_goes_through_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on an H200: plan_sparse_decode(table=) takes the entry (not the explicit fallback)."""
    monkeypatch.setattr(dt, "current_device", lambda interpret: ("NVIDIA H200", 132))
    monkeypatch.delenv("SPARSILE_DECODE_REDUCE", raising=False)
    rows, _, _ = st.check_tables(tiny_tables(), kinds=("decode",), interpret=True, say=lambda line: None)
    assert [(r.via, r.ok) for r in rows] == [("table", True)]


@pytest.mark.parametrize("on_h200", [False, True])
@pytest.mark.parametrize("split_k,reduce", [(1, "launch"), (2, "kernel")])
def test_a_decode_entry_of_64_row_slabs_runs_them(monkeypatch: pytest.MonkeyPatch, on_h200: bool, split_k: int,
                                                  reduce: str) -> None:
    """An entry with "bm": 64 is checked on 64-row slabs, through the table (as on an H200) or
    explicitly: the plan's config, row slab included, is the entry's (the H200's first run of the
    64-row entries failed here: the check compared split-K, stages and reduction only)."""
    if on_h200:
        monkeypatch.setattr(dt, "current_device", lambda interpret: ("NVIDIA H200", 132))
    monkeypatch.delenv("SPARSILE_DECODE_REDUCE", raising=False)
    tables = tiny_tables(**{DECODE_KEY: decode_entry(split_k, 2, reduce, 4, bm=64)})
    rows, bad, _ = st.check_tables(tables, kinds=("decode",), interpret=True, say=lambda line: None)
    assert bad == [] and [(r.via, r.ok, r.note) for r in rows] == [("table" if on_h200 else "explicit", True, "")]
    assert rows[0].case.config.bm == 64


@pytest.mark.parametrize("on_h200", [False, True])
def test_a_persistent_decode_entry_runs_the_persistent_kernel(monkeypatch: pytest.MonkeyPatch, on_h200: bool) -> None:
    """An entry with "persistent": true is checked on the persistent kernel, through the table or
    explicitly (the explicit plan once dropped the flag, so such entries failed as not the entry's
    config, or were checked on the plain kernel)."""
    if on_h200:
        monkeypatch.setattr(dt, "current_device", lambda interpret: ("NVIDIA H200", 132))
    monkeypatch.delenv("SPARSILE_DECODE_REDUCE", raising=False)
    from sparsile.stdlib.kernels import decode

    plans = []
    planned = decode.plan_sparse_decode
    monkeypatch.setattr(decode, "plan_sparse_decode", lambda *a, **kw: plans.append(planned(*a, **kw)) or plans[-1])
    entry = decode_entry(1, 2, "launch", 4)
    entry["config"]["persistent"] = True
    rows, bad, _ = st.check_tables(tiny_tables(**{DECODE_KEY: entry}), kinds=("decode",), interpret=True,
                                   say=lambda line: None)
    assert bad == [] and [(r.via, r.ok, r.note) for r in rows] == [("table" if on_h200 else "explicit", True, "")]
    assert plans and plans[-1].config.persist > 0


def test_a_corrupted_weight_fails_every_kind() -> None:
    """Metadata words all 0x44444444 (every group keeps positions 0 and 1: valid, but not the
    weight's) give wrong outputs, reported as FAIL, not raised."""
    tables = tiny_tables()
    cases, _ = st.table_cases(tables)
    rng = np.random.default_rng(5)
    good = st.make_weight("bf16", 128, 256, rng)
    bad = dataclasses.replace(good, meta=np.full_like(good.meta, 0x44444444))
    for case in cases:
        row = st.check_case(case, tables, rng, {("bf16", 128, 256): bad}, interpret=True)
        assert not row.ok and row.unwritten == 0 and row.max_err > 1, st.format_row(row)
        assert st.format_row(row).split()[-1] == "FAIL"


def as_torch(a: np.ndarray) -> Any:
    """A float64 reference as the GPU path holds it (a torch tensor; on torch's CPU device here)."""
    return pytest.importorskip("torch").from_numpy(a)


@pytest.mark.parametrize("as_ref", [np.asarray, as_torch], ids=["numpy", "torch"])
def test_compare_catches_a_perturbed_reference_and_unwritten_elements(as_ref: Any) -> None:
    rng = np.random.default_rng(1)
    ref = as_ref(rng.standard_normal((4100, 8)) * 8)  # more rows than one block of CHUNK_ROWS
    out = np.asarray(ref).astype(np.float16)
    assert st.compare(out, ref, "f16", None, 64)[2:] == (0, True)
    moved = ref.copy() if isinstance(ref, np.ndarray) else ref.clone()
    moved[4099, 7] += 0.5
    err, _, unwritten, ok = st.compare(out, moved, "f16", None, 64)
    assert not ok and unwritten == 0 and err == pytest.approx(0.5, abs=0.02)
    out[2048, 3] = np.nan
    assert st.compare(out, ref, "f16", None, 64)[2:] == (1, False)
    ints = np.zeros((3, 2), np.int32)
    ints[1, 1] = st.SENTINEL
    assert st.compare(ints, as_ref(np.zeros((3, 2))), "s8", None, 64)[2:] == (1, False)
    with pytest.raises(ValueError, match=r"the output is \(3, 2\), the reference \(2, 3\)"):
        st.compare(ints, as_ref(np.zeros((2, 3))), "s8", None, 64)


def test_bounds_follow_the_output_type() -> None:
    ref, zero = np.array([[64.0]]), np.zeros((1, 1))
    assert sweep.bound("bf16", ref, zero, 256)[0, 0] == pytest.approx(2.0 ** -5 + 1e-3 * 16)  # f16 C
    assert sweep.bound("bf16", ref, zero, 256, "bfloat16")[0, 0] == pytest.approx(0.25 + 1e-3 * 16)
    assert sweep.bound("s8", ref, zero, 256, "int32")[0, 0] == 0


def test_an_entry_that_cannot_run_is_a_failure() -> None:
    """64 tokens (bn64) with 8 stages: the ring does not fit in shared memory (the plan says so)."""
    key = dt.table_key("NVIDIA H200", 132, "bf16", 128, 256, 64)
    rows, _, _ = st.check_tables(tiny_tables(**{key: decode_entry(1, 8, "launch", 64)}), kinds=("decode",),
                                 interpret=True, say=lambda line: None)
    assert len(rows) == 1 and not rows[0].ok
    assert rows[0].note == ("error[SP0804]: stages of the decode kernel must be an integer from 2 to 8 whose ring "
                            "fits in 227 KB of shared memory, got 8")


def test_invalid_entries_are_failures() -> None:
    tables = tiny_tables(**{DECODE_KEY: decode_entry(2, 2, "launch", 9)})  # 9 tokens are not in bn8
    tables.gemm["entries"]["bf16 128x32"] = gemm_entry(32, 3, 1)  # sparse_matmul's lookup ignores it
    cases, bad = st.table_cases(tables)
    assert [c.kind for c in cases] == ["gemm", "linear"]
    assert bad[0].startswith("'bf16 128x32': not 'dtype MxNxK' with a config")
    assert bad[1] == f"{DECODE_KEY!r}: tokens 9 are not in the token tile bn8"
    assert st.report([], bad, 0) == 2


def test_entries_and_seconds_bound_the_run() -> None:
    rows, _, left = st.check_tables(tiny_tables(), entries=1, interpret=True, say=lambda line: None)
    assert [r.case.kind for r in rows] == ["gemm"] and left == 2
    rows, _, left = st.check_tables(tiny_tables(), skip=1, entries=1, interpret=True, say=lambda line: None)
    assert [r.case.kind for r in rows] == ["linear"] and left == 1
    rows, _, left = st.check_tables(tiny_tables(), max_seconds=0.0, interpret=True, say=lambda line: None)
    assert rows == [] and left == 3  # no case starts after the time is up
    rows, _, left = st.check_tables(tiny_tables(), max_seconds=600.0, interpret=True, say=lambda line: None)
    assert len(rows) == 3 and left == 0
    rows, _, left = st.check_tables(tiny_tables(), max_seconds=0.0, dtypes=("f16",), interpret=True,
                                    say=lambda line: None)
    assert rows == [] and left == 0  # no f16 entry: nothing selected
    rows, _, left = st.check_tables(tiny_tables(), max_seconds=0.0, dtypes=("bf16",), kinds=("gemm", "linear"),
                                    interpret=True, say=lambda line: None)
    assert left == 2  # the bf16 entries of the two kinds selected (none started)


def test_shipped_tables_parse_into_cases_their_lookup_gives() -> None:
    tables = st.Tables(st.read_table(st.GEMM_TABLE), st.read_table(st.DECODE_TABLE))
    cases, bad = st.table_cases(tables)
    assert bad == []
    counts = {kind: sum(c.kind == kind for c in cases) for kind in st.KINDS}
    gemm_keys = list(tables.gemm["entries"])  # every entry of the files becomes one case
    assert counts == {"gemm": sum(not k.startswith("linear-") for k in gemm_keys),
                      "linear": sum(k.startswith("linear-") for k in gemm_keys),
                      "decode": len(tables.decode["entries"])}
    assert min(counts.values()) > 0
    sizes = [c.m * c.k for c in cases]
    assert sizes == sorted(sizes)
    index = index_table(load_gemm_table(tables.gemm))
    for case in cases:
        if case.kind == "gemm":
            assert find(index, case.dtype, case.m, case.n, case.k) == case.config
        elif case.kind == "linear":
            assert find(index, "linear-" + case.dtype, case.m, case.n, case.k, nearby=True) == case.config
        else:
            assert dt.token_tile(case.n) == int(case.key.rsplit("bn", 1)[1])


def test_command_line() -> None:
    args = sweep.parse_args(["--tuned-only", "--skip", "3", "--entries", "5", "--max-seconds", "90", "--kind",
                             "decode"])
    assert args.tuned_only and (args.skip, args.entries, args.max_seconds, args.kind) == (3, 5, 90, ["decode"])
    assert not sweep.parse_args([]).tuned and sweep.parse_args([]).skip == 0
    for bad in (["--entries", "0"], ["--entries", "x"], ["--skip", "-1"], ["--kind", "conv"]):
        with pytest.raises(SystemExit):
            sweep.parse_args(bad)


def test_without_a_gpu_the_sweep_says_why(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from sparsile.backend import runtime

    monkeypatch.setattr(runtime, "has_gpu", lambda: False)
    with pytest.raises(SystemExit) as e:
        sweep.main(["--tuned-only"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("sweep_sparse_gemm.py checks the kernels on a GPU: no NVIDIA GPU")


@pytest.mark.gpu
def test_gpu_smallest_shipped_entries() -> None:
    tables = st.Tables(st.read_table(st.GEMM_TABLE), st.read_table(st.DECODE_TABLE))
    rows, bad, _ = st.check_tables(tables, entries=4, say=lambda line: None)
    assert bad == [] and len(rows) == 4
    assert all(r.ok for r in rows), "\n".join(st.format_row(r) for r in rows)


@pytest.mark.parametrize("text,message", [
    ("{", "sweep_sparse_gemm.py: cannot read the tuned tables: Expecting property name enclosed in double quotes"),
    ('{"format": "x"}', "sweep_sparse_gemm.py: cannot read the tuned tables: error[SP0779]: the table is not a "
                        "sparse GEMM table"),
])
def test_a_bad_table_is_said_not_raised(text: str, message: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    from sparsile.backend import runtime

    monkeypatch.setattr(runtime, "has_gpu", lambda: True)  # the tables are read before anything runs
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        sweep.main(["--tuned-only", "--table", str(path)])
    assert e.value.code == 2 and capsys.readouterr().err.startswith(message)
    with pytest.raises(SystemExit):
        sweep.main(["--tuned-only", "--table", str(tmp_path / "missing.json")])
    missing = tmp_path / "missing.json"
    assert capsys.readouterr().err == (f"sweep_sparse_gemm.py: cannot read the tuned tables: {missing}: "
                                       "No such file or directory\n")


def test_torch_operands_references_and_comparisons() -> None:
    """The operand path the sweep takes on a GPU (torch draws, prunes and compares), here on torch's
    CPU device: the tiny tables pass, a corrupted weight fails, and a bf16 output goes to torch by
    its bits (compared within its own rounding; the other comparisons: the test above, torch case)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    w = st.make_weight("bf16", 128, 256, rng, "cpu")
    assert isinstance(w.f64, torch.Tensor) and w.f64.dtype == torch.float64 and w.kp == 256
    dense = w.f64.numpy().reshape(128, 64, 4)
    assert ((dense != 0).sum(-1) <= 2).all() and (dense != 0).sum() > 128 * 256 * 0.49  # 2:4, rarely a zero kept
    rows, bad, _ = st.check_tables(tiny_tables(), interpret=True, say=lambda line: None, device="cpu")
    assert bad == [] and len(rows) == 3 and all(r.ok and 0 < r.max_err < 0.3 for r in rows), rows
    corrupt = dataclasses.replace(w, meta=np.full_like(w.meta, 0x44444444))
    for case in st.table_cases(tiny_tables())[0]:
        row = st.check_case(case, tiny_tables(), rng, {("bf16", 128, 256): corrupt}, interpret=True, device="cpu")
        assert not row.ok and row.unwritten == 0 and row.max_err > 1, st.format_row(row)
    ref = torch.from_numpy(np.random.default_rng(1).standard_normal((64, 8)) * 8)
    import ml_dtypes

    halves = ref.numpy().astype(ml_dtypes.bfloat16)  # bf16 outputs go to torch by their bits
    assert st.compare(halves, ref, "bf16", None, 64)[2:] == (0, True)  # within bf16's half ulp
    halves[7, 1] = ml_dtypes.bfloat16(float(ref[7, 1]) + 1.0)
    assert st.compare(halves, ref, "bf16", None, 64)[2:] == (0, False)
