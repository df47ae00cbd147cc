"""stdlib/kernels/tuning.py on the CPU: the sparse GEMM's config space, every kind of config run in
the interpreter against float64 with poisoned outputs, tables (lookup, bad files: SP0779), shapes
(SP0778) and the ``sparsile tune`` command line's checks. Timing needs the GPU:
tests/gpu/test_autotune_gpu.py."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import numpy as np
import pytest

from sparsile.cli import main
from sparsile.driver.autotune_cache import write_json_atomic
from sparsile.frontend.diagnostics import LaunchError
from sparsile.stdlib.kernels import KERNELS, plan_sparse_matmul
from sparsile.stdlib.kernels.gemm_config import GemmConfig
from sparsile.stdlib.kernels.tuning import (
    TABLE_FORMAT,
    config_space,
    default_config,
    launch,
    load_gemm_table,
    lookup,
    parse_shape,
    table_key,
    tail_variants,
    with_config,
)
from sparsile.tests.stdlib.test_gemm_api import assert_close, problem, reference


def test_config_space_follows_the_shape() -> None:
    f16 = KERNELS["f16"]
    decode = config_space(f16, 4096, 16, 4096, 132)  # 32 tiles of BN 16: split-K, no pairs
    assert {c.bn for c in decode} == {16}
    assert {c.split_k for c in decode} == {1, 2, 4, 8} and not any(c.pair for c in decode)
    assert {c.stages for c in decode} == {3, 4, 5}
    big = config_space(f16, 8192, 8192, 8192, 132)  # 2048 tiles: no split-K, pairs
    assert {c.bn for c in big} == {256, 128, 64}
    assert {c.split_k for c in big} == {1} and GemmConfig(256, 4, 1, True) in big
    short_k = config_space(f16, 256, 64, 256, 132)  # 4 K steps: no split
    assert {c.split_k for c in short_k} == {1}
    assert {c.bn for c in config_space(KERNELS["tf32"], 1024, 4096, 1024, 132)} == {128, 64, 32}


def test_inflight_twins_for_e4m3() -> None:
    """INFLIGHT twins of the unsplit configs at STAGES 4 and 5 (pairs too) for e4m3 by default,
    not for the 16-bit types unless asked for; never with split-K or a tail split."""
    e4m3 = config_space(KERNELS["e4m3"], 8192, 8192, 8192, 132)
    flying = [c for c in e4m3 if c.inflight]
    assert GemmConfig(256, 5, 1, True, inflight=True) in flying and GemmConfig(256, 4, inflight=True) in flying
    assert {c.stages for c in flying} == {4, 5} and all(c.split_k == 1 and not c.tail_split for c in flying)
    assert not any(c.inflight for c in config_space(KERNELS["bf16"], 8192, 8192, 8192, 132))
    assert any(c.inflight for c in config_space(KERNELS["bf16"], 8192, 8192, 8192, 132, inflight=True))
    assert not any(c.inflight for c in config_space(KERNELS["e4m3"], 8192, 8192, 8192, 132, inflight=False))


def test_l2_twins_for_16_bit_types() -> None:
    """L2-hinted twins of the unsplit configs at STAGES 4 and 5 (pairs too) for f16 and bf16 by
    default, not for e4m3 unless asked for; never with split-K or a tail split."""
    bf16 = config_space(KERNELS["bf16"], 8192, 8192, 8192, 132)
    hinted = [c for c in bf16 if c.l2]
    assert GemmConfig(256, 5, 1, True, l2=True) in hinted and GemmConfig(256, 4, l2=True) in hinted
    assert {c.stages for c in hinted} == {4, 5} and all(c.split_k == 1 and not c.tail_split for c in hinted)
    assert any(c.l2 for c in config_space(KERNELS["f16"], 28672, 256, 4096, 132))
    assert not any(c.l2 for c in config_space(KERNELS["e4m3"], 8192, 8192, 8192, 132))
    assert any(c.l2 for c in config_space(KERNELS["e4m3"], 8192, 8192, 8192, 132, l2=True))
    assert not any(c.l2 for c in config_space(KERNELS["bf16"], 8192, 8192, 8192, 132, l2=False))


@pytest.mark.parametrize("flag,key,dtype,text,constexprs", [
    ("inflight", "INFLIGHT", "e4m3", " INFLIGHT=1", {"INFLIGHT": 1}),
    ("l2", "L2", "bf16", " L2", {"L2A": "evict_first", "L2B": "evict_last"}),
])
def test_flags_in_tables_and_launches(monkeypatch: pytest.MonkeyPatch, flag: str, key: str, dtype: str, text: str,
                                      constexprs: dict[str, Any]) -> None:
    """A table's "INFLIGHT": 1 (one MMA group in flight) or "L2": 1 (the L2 hints) round-trips,
    reaches an unsplit GEMM launch as its constexprs (not a plan that stores partial sums), and is
    refused with split-K or a tail split; a bad value is no entry."""
    from sparsile.stdlib.kernels.gemm import SparseMatmul

    config = GemmConfig(256, 5, 1, True, **{flag: True})
    assert config.to_json()[key] == 1 and GemmConfig.from_json(config.to_json()) == config
    assert key not in GemmConfig(256).to_json() and str(config).endswith(text)
    for bad in ({"split_k": 2}, {"tail_split": 2}):
        with pytest.raises(ValueError, match=f"{key} takes split_k 1, no tail_split and no streamk"):
            GemmConfig(256, 4, **{flag: True}, **bad)
    for value in (2, "1", 0.5):
        with pytest.raises(ValueError, match=f"{key} must be 0 or 1"):
            GemmConfig.from_json({"BN": 256, key: value})
    assert lookup({table_key(dtype, 256, 64, 512): {"config": {"BN": 32, key: 3}}}, dtype, 256, 64, 512) is None
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(SparseMatmul, "run", lambda self, interpret=False, **kw: seen.append(kw))
    weight, b = problem(dtype, 130, 40, 512, seed=3)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    flagged = GemmConfig(32, 4, **{flag: True})
    launch(with_config(plan, flagged, 132, interpret=True), flagged, interpret=True)
    launch(with_config(plan, GemmConfig(32, 4, 2), 132, interpret=True), GemmConfig(32, 4, 2), interpret=True)
    assert seen == [{"STAGES": 4, "GROUP_M": 16, **constexprs}, {"STAGES": 4, "GROUP_M": 16}]


def test_tail_variants_of_a_hinted_or_inflight_config_drop_the_hint() -> None:
    """A tail split runs split-K launches, which take neither the L2 hints nor INFLIGHT: the tail
    variants of such a config (a table entry a benchmark splits) are plain tail splits, not a
    ValueError."""
    for base in (GemmConfig(256, 4, l2=True), GemmConfig(256, 5, inflight=True)):
        variants = tail_variants(base, 57344, 256, 128, 132, True)
        assert variants and all(v.tail_split and not v.l2 and not v.inflight for v in variants)


def test_default_config_is_the_planned_one() -> None:
    weight, b = problem("f16", 8192 // 32, 96, 512, seed=1)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    assert default_config(plan) == GemmConfig(plan.bn, 4, plan.split_k, plan.pair_ctas > 0)


@pytest.mark.parametrize("dtype,m,n,k,config,sms", [
    ("f16", 130, 40, 512, GemmConfig(32, 3, 2), 132),             # a narrower tile, split-K 2, 3 stages
    ("bf16", 70, 20, 384, GemmConfig(16, 5, 1, group_m=1), 132),  # BN 16, 5 stages
    ("f16", 256, 64, 256, GemmConfig(32, 3, 1, True), 2),          # the CTA-pair kernel on 2 CTAs
    ("e4m3", 130, 40, 768, GemmConfig(32, 4, inflight=True), 132),   # one MMA group in flight
    ("e4m3", 256, 64, 1024, GemmConfig(32, 4, 1, True, inflight=True), 2),  # the same on CTA pairs
    ("bf16", 130, 40, 512, GemmConfig(32, 5, l2=True), 132),       # the L2 hints
    ("f16", 256, 64, 256, GemmConfig(32, 4, 1, True, l2=True), 2),  # the L2 hints on CTA pairs
])
def test_every_kind_of_config_matches_float64(dtype: str, m: int, n: int, k: int, config: GemmConfig,
                                              sms: int) -> None:
    weight, b = problem(dtype, m, n, k, seed=m + n + k)
    plan = with_config(plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm"), config, sms,
                       interpret=True)
    assert (plan.bn, plan.split_k, plan.pair_ctas > 0) == (config.bn, config.split_k, config.pair)
    plan.out[...] = np.nan
    if plan.workspace is not None:
        plan.workspace[...] = np.nan
    c = launch(plan, config, interpret=True)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


def test_table_lookup_and_atomic_write(tmp_path: Any) -> None:
    entries = {table_key("bf16", 4096, n, 4096): {"config": GemmConfig(bn, 4, s).to_json()}
               for n, bn, s in ((16, 16, 4), (512, 128, 1), (4096, 256, 1))}
    entries[table_key("f16", 4096, 512, 4096)] = {"config": GemmConfig(64, 3).to_json()}
    path = tmp_path / "tuned" / "x.json"
    write_json_atomic(path, {"format": TABLE_FORMAT, "gpu": "Fake", "entries": entries})
    table = load_gemm_table(path)
    assert lookup(table, "bf16", 4096, 16, 4096) == GemmConfig(16, 4, 4)
    assert lookup(table, "bf16", 4096, 100, 4096) == GemmConfig(128, 4, 1)  # the next tuned N up
    assert lookup(table, "bf16", 4096, 9000, 4096) == GemmConfig(256, 4, 1)  # past the last: the largest
    assert lookup(table, "f16", 4096, 16, 4096) == GemmConfig(64, 3)
    assert lookup(table, "bf16", 4096, 16, 8192) is None
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]


@pytest.mark.parametrize("table, message", [
    ({"entries": {}}, "the table is not a sparse GEMM table (format 'sparsile-sparse-gemm-table/1')"),
    ("/nonexistent/h.json", "cannot read the sparse GEMM table `/nonexistent/h.json`: No such file or directory"),
])
def test_bad_tables(table: Any, message: str) -> None:
    with pytest.raises(LaunchError) as e:
        load_gemm_table(table)
    assert str(e.value).split("\n")[0] == f"error[SP0779]: {message}"


@pytest.mark.parametrize("shape", ["12x3", "0x16x16", (1, 2), "axbxc"])
def test_bad_shapes(shape: Any) -> None:
    with pytest.raises(LaunchError) as e:
        parse_shape(shape)
    assert str(e.value).split("\n")[0] == ("error[SP0778]: a shape to tune must be M x N x K (three positive "
                                           f"integers), found {shape!r}")
    assert parse_shape(" 8192X512x4096".strip()) == (8192, 512, 4096) and parse_shape((1, 2, 3)) == (1, 2, 3)


def test_cli_tune_checks_its_shapes_before_the_gpu(tmp_path: Any) -> None:
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("# Llama-3 8B\n4096x16x4096\n\n14336 x 16 x 4096  # up\n12x3\n")
    out, err = io.StringIO(), io.StringIO()
    assert main(["tune", "8192x512x8192", str(shapes)], stdout=out, stderr=err) == 2
    assert err.getvalue().startswith("error[SP0778]: a shape to tune must be M x N x K (three positive integers), "
                                     "found '12x3'")
    shapes.write_text("4096x16x4096\n")
    from sparsile.backend import runtime

    if not runtime.has_gpu():
        assert main(["tune", str(shapes)], stdout=out, stderr=err) == 3
        assert "no NVIDIA GPU is available" in err.getvalue()
    assert main(["tune", "1x1x1", "--dtype", "f8"], stdout=out, stderr=err) == 2  # argparse's choices


def test_shapes_beyond_i32_are_refused() -> None:
    # 99999999999999999999x1x1 passed and reached the GPU (torch.randn of that many rows)
    for shape in ("99999999999999999999x1x1", (8, 2**31, 8)):
        with pytest.raises(LaunchError) as e:
            parse_shape(shape)
        assert str(e.value).split("\n")[:2] == [f"error[SP0778]: a shape to tune has sizes up to 2**31 - 1, found "
                                                f"{shape!r}", " = help: the kernels take M, N and K as i32"]
    assert parse_shape((2**31 - 1, 1, 1)) == (2**31 - 1, 1, 1)


@pytest.mark.parametrize(("argv", "message"), [
    (["tune", "99999999999999999999x1x1"], "error[SP0778]: a shape to tune has sizes up to 2**31 - 1"),
    (["tune", "{empty}"], "error: no shapes to tune: `{empty}` holds none (one MxNxK shape a line)"),
    (["tune", "{tmp}"], "error: `{tmp}` is a folder: give shapes (MxNxK) or files of shapes"),
    (["tune", "{tmp}/nope.txt"], "error: cannot read `{tmp}/nope.txt`: no such file (and it is no MxNxK shape)"),
    # a name with a suffix was reported as a malformed shape (SP0778), not as a missing file
    (["tune", "nope.txt"], "error: cannot read `nope.txt`: no such file (and it is no MxNxK shape)"),
    (["tune", "8192x512x8192", "shapes.list"], "error: cannot read `shapes.list`: no such file"),
    (["tune", "1.5x2x3"], "error[SP0778]: a shape to tune must be M x N x K (three positive integers), found "
                          "'1.5x2x3'"),  # (a decimal point is no suffix)
    (["tune", "64x64x64", "--rep", "0"], "sparsile tune: error: argument --rep: expected at least 1, got 0"),
    (["tune", "64x64x64", "--warmup", "-1"], "sparsile tune: error: argument --warmup: expected at least 0, got -1"),
    (["tune", "64x64x64", "-o", "{tmp}"], "error: cannot write `{tmp}`: it is a folder (give the table's file name)"),
    (["tune", "64x64x64", "-o", "{empty}/t.json"],
     "error: cannot write `{empty}/t.json`: `{empty}` is a file, not a folder"),
])
def test_cli_tune_refuses_bad_input_before_timing(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any,
                                                   argv: list[str], message: str) -> None:
    # each of these used to pass the checks: with a GPU, an empty table, a torch error on the huge
    # shape, a silent --rep 1, or an OSError traceback writing -o after every shape was timed
    from sparsile.backend import runtime
    from sparsile.stdlib.kernels import tuning

    monkeypatch.chdir(tmp_path)  # (relative names: none of them is there)
    (tmp_path / "empty.txt").write_text("# nothing yet\n\n")
    names = {"tmp": str(tmp_path), "empty": str(tmp_path / "empty.txt")}
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(tuning, "tune_sparse_matmul", lambda *a, **kw: pytest.fail("tuned"))
    out, err = io.StringIO(), io.StringIO()
    assert main([a.format(**names) for a in argv], stdout=out, stderr=err) == 2
    assert message.format(**names) in err.getvalue() + capsys.readouterr().err  # argparse: sys.stderr


def test_cli_tune_inflight_puts_inflight_twins_in_every_types_space(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sparsile tune --inflight`` tunes over a space with INFLIGHT twins for bf16 too (by default
    only e4m3 has them); with ``--linear`` it is a usage error, before any GPU is asked for."""
    from sparsile.backend import runtime
    from sparsile.stdlib.kernels import tuning

    spaces: list[list[GemmConfig]] = []

    def fake_tune(shapes: Any, *, space: Any = config_space, **kw: Any) -> dict[str, Any]:
        spaces.append(space(KERNELS["bf16"], 8192, 8192, 8192, 132))
        return {"entries": {}}

    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(tuning, "tune_sparse_matmul", fake_tune)
    out, err = io.StringIO(), io.StringIO()
    assert main(["tune", "8192x8192x8192", "--dtype", "bf16"], stdout=out, stderr=err) == 0
    assert main(["tune", "8192x8192x8192", "--dtype", "bf16", "--inflight"], stdout=out, stderr=err) == 0
    assert not any(c.inflight for c in spaces[0])
    assert GemmConfig(256, 5, 1, True, inflight=True) in spaces[1]
    assert main(["tune", "8192x8192x8192", "--linear", "--inflight"], stdout=out, stderr=err) == 2
    assert "--inflight applies to sparse_matmul's kernels" in err.getvalue()


