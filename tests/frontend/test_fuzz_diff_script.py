"""scripts/fuzz_diff.py, the wide sweep driver of the differential program fuzzers: a passing seed,
a mismatch, and the worker's timeout and crash classes."""

from __future__ import annotations

import io

from sparsile.tests.support.scripts import load_script

fuzz_diff = load_script("scripts/fuzz_diff.py", "fuzz_diff_script")


def test_a_seed_that_passes_is_ok_for_both_generators() -> None:
    assert fuzz_diff.check_seed("plain", 3, ("sm_90a",)) == {"class": "ok", "detail": ""}
    assert fuzz_diff.check_seed("sparse", 1, ("sm_100a",)) == {"class": "ok", "detail": ""}


def test_a_wrong_interpreter_result_is_a_mismatch(monkeypatch) -> None:
    from sparsile.tests.support import program_check

    real = program_check.run

    def off_by_one(program, launch, seed):
        out = real(program, launch, seed)
        name = next(iter(out))
        out[name] = out[name].copy()
        out[name][0] = out[name][0] + 1 if out[name].dtype.kind in "iu" else -1e30
        return out

    monkeypatch.setattr(program_check, "run", off_by_one)
    res = fuzz_diff.check_seed("plain", 3, ("sm_90a",))
    assert res["class"] == "mismatch" and "elements differ" in res["detail"], res


def test_the_sweep_reports_a_timeout_and_a_dead_worker_per_seed() -> None:
    log = io.StringIO()
    counts = fuzz_diff.sweep("plain", range(3, 5), ("sm_90a",), timeout=0.01, mem_gb=8, fresh=False, log=log)
    assert counts == {"timeout": 2}, log.getvalue()
    assert "FAIL plain seed 3 [timeout]" in log.getvalue()
    log = io.StringIO()
    counts = fuzz_diff.sweep("plain", range(3, 4), ("sm_90a",), timeout=60, mem_gb=0.05, fresh=True, log=log)
    assert counts == {"llvm-abort": 1}, log.getvalue()
    assert "worker exit status" in log.getvalue()