def test_tables_written_by_tune_round_trip(tmp_path: Any) -> None:
    """What tune_sparse_matmul writes (its entry layout) is what lookup reads."""
    entry = {"config": GemmConfig(128, 5, 1, True).to_json(), "us": 1.0, "default": GemmConfig(256).to_json(),
             "default_us": 2.0, "skipped": {}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": TABLE_FORMAT, "entries": {table_key("f16", 8192, 8192, 8192): entry}}))
    assert lookup(load_gemm_table(str(path)), "f16", 8192, 8192, 8192) == GemmConfig(128, 5, 1, True)


def test_tune_plan_picks_the_fastest_correct_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the interpreter with a fake timer: a config whose C is wrong is skipped even when it is
    'fastest', one that fails to compile is skipped with its diagnostic, and the fastest of the
    others (the default included) wins."""
    from sparsile.stdlib.kernels import tuning

    weight, b = problem("f16", 130, 40, 512, seed=5)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    default = default_config(base)
    fast_wrong, good, broken = GemmConfig(16, 3, 1), GemmConfig(32, 3, 2), GemmConfig(24, 4, 1)
    times = {default: 3.0, fast_wrong: 0.5, good: 1.0}
    real_launch = tuning.launch

    def launch_with_a_bug(plan: Any, config: GemmConfig, interpret: bool = False) -> Any:
        c = real_launch(plan, config, interpret)
        if config == fast_wrong:
            c[0, 0] += 100.0
        return c
    monkeypatch.setattr(tuning, "launch", launch_with_a_bug)
    timed: list[GemmConfig] = []

    def bench(fn: Any, *, warmup: int, rep: int, stream: Any) -> float:
        config = fn.config
        timed.append(config)
        return times[config]
    said: list[str] = []
    entry = tuning.tune_plan(base, 132, bench, space=lambda *a: [fast_wrong, good, broken], interpret=True,
                             say=lambda text, end="\n": said.append(text))
    assert timed == [default, good]
    assert GemmConfig.from_json(entry["config"]) == good
    assert (entry["us"], entry["default_us"]) == (1000.0, 3000.0)
    assert entry["skipped"][str(fast_wrong)] == "wrong result against the default config"
    assert entry["skipped"][str(broken)] == ("error[SP0301]: tile dimensions must be powers of two, found 24 in shape "
                                                "(128, 24)")
    assert said[-1].startswith("\rsparsile tune f16 130x40x512: BN=32 STAGES=3 split_k=2 pair=0 GROUP_M=16 1000.0 us")


def test_a_table_written_again_keeps_other_shapes_of_the_same_gpu(tmp_path: Any) -> None:
    from sparsile.stdlib.kernels.tuning import merged_table

    def table(gpu: str, **entries: GemmConfig) -> dict[str, Any]:
        return {"format": TABLE_FORMAT, "gpu": gpu,
                "entries": {name.replace("_", " "): {"config": c.to_json()} for name, c in entries.items()}}
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(table("H200", bf16_1x2x3=GemmConfig(16), bf16_4x5x6=GemmConfig(32))))
    merged = merged_table(path, table("H200", bf16_4x5x6=GemmConfig(64), f16_1x2x3=GemmConfig(128)))
    assert {k: GemmConfig.from_json(v["config"]).bn for k, v in merged["entries"].items()} == {
        "bf16 1x2x3": 16, "bf16 4x5x6": 64, "f16 1x2x3": 128}
    other_gpu = table("B200", f16_1x2x3=GemmConfig(128))
    assert merged_table(path, other_gpu) == other_gpu
    path.write_text("{broken")
    assert merged_table(path, other_gpu) == other_gpu


def test_run_with_table_launches_the_tables_choice(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What sparse_matmul does on a GPU with a shipped table, here in the interpreter: the listed
    shape runs the table's config (C checked against float64, poisoned first); an unlisted shape,
    or a CTA-pair choice with persistent=False, launches nothing and says so."""
    from sparsile.stdlib.kernels import tuning
    from sparsile.stdlib.kernels.tuning import run_with_table

    launched: list[tuple[int, int, int]] = []
    real_launch = tuning.launch

    def recording(plan: Any, config: GemmConfig, interpret: bool = False) -> Any:
        launched.append((plan.bn, plan.split_k, config.stages))
        return real_launch(plan, config, interpret)
    monkeypatch.setattr(tuning, "launch", recording)

    weight, b = problem("bf16", 130, 40, 512, seed=9)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": TABLE_FORMAT, "entries": {
        table_key("bf16", 130, 64, 512): {"config": GemmConfig(16, 3, 4).to_json()},
        table_key("bf16", 256, 64, 256): {"config": GemmConfig(32, 3, 1, True).to_json()}}}))
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    plan.out[...] = np.nan
    assert (plan.bn, plan.split_k) == (64, 2)  # the planned default differs from the table's
    assert run_with_table(plan, table=path, interpret=True)
    assert launched == [(16, 4, 3)]
    ref, absprod = reference(weight, b)
    assert_close(plan.out, ref, absprod, 512, "bf16")
    other, b2 = problem("bf16", 130, 40, 256, seed=9)
    assert not run_with_table(plan_sparse_matmul(other.values, other.meta, b2, interpret=True, kernel="gemm"),
                              table=path, interpret=True)
    pair, b3 = problem("bf16", 256, 64, 256, seed=9)
    assert not run_with_table(plan_sparse_matmul(pair.values, pair.meta, b3, interpret=True, kernel="gemm"), table=path,
                              interpret=True, persistent=False)
    assert len(launched) == 1


def test_run_with_table_skips_an_entry_tuned_at_twice_the_n(tmp_path: Any) -> None:
    """A table entry tuned at N = 256 is not taken for N = 64 (its tile, stages and split were chosen
    for four times the columns; on the H200 the N = 256 config of 6144 x 4096 took twice the planned
    default's time at N = 64), but is for N = 200 (less than twice)."""
    from sparsile.stdlib.kernels.tuning import run_with_table

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": TABLE_FORMAT, "entries": {
        table_key("bf16", 130, 256, 512): {"config": GemmConfig(16, 3, 4).to_json()}}}))
    narrow, b = problem("bf16", 130, 64, 512, seed=3)
    assert not run_with_table(plan_sparse_matmul(narrow.values, narrow.meta, b, interpret=True, kernel="gemm"),
                              table=path, interpret=True)
    near, b2 = problem("bf16", 130, 200, 512, seed=3)
    plan = plan_sparse_matmul(near.values, near.meta, b2, interpret=True, kernel="gemm")
    plan.out[...] = np.nan
    assert run_with_table(plan, table=path, interpret=True)
    ref, absprod = reference(near, b2)
    assert_close(plan.out, ref, absprod, 512, "bf16")


def test_tuning_skips_shapes_sparse_matmul_runs_on_the_decode_kernel(monkeypatch):
    """N <= 64 with f16 / bf16 / e4m3 runs the decode kernel (its own table): `sparsile tune` skips
    those shapes, unless SPARSILE_DECODE_KERNEL=0 keeps sparse_matmul on the tiled kernels."""
    from sparsile.stdlib.kernels.tuning import runs_the_decode_kernel

    assert runs_the_decode_kernel("bf16", 6144, 64, 4096) and runs_the_decode_kernel("e4m3", 6144, 1, 4096)
    assert not runs_the_decode_kernel("bf16", 6144, 65, 4096)
    assert not runs_the_decode_kernel("s8", 6144, 16, 4096) and not runs_the_decode_kernel("tf32", 64, 16, 64)
    monkeypatch.setenv("SPARSILE_DECODE_KERNEL", "0")
    assert not runs_the_decode_kernel("bf16", 6144, 64, 4096)


def _device(name: str, cc: tuple[int, int], sms: int) -> Any:
    from sparsile.backend.runtime.devices import DeviceInfo

    return DeviceInfo(0, name, cc, sms, 49152, 232448, 1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535), 16,
                      50 * 2**20)


@pytest.mark.parametrize("name, cc, sms, borrowed", [
    ("NVIDIA H200", (9, 0), 132, True),  # its own table
    ("NVIDIA H100 80GB HBM3", (9, 0), 132, True),  # the H200's: same architecture and SM count
    ("NVIDIA H100 PCIe", (9, 0), 114, False),  # other SM count: the heuristics
    ("NVIDIA B200", (10, 0), 132, False),  # other architecture
])
def test_a_gpu_without_a_table_borrows_one_of_the_same_architecture_and_sm_count(
        monkeypatch: pytest.MonkeyPatch, name: str, cc: tuple[int, int], sms: int, borrowed: bool) -> None:
    """On an H100 the heuristics ran 6144 x 256 x 4096 at 0.79x cuBLAS dense, the H200's table at
    1.16x (benchmarks/RESULTS.md, fortieth session): sparse_matmul and the layer take that table's
    entries on a GPU with none of its own and the H200's architecture and SM count."""
    from sparsile.backend import runtime
    from sparsile.stdlib.kernels import tuning

    monkeypatch.delenv(tuning.TUNED_TABLE_ENV, raising=False)
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(runtime, "current_device", lambda *a: _device(name, cc, sms))
    want = tuning.find(tuning.index_table(tuning.load_gemm_table(tuning.TUNED_DIR / "h200.json")), "bf16", 6144, 256,
                       4096, True)
    assert want is not None
    assert tuning.shipped_config("bf16", 6144, 256, 4096, nearby=True) == (want if borrowed else None)
    assert (tuning.shipped_table(name, f"sm_{cc[0]}{cc[1]}", sms) == tuning.TUNED_DIR / "h200.json") == borrowed


class _OnDevice:
    """An array's stand-in that lives on CUDA device ``ordinal`` (as DLPack's device query says)."""

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.ordinal)  # kDLCUDA


def _two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose device 0 (the current one) is a B200, no table of its own or borrowed, and
    device 1 an H200."""
    from sparsile.backend import runtime
    from sparsile.stdlib.kernels import tuning

    gpus = {0: _device("NVIDIA B200", (10, 0), 148), 1: _device("NVIDIA H200", (9, 0), 132)}
    monkeypatch.delenv(tuning.TUNED_TABLE_ENV, raising=False)
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(runtime, "current_device", lambda ordinal=None: gpus[0 if ordinal is None else ordinal])


def _h200_entry(dtype: str, m: int, n: int, k: int) -> GemmConfig:
    from sparsile.stdlib.kernels import tuning

    want = tuning.find(tuning.index_table(tuning.load_gemm_table(tuning.TUNED_DIR / "h200.json")), dtype, m, n, k, True)
    assert want is not None
    return want


def test_the_table_is_that_of_the_device_the_arrays_live_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a host of two different GPUs, a plan for device 1's arrays takes device 1's table (not the
    current device's), and its SM count."""
    from sparsile.stdlib.kernels import linear, tuning
    from sparsile.stdlib.kernels.arrays import device_ordinal

    _two_gpus(monkeypatch)
    assert tuning.shipped_config("bf16", 4096, 256, 4096, nearby=True) is None  # device 0: no table
    want = _h200_entry("bf16", 4096, 256, 4096)
    assert tuning.shipped_config("bf16", 4096, 256, 4096, nearby=True, ordinal=1) == want
    assert linear.tuned_config("bf16", 4096, 256, 4096, False, 1) == _h200_entry("linear-bf16", 4096, 256, 4096)
    assert linear.tuned_config("bf16", 4096, 256, 4096, False, None) is None
    assert (device_ordinal(_OnDevice(1)), device_ordinal(np.zeros(2)), device_ordinal([1.0])) == (1, None, None)

    weight, b = problem("bf16", 4096, 256, 4096, seed=1)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    chosen: list[tuple[GemmConfig, int]] = []
    monkeypatch.setattr(tuning, "with_config", lambda p, config, sms, interpret: chosen.append((config, sms)) or p)
    monkeypatch.setattr(tuning, "launch", lambda *a: None)
    assert tuning.run_with_table(dataclasses.replace(plan, b=_OnDevice(1)))
    assert chosen == [(want, 132)]
