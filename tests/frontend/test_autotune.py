"""``@sparsile.autotune`` on the CPU (docs/autotune.md): the choice, its caches (memory, disk:
keying, compiler-version invalidation, corrupt files, atomic writes), SPARSILE_AUTOTUNE=0 and
tables, skipped configs, the interpreter path, the summary and the diagnostics SP0770-SP0777.

The GPU timer is replaced by a fake benchmarker that gives each config a set time, and launches by
the interpreter (``Autotuner.launch_kernel``), so every choice here is deterministic; configs are
still compiled for sm_90a, so compile errors are real."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.driver import autotune_cache, autotune_keys
from sparsile.driver.autotune import Autotuner

N = 300


def _grid(meta: dict[str, Any]) -> tuple[int]:
    return ((N + meta["BLOCK"] - 1) // meta["BLOCK"],)


def _axpy_kernel() -> Any:
    @sp.jit
    def axpy(x, out, n: sp.i32, a, BLOCK: sp.constexpr):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
        mask = offs < n
        sp.store(out + offs, sp.load(out + offs, mask=mask) + a * sp.load(x + offs, mask=mask), mask=mask)
    return axpy


class FakeBench:
    """A benchmarker: each config's time from ``times`` (by BLOCK); it runs the launch once (the
    interpreter) so that restores are exercised, and records what it timed."""

    def __init__(self, times: dict[int, float], run: bool = False):
        self.times, self.run, self.calls = times, run, []

    def __call__(self, fn: Any, *, warmup: int, rep: int, stream: Any) -> float:
        if self.run:
            fn()
        block = fn.config.kwargs["BLOCK"]
        self.calls.append(block)
        return self.times[block]


def _tuned(bench: FakeBench, configs: list[Any] | None = None, **kw: Any) -> Autotuner:
    tuner = sp.autotune(configs or [{"BLOCK": 64}, sp.Config({"BLOCK": 128}, num_warps=4), {"BLOCK": 256}],
                        key=["n"], benchmarker=bench, **kw)(_axpy_kernel())

    def launch_on_cpu(grid: Any, args: Any, call_kwargs: dict[str, Any], stream: Any) -> None:
        tuner.kernel.interpret[grid](*args, **call_kwargs)
    tuner.launch_kernel = launch_on_cpu  # type: ignore[method-assign]
    return tuner


@pytest.fixture(autouse=True)
def _env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARSILE_AUTOTUNE", raising=False)
    monkeypatch.delenv("SPARSILE_AUTOTUNE_PRINT", raising=False)
    monkeypatch.setattr(Autotuner, "_gpu_name", lambda self: "Fake GPU")


def _data(n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32) + 2, rng.standard_normal(n).astype(np.float32) + 2


def _files(tmp_path: Any) -> list[Any]:
    return sorted((tmp_path / "cache" / "autotune").glob("*.json"))


def test_picks_the_fastest_and_launches_it_once_with_outputs_restored(tmp_path: Any) -> None:
    bench = FakeBench({64: 3.0, 128: 1.0, 256: 2.0}, run=True)
    tuner = _tuned(bench)
    x, out = _data()
    expected = out.astype(np.float64) + 0.5 * x.astype(np.float64)
    tuner[_grid](x, out, N, 0.5)
    assert bench.calls == [64, 128, 256]
    # every timed run added 0.5 x to out; the restore undid them: out holds the result of one launch
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert str(tuner.cache[next(iter(tuner.cache))].config) == "BLOCK: 128, num_warps: 4"
    tuner[_grid](x, out, N, 0.5)  # same key: no tuning
    assert bench.calls == [64, 128, 256]
    assert len(_files(tmp_path)) == 1


def test_keys_separate_values_dtypes_and_gpus(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = FakeBench({64: 3.0, 128: 1.0, 256: 2.0})
    tuner = _tuned(bench)
    x, out = _data()
    tuner.choose(_grid, (x, out, N, 0.5), {})
    tuner.choose(_grid, (x, out, N, 0.25), {})  # `a` is not in the key
    assert len(bench.calls) == 3
    tuner.choose(_grid, (x[:200], out[:200], 200, 0.5), {})  # another n
    assert len(bench.calls) == 6
    tuner.choose(_grid, (x.astype(np.float64), out.astype(np.float64), N, 0.5), {})  # other dtypes
    assert len(bench.calls) == 9
    assert sorted(tuner.cache) == ["Fake GPU|n=200; dtypes: x=float32 out=float32",
                                   "Fake GPU|n=300; dtypes: x=float32 out=float32",
                                   "Fake GPU|n=300; dtypes: x=float64 out=float64"]
    assert sorted(json.loads(_files(tmp_path)[0].read_text())["entries"]) == sorted(tuner.cache)
    # a fresh tuner (a new process) reads the winners from disk; another GPU tunes anew
    again = _tuned(bench)
    assert again.choose(_grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 128}, num_warps=4)
    assert len(bench.calls) == 9 and next(iter(again.cache.values())).how == "disk"
    monkeypatch.setattr(Autotuner, "_gpu_name", lambda self: "Other GPU")
    again.choose(_grid, (x, out, N, 0.5), {})  # the same process on another GPU tunes anew too
    assert len(bench.calls) == 12
    assert len(json.loads(_files(tmp_path)[0].read_text())["entries"]) == 4


def test_other_compiler_version_is_ignored_and_rewritten(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = FakeBench({64: 1.0, 128: 2.0, 256: 3.0})
    x, out = _data()
    monkeypatch.setattr(autotune_cache, "compiler_version", lambda: "sparsile 0.0.1+old")
    _tuned(bench).choose(_grid, (x, out, N, 0.5), {})
    monkeypatch.setattr(autotune_cache, "compiler_version", lambda: "sparsile 0.0.2+new")
    with pytest.warns(autotune_cache.AutotuneWarning, match=r"SP0774.*written by 'sparsile 0.0.1\+old'"):
        _tuned(bench).choose(_grid, (x, out, N, 0.5), {})
    assert len(bench.calls) == 6  # tuned again
    assert json.loads(_files(tmp_path)[0].read_text())["compiler"] == "sparsile 0.0.2+new"


@pytest.mark.parametrize("text", ["{not json", '{"format": "something else", "entries": {}}', "[]"])
def test_corrupt_file_is_ignored_with_a_warning_and_rewritten(tmp_path: Any, text: str) -> None:
    bench = FakeBench({64: 1.0, 128: 2.0, 256: 3.0})
    x, out = _data()
    _tuned(bench).choose(_grid, (x, out, N, 0.5), {})
    path = _files(tmp_path)[0]
    path.write_text(text)
    with pytest.warns(autotune_cache.AutotuneWarning, match="SP0774.*corrupt or of another format"):
        _tuned(bench).choose(_grid, (x, out, N, 0.5), {})
    data = json.loads(path.read_text())
    assert data["format"] == autotune_cache.FORMAT and len(data["entries"]) == 1


def test_write_is_atomic(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = FakeBench({64: 1.0, 128: 2.0, 256: 3.0})
    x, out = _data()
    _tuned(bench).choose(_grid, (x, out, N, 0.5), {})
    path = _files(tmp_path)[0]
    before = path.read_text()

    def crash(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(autotune_cache.os, "replace", crash)
    with pytest.warns(autotune_cache.AutotuneWarning, match="SP0775.*No space left on device.*in memory only"):
        _tuned(bench).choose(_grid, (x[:100], out[:100], 100, 0.5), {})
    assert path.read_text() == before  # the old file is whole
    assert os.listdir(path.parent) == [path.name]  # and no temporary file is left


def test_autotune_off_uses_the_first_config_or_the_table(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSILE_AUTOTUNE", "0")
    bench = FakeBench({64: 3.0, 128: 1.0, 256: 2.0})
    x, out = _data()
    assert _tuned(bench).choose(_grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 64})
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"format": autotune_cache.TABLE_FORMAT, "entries": {
        "n=300; dtypes: x=float32 out=float32": {"BLOCK": 256, "num_warps": 8}, "*": {"BLOCK": 128}}}))
    tuner = _tuned(bench, defaults=str(table))
    assert tuner.choose(_grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 256}, num_warps=8)
    assert tuner.choose(_grid, (x[:10], out[:10], 10, 0.5), {}) == sp.Config({"BLOCK": 128})
    assert bench.calls == [] and _files(tmp_path) == []
    assert "(table)" in tuner.summary()


def test_the_table_choice_is_one_more_candidate_when_tuning() -> None:
    bench = FakeBench({64: 3.0, 128: 2.0, 256: 1.5, 512: 1.0})
    x, out = _data()
    tuner = _tuned(bench, defaults={"*": {"BLOCK": 512}})
    assert tuner.choose(_grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 512})
    assert bench.calls == [64, 128, 256, 512]


def test_failing_configs_are_skipped_with_the_reason_in_the_summary() -> None:
    bench = FakeBench({64: 3.0, 128: 2.0})
    x, out = _data()
    tuner = _tuned(bench, configs=[{"BLOCK": 100}, {"BLOCK": 64}, {"BLOCK": 128}])
    assert tuner.choose(_grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 128})
    assert bench.calls == [64, 128]
    text = tuner.summary()
    assert "skipped     BLOCK: 100: SP0301: arange length end - start must be a power of two, found 100" in text
    assert "[Fake GPU|n=300; dtypes: x=float32 out=float32] -> BLOCK: 128 (tuned, 2.0000 ms)" in text


def test_when_every_config_fails_the_first_configs_diagnostic_is_raised() -> None:
    tuner = _tuned(FakeBench({}), configs=[{"BLOCK": 100}, {"BLOCK": 96}])
    x, out = _data()
    with pytest.raises(sp.CompileError) as e:
        tuner.choose(_grid, (x, out, N, 0.5), {})
    d = e.value.diagnostics[0]
    assert (d.code, d.message) == ("SP0301", "arange length end - start must be a power of two, found 100")


def test_interpret_runs_the_first_or_the_interpret_config_without_timing() -> None:
    bench = FakeBench({})
    x, out = _data(seed=3)
    for config, expected_block in ((None, 64), ({"BLOCK": 256}, 256)):
        tuner = _tuned(bench, interpret_config=config)
        seen: list[int] = []
        acc = out.copy()
        tuner.interpret[lambda m, seen=seen: seen.append(m["BLOCK"]) or _grid(m)](x, acc, N, 1.5)
        np.testing.assert_allclose(acc, out.astype(np.float64) + 1.5 * x.astype(np.float64), rtol=1e-6)
        assert seen == [expected_block]
    assert bench.calls == []


def test_spk_kernels_compose_and_prune_configs_by() -> None:
    module = sp.loads('''
@kernel
def fill(out: ptr[f32], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, offs.to(f32), mask=offs < n)
''', "fill.spk")
    calls: list[int] = []

    def bench(fn: Any, **kw: Any) -> float:
        calls.append(1)
        return float(len(calls))
    tuner = sp.autotune([{"BLOCK": b} for b in (32, 64, 128, 256)], key=["n"], benchmarker=bench,
                        prune_configs_by={"early_config_prune": lambda cs, args: [c for c in cs
                                                                                  if c.kwargs["BLOCK"] <= args["n"]],
                                          "perf_model": lambda **a: -a["BLOCK"], "top_k": 2})(module.kernels["fill"])
    assert tuner.choose(_grid, (np.zeros(100, np.float32), 100), {}) == sp.Config({"BLOCK": 64})
    assert len(calls) == 2  # 32 and 64 survive the early prune and the model keeps both: 64 first
    out = np.full(100, np.nan, np.float32)
    tuner.interpret[_grid](out, 100)
    np.testing.assert_array_equal(out, np.arange(100, dtype=np.float32))


def test_progress_and_print(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    x, out = _data()
    _tuned(FakeBench({64: 1.0, 128: 2.0, 256: 3.0})).choose(_grid, (x, out, N, 0.5), {})
    assert capsys.readouterr().err == ""  # stderr is no TTY here
    monkeypatch.setenv("SPARSILE_AUTOTUNE_PRINT", "1")
    _tuned(FakeBench({64: 1.0, 128: 2.0, 256: 3.0})).choose(_grid, (x[:50], out[:50], 50, 0.5), {})
    err = capsys.readouterr().err
    assert "\rsparsile autotune `axpy` [3/3] BLOCK: 256" in err
    assert ("sparsile autotune: `axpy` [n=50; dtypes: x=float32 out=float32] on Fake GPU: BLOCK: 64 (tuned, "
            "3 timed, 0 skipped in") in err


@pytest.mark.parametrize("make, code, message", [
    (lambda k: sp.autotune([], key=["n"])(k), "SP0770", "sparsile.autotune of `axpy` needs at least one config"),
    (lambda k: sp.autotune([("BLOCK", 64)], key=["n"])(k), "SP0770",
     "an autotune config must be a sparsile.Config or a dict of constexpr values and options, found ('BLOCK', 64)"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["m"])(k), "SP0771",
     "autotune key= names `m`, which is no parameter of `axpy`"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], reset_to_zero=["y"])(k), "SP0771",
     "autotune reset_to_zero= names `y`, which is no parameter of `axpy`"),
    (lambda k: sp.autotune([{"BLOCK": 64, "n": 3}], key=["n"])(k), "SP0772",
     "the autotune config {BLOCK: 64, n: 3} sets `n`, which is not a constexpr parameter of `axpy`"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], defaults={"*": 3})(k), "SP0773",
     "the autotuning table the defaults= mapping must map cache keys to configs (dicts of constexpr values and "
     "options)"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], defaults="/nonexistent/t.json")(k), "SP0773",
     "cannot read the autotuning table `/nonexistent/t.json`: No such file or directory"),
    # a list of configs, of names (each was a TypeError from inside, or a name per letter)
    (lambda k: sp.autotune(None, key=["n"])(k), "SP0770", "sparsile.autotune of `axpy` takes a list of configs, "
     "found None"),
    (lambda k: sp.autotune({"BLOCK": 64}, key=["n"])(k), "SP0770",
     "sparsile.autotune of `axpy` takes a list of configs, found {'BLOCK': 64}"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=None)(k), "SP0771",
     "autotune key= takes a list of parameter names of `axpy`, found None"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], restore_value="out")(k), "SP0771",
     "autotune restore_value= takes a list of parameter names of `axpy`, found 'out'"),
    # a key the configs choose is the first config's value in every call: it separates nothing
    (lambda k: sp.autotune([{"BLOCK": 64}, {"BLOCK": 128}], key=["BLOCK"])(k), "SP0771",
     "autotune key= names `BLOCK`, which the configs of `axpy` choose: it cannot tell calls apart"),
    # option values that cannot work were skipped like a compile error: the config was dropped without a word
    (lambda k: sp.autotune([sp.Config({"BLOCK": 64}, num_warps=0), {"BLOCK": 128}], key=["n"])(k), "SP0242",
     "the autotune config {BLOCK: 64, num_warps: 0}: num_warps must be a positive integer, found 0"),
    (lambda k: sp.autotune([{"BLOCK": 128, "num_warps": "8"}], key=["n"])(k), "SP0242",
     "the autotune config {BLOCK: 128, num_warps: 8}: num_warps must be a positive integer, found '8'"),
    (lambda k: sp.autotune([sp.Config({"BLOCK": 64}, cluster=(4, 4, 1))], key=["n"])(k), "SP0558",
     "the autotune config {BLOCK: 64, cluster: (4, 4, 1)}: a cluster is 1 to 3 positive ints of at most 8 CTAs in "
     "all, found cluster=(4, 4, 1)"),
    # a table's choice is checked as the configs are (it failed at the call as a launch with `BLOK=`)
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], defaults={"*": {"BLOK": 64}})(k), "SP0772",
     "the defaults= entry `*` {BLOK: 64} sets `BLOK`, which is no parameter of `axpy`"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], defaults={"*": {"BLOCK": 64, "a": 0.0}})(k), "SP0772",
     "the defaults= entry `*` {BLOCK: 64, a: 0.0} sets `a`, which is not a constexpr parameter of `axpy`"),
])
def test_bad_arguments(make: Any, code: str, message: str) -> None:
    with pytest.raises(sp.LaunchError) as e:
        make(_axpy_kernel())
    assert e.value.code == code
    assert str(e.value).split("\n")[0] == f"error[{code}]: {message}"


def test_bad_calls() -> None:
    x, out = _data()
    tuner = _tuned(FakeBench({}), prune_configs_by={"early_config_prune": lambda cs, args: []})
    with pytest.raises(sp.LaunchError, match=r"error\[SP0776\]: prune_configs_by left no config of `axpy` to try"):
        tuner.choose(_grid, (x, out, N, 0.5), {})
    with pytest.raises(sp.LaunchError, match=r"error\[SP0777\]: `BLOCK` is chosen by the autotuner of `axpy`"):
        tuner.choose(_grid, (x, out, N, 0.5), {"BLOCK": 64})
    with pytest.raises(sp.LaunchError, match=r"SP0770.*wraps a kernel"):
        sp.autotune([{"BLOCK": 64}], key=["n"])(lambda: None)  # type: ignore[arg-type]


def test_tuning_without_a_gpu_says_so() -> None:
    from sparsile.backend import runtime

    if runtime.has_gpu():
        pytest.skip("this machine has a GPU")
    tuner = sp.autotune([{"BLOCK": 64}], key=["n"])(_axpy_kernel())
    x, out = _data()
    with pytest.raises(sp.LaunchError) as e:
        tuner[_grid](x, out, N, 0.5)
    assert str(e.value).split("\n")[0] == "error[SP0731]: kernel `axpy` cannot be tuned: no NVIDIA GPU is available"


def test_arrays_only_another_config_writes_are_restored_too() -> None:
    """The chosen config (the first) never writes `ws`; the second, timed after it, does: tuning
    leaves `ws` as the caller passed it (before, only the arrays the first config stores to were saved)."""
    @sp.jit
    def split(x, out, ws, n: sp.i32, BLOCK: sp.constexpr, WS: sp.constexpr):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
        mask = offs < n
        v = sp.load(x + offs, mask=mask)
        if WS:
            sp.store(ws + offs, v * 2, mask=mask)
        sp.store(out + offs, v + 1, mask=mask)

    def bench(fn: Any, **kw: Any) -> float:
        fn()
        return 1.0 if fn.config.kwargs["WS"] else 0.5
    tuner = sp.autotune([{"BLOCK": 64, "WS": False}, {"BLOCK": 128, "WS": True}], key=["n"], benchmarker=bench)(split)
    tuner.launch_kernel = lambda grid, args, kw, stream: tuner.kernel.interpret[grid](*args, **kw)  # type: ignore
    x, _ = _data()
    out, ws = np.full(N, np.nan, np.float32), np.full(N, -7.0, np.float32)
    tuner[_grid](x, out, ws, N)
    assert tuner.choose(_grid, (x, out, ws, N), {}) == sp.Config({"BLOCK": 64, "WS": False})
    np.testing.assert_allclose(out, x.astype(np.float64) + 1, rtol=1e-6)
    np.testing.assert_array_equal(ws, np.full(N, -7.0))


def test_numpy_scalar_key_values_key_by_value() -> None:
    """`n` as a numpy scalar (`np.prod(shape)`, `x.shape[0]` of numpy ints) keys by its value, as a
    Python int does: before, every np.int64 `n` was one key (`n=():int64`), so the winner tuned
    for n = 300 was launched for every other n without tuning."""
    bench = FakeBench({64: 3.0, 128: 1.0, 256: 2.0})
    tuner = _tuned(bench)
    x, out = _data()
    tuner.choose(_grid, (x, out, np.int64(N), 0.5), {})
    tuner.choose(_grid, (x[:200], out[:200], np.int64(200), 0.5), {})
    assert len(bench.calls) == 6
    assert sorted(tuner.cache) == ["Fake GPU|n=200; dtypes: x=float32 out=float32 n=int64",
                                   "Fake GPU|n=300; dtypes: x=float32 out=float32 n=int64"]



def test_pdl_and_target_in_a_dict_config_are_options() -> None:
    """`pdl` and `target` are kernel options like `num_warps` (a dict naming them was a TypeError
    from Config's constructor)."""
    config = sp.Config.of({"BLOCK": 64, "pdl": False, "target": "sm_90a"})
    assert (config.kwargs, config.options) == ({"BLOCK": 64}, {"pdl": False, "target": "sm_90a"})
    assert config == sp.Config({"BLOCK": 64}, pdl=False, target="sm_90a")


@pytest.mark.parametrize("extra", [{"timings": [1, 2]}, {"skipped": "x"}, {"timings": {"BLOCK: 128": "fast"}}])
def test_a_malformed_stored_entry_still_gives_its_config(tmp_path: Any, extra: dict[str, Any]) -> None:
    """An entry whose timings or skipped reasons are malformed (a hand-edited or foreign file) was a
    TypeError from inside; its config is still used, the malformed parts are left out of the summary."""
    x, out = _data()
    _tuned(FakeBench({64: 3.0, 128: 1.0, 256: 2.0})).choose(_grid, (x, out, N, 0.5), {})
    path = _files(tmp_path)[0]
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry.update(extra)
    path.write_text(json.dumps(data))
    bench = FakeBench({})
    again = _tuned(bench)
    assert again.choose(_grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 128}, num_warps=4)
    assert bench.calls == [] and "(disk" in again.summary()


def _shifted_tuner() -> Autotuner:
    """An autotuned kernel whose call-given constexpr EXTRA (default 0) widens its arange: BLOCK 32 wins
    by time, but with EXTRA=64 only BLOCK 64 compiles (arange of 96 is SP0301)."""
    @sp.jit
    def shifted(x, out, n: sp.i32, BLOCK: sp.constexpr, EXTRA: sp.constexpr = 0):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK + EXTRA)
        mask = offs < n
        sp.store(out + offs, sp.load(x + offs, mask=mask) + 1, mask=mask)

    tuner = sp.autotune([{"BLOCK": 32}, {"BLOCK": 64}], key=["n"], benchmarker=FakeBench({32: 1.0, 64: 2.0}, run=True)
                        )(shifted)
    tuner.launch_kernel = lambda grid, args, kw, stream: tuner.kernel.interpret[grid](*args, **kw)  # type: ignore
    return tuner


def test_constexprs_the_call_gives_are_part_of_the_key() -> None:
    """BLOCK 32 wins with EXTRA=0; with EXTRA=64 it does not compile (arange of 96). The call with
    EXTRA=64 tunes for itself and gets BLOCK 64; before, it took the winner cached for EXTRA=0 and
    failed (SP0301) although a config fits it."""
    tuner = _shifted_tuner()
    x, _ = _data()
    for extra, block in ((0, 32), (64, 64)):
        out = np.full(N, np.nan, np.float32)
        tuner[_grid](x, out, N, EXTRA=extra)
        assert tuner.choose(_grid, (x, out, N), {"EXTRA": extra}) == sp.Config({"BLOCK": block})
        np.testing.assert_allclose(out, x.astype(np.float64) + 1, rtol=1e-6)
    assert sorted(tuner.cache) == ["Fake GPU|n=300, EXTRA=0; dtypes: x=float32 out=float32",
                                   "Fake GPU|n=300, EXTRA=64; dtypes: x=float32 out=float32"]


def test_a_config_whose_launch_is_refused_is_skipped_with_the_reason() -> None:
    """BLOCK 64's grid (made too tall here) is refused at its launch (SP0710), after it compiled:
    it is skipped like a config that does not compile, and the others are tuned (the whole call
    failed before). When every launch is refused, the first refusal is raised."""
    def grid(meta: dict[str, Any]) -> tuple[int, ...]:
        return (1, 70000) if meta["BLOCK"] == 64 else _grid(meta)

    bench = FakeBench({64: 1.0, 128: 2.0, 256: 3.0}, run=True)
    tuner = _tuned(bench)
    x, out = _data()
    expected = out.astype(np.float64) + 0.5 * x.astype(np.float64)
    tuner[grid](x, out, N, 0.5)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert tuner.choose(grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 128}, num_warps=4)
    assert ("skipped     BLOCK: 64: SP0710: grid (1, 70000) has 70000 programs along y; CUDA allows at most 65535"
            in tuner.summary())
    with pytest.raises(sp.LaunchError, match=r"error\[SP0710\]: grid \(1, 70000\)"):
        _tuned(FakeBench({}, run=True), configs=[{"BLOCK": 64}]).choose(grid, (x, out, N, 0.5), {})


def test_jit_above_autotune_says_to_swap_them() -> None:
    """`@sparsile.jit` over `@sparsile.autotune` (or over a kernel) was SP0241 "cannot read the source
    of `<sparsile autotuned kernel ...>`: module, class, method, ... was expected"."""
    tuner = sp.autotune([{"BLOCK": 64}], key=["n"])(_axpy_kernel())
    for wrapped, what in ((tuner, "an autotuned kernel"), (tuner.kernel, "a kernel already")):
        with pytest.raises(sp.CompileError) as e:
            sp.jit(wrapped)
        assert (e.value.code, e.value.message) == ("SP0241", f"@sparsile.jit wraps a Python function; `axpy` is {what}")
        assert "put @sparsile.autotune(...) above @sparsile.jit" in str(e.value)


def _zeroing_config(block: int, ran: list[int]) -> sp.Config:
    """A config whose pre_hook zeroes `out` (the accumulator of the kernel) and records the call."""
    def zero_out(args: dict[str, Any]) -> None:
        ran.append(block)
        args["out"][...] = 0
    return sp.Config({"BLOCK": block}, pre_hook=zero_out)


@pytest.mark.parametrize("how", ["disk", "table", "interpret"])
def test_the_pre_hook_runs_however_the_config_was_chosen(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                         how: str) -> None:
    """A winner read from the disk cache, or the defaults= table's choice with SPARSILE_AUTOTUNE=0,
    or the interpreter's config, is the config given, pre_hook and all: before, the first two were
    rebuilt from their JSON without it and `.interpret` never called it, so `out` kept its old
    values and every result was off by them (no error)."""
    x, out = _data()
    ran: list[int] = []
    configs = [{"BLOCK": 64}, _zeroing_config(128, ran)]
    if how == "disk":
        _tuned(FakeBench({64: 2.0, 128: 1.0}), configs=configs).choose(_grid, (x, out, N, 0.5), {})
        bench = FakeBench({})
        tuner = _tuned(bench, configs=configs)
        assert tuner.choose(_grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 128})
        assert bench.calls == [] and next(iter(tuner.cache.values())).how == "disk"
    elif how == "table":
        monkeypatch.setenv("SPARSILE_AUTOTUNE", "0")
        tuner = _tuned(FakeBench({}), configs=configs, defaults={"*": {"BLOCK": 128}})
    else:
        tuner = _tuned(FakeBench({}), configs=configs, interpret_config={"BLOCK": 128})
    ran.clear()
    acc = np.full(N, 7.0, np.float32)
    (tuner.interpret if how == "interpret" else tuner)[_grid](x, acc, N, 0.5)
    assert ran == [128]
    np.testing.assert_allclose(acc, 0.5 * x.astype(np.float64), rtol=1e-6)


def test_kernel_options_the_call_gives_are_part_of_the_key() -> None:
    """`num_stages=` or `target=` given by the call (the configs leave them out) change the compiled
    kernel as a constexpr does: each value tunes for itself. Before, a winner tuned for one was
    launched for the other untimed (a config that compiles for one target may not for another)."""
    bench = FakeBench({64: 3.0, 128: 1.0, 256: 2.0})
    tuner = _tuned(bench)
    x, out = _data()
    tuner.choose(_grid, (x, out, N, 0.5), {})
    tuner.choose(_grid, (x, out, N, 0.5), {"num_stages": 2})
    tuner.choose(_grid, (x, out, N, 0.5), {"num_stages": 2})
    tuner.choose(_grid, (x, out, N, 0.5), {"num_stages": 4})
    assert len(bench.calls) == 9
    assert sorted(tuner.cache) == ["Fake GPU|n=300; dtypes: x=float32 out=float32",
                                   "Fake GPU|n=300; dtypes: x=float32 out=float32; options: num_stages=2",
                                   "Fake GPU|n=300; dtypes: x=float32 out=float32; options: num_stages=4"]


def test_early_config_prune_may_return_dicts_and_keeps_pre_hooks() -> None:
    """early_config_prune's configs are taken as `configs=` takes them (dicts too: an AttributeError
    from inside before); one equal to a given config is that config, pre_hook and all."""
    ran: list[int] = []
    x, _ = _data()
    tuner = _tuned(FakeBench({64: 2.0, 128: 1.0}), configs=[{"BLOCK": 64}, _zeroing_config(128, ran)],
                   prune_configs_by={"early_config_prune": lambda cs, args: [{"BLOCK": 64}, {"BLOCK": 128}]})
    acc = np.full(N, 7.0, np.float32)
    tuner[_grid](x, acc, N, 0.5)
    assert ran == [128]
    np.testing.assert_allclose(acc, 0.5 * x.astype(np.float64), rtol=1e-6)


def test_a_typed_device_buffer_without_a_shape_keys_by_its_size() -> None:
    """`DeviceBuffer(nbytes, dtype="f32")` has no shape (one dimension implied): as a key argument
    it keyed by... a TypeError from inside (`tuple(None)`). It keys by its length now."""
    from sparsile.backend.runtime.memory import DeviceBuffer

    def buffer(nbytes: int, dtype: str | None) -> DeviceBuffer:
        b = DeviceBuffer.__new__(DeviceBuffer)  # no allocation: only what a key reads
        b.nbytes, b.dtype, b.shape = nbytes, dtype, None
        return b
    assert autotune_keys.key_string(["x"], {"x": buffer(4096, "f32")}) == "x=(1024,):f32; dtypes: x=f32"
    assert autotune_keys.key_string(["x"], {"x": buffer(4096, None)}) == "x=(4096,):None; dtypes: x=None"


@pytest.mark.parametrize("make, code, message", [
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], prune_configs_by={"early_prune": lambda cs, a: cs})(k),
     "SP0770", "autotune prune_configs_by= takes early_config_prune, perf_model and top_k, found `early_prune`"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], prune_configs_by={"perf_model": 3})(k),
     "SP0770", "autotune prune_configs_by= perf_model must be a function, found 3"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], prune_configs_by={"top_k": "2"})(k),
     "SP0770", "autotune prune_configs_by= top_k must be a positive int or a fraction in (0, 1], found '2'"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], prune_configs_by=lambda cs, a: cs)(k),
     "SP0770", "autotune prune_configs_by= takes a dict (early_config_prune, perf_model, top_k), found <function"),
    (lambda k: sp.autotune([{"BLOCK": 64}], key=["n"], reset_to_zero=["n"])(k),
     "SP0771", "autotune reset_to_zero= names `n`, which is a scalar parameter of `axpy`, not an array"),
])
def test_bad_arguments_found_by_the_review(make: Any, code: str, message: str) -> None:
    """Each was accepted and then ignored (a misspelt key of prune_configs_by), or failed inside at
    the first call (a TypeError zeroing an int)."""
    with pytest.raises(sp.LaunchError) as e:
        make(_axpy_kernel())
    assert e.value.code == code
    assert str(e.value).split("\n")[0].startswith(f"error[{code}]: {message}")


def test_bad_prunes_and_resets_at_the_call() -> None:
    """early_config_prune returning None, and reset_to_zero naming an unannotated parameter given a
    scalar, were TypeErrors from inside the tuner."""
    x, out = _data()
    tuner = _tuned(FakeBench({}), prune_configs_by={"early_config_prune": lambda cs, args: None})
    with pytest.raises(sp.LaunchError, match=r"error\[SP0770\]: early_config_prune of `axpy` must return a list of "
                                             r"configs, found None"):
        tuner.choose(_grid, (x, out, N, 0.5), {})
    tuner = _tuned(FakeBench({64: 1.0, 128: 2.0, 256: 3.0}, run=True), reset_to_zero=["a"])
    with pytest.raises(sp.LaunchError, match=r"error\[SP0771\]: autotune reset_to_zero= names `a`, which is 0.5 in "
                                             r"this call, not an array"):
        tuner.choose(_grid, (x, out, N, 0.5), {})


def _empty_grid(meta: dict[str, Any]) -> tuple[int]:
    return (sp.cdiv(0, meta["BLOCK"]),)


def test_an_empty_grid_is_not_tuned_and_launches_nothing(tmp_path: Any) -> None:
    """An empty batch (a grid with a 0 dimension under every config) has nothing to time: the call
    launches with the first config (arguments checked, nothing run), and nothing is cached, so the
    next non-empty call of the same key tunes."""
    bench = FakeBench({64: 3.0, 128: 1.0, 256: 2.0}, run=True)
    tuner = _tuned(bench)
    x, out = _data()
    before = out.copy()
    tuner[_empty_grid](x, out, N, 0.5)
    tuner[(0, 4)](x, out, N, 0.5)
    assert bench.calls == [] and tuner.cache == {} and _files(tmp_path) == []
    np.testing.assert_array_equal(out, before)
    with pytest.raises(sp.LaunchError) as info:
        tuner[_empty_grid](x, out, 2**40, 0.5)  # still checked: n is an i32
    assert info.value.code == "SP0709"
    tuner[_grid](x, out, N, 0.5)
    assert bench.calls == [64, 128, 256]
    np.testing.assert_allclose(out, before.astype(np.float64) + 0.5 * x.astype(np.float64), rtol=1e-6)


def test_a_grid_function_is_given_every_argument_not_the_constexprs_only() -> None:
    """As on every launch path (docs/language.md, docs/autotune.md): the call's run-time arguments by
    name (arrays too) and the config's constexprs. The tuner's own reading of the grid sees them too:
    an empty batch (n = 0, no programs under any config) is not tuned."""
    seen: list[dict[str, Any]] = []

    def grid(meta: dict[str, Any]) -> tuple[int]:
        seen.append(dict(meta))
        return (sp.cdiv(meta["n"], meta["BLOCK"]),)

    bench = FakeBench({64: 3.0, 128: 1.0, 256: 2.0}, run=True)
    tuner = _tuned(bench)
    x, out = _data()
    before = out.copy()
    tuner[grid](x, out, 0, 0.5)  # n = 0: every config's grid is empty
    assert bench.calls == [] and tuner.cache == {}
    np.testing.assert_array_equal(out, before)
    tuner[grid](x, out, N, 0.5)
    assert bench.calls == [64, 128, 256]
    np.testing.assert_allclose(out, before.astype(np.float64) + 0.5 * x.astype(np.float64), rtol=1e-6)
    assert {m["BLOCK"] for m in seen} == {64, 128, 256} and {m["n"] for m in seen} == {0, N}
    assert all(m["a"] == 0.5 and m["x"] is x and m["out"] is out for m in seen)


def test_a_config_whose_grid_is_empty_is_skipped_not_timed() -> None:
    """A config whose grid has a 0 dimension while another's does not (here BLOCK 64's, as a grid of
    ``n // BLOCK`` programs would for a large block) launches nothing: timed, it would be the
    fastest and be kept, and every later call would silently compute nothing. It is skipped with
    the reason, as when such a grid was SP0710; the call tunes the others."""
    def grid(meta: dict[str, Any]) -> tuple[int, ...]:
        return (0,) if meta["BLOCK"] == 64 else _grid(meta)

    bench = FakeBench({64: 0.001, 128: 2.0, 256: 3.0}, run=True)
    tuner = _tuned(bench)
    x, out = _data()
    expected = out.astype(np.float64) + 0.5 * x.astype(np.float64)
    tuner[grid](x, out, N, 0.5)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert bench.calls == [128, 256]
    assert tuner.choose(grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 128}, num_warps=4)
    assert "skipped     BLOCK: 64: SP0710: grid (0, 1, 1) has a 0 dimension: it launches nothing" in tuner.summary()


def test_an_empty_batch_launches_with_a_config_tuning_would_keep() -> None:
    """An empty batch launches with the first config that compiles and survives the pruning, as
    tuning would choose among: the first config alone (here BLOCK 48, SP0301, which tuning skips)
    made an empty batch a CompileError where a non-empty call of the same kernel works."""
    bench = FakeBench({48: 0.5, 64: 3.0, 128: 1.0}, run=True)
    tuner = _tuned(bench, [{"BLOCK": 48}, {"BLOCK": 64}, {"BLOCK": 128}])
    x, out = _data()
    before = out.copy()
    assert tuner.choose(_empty_grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 64})
    tuner[_empty_grid](x, out, N, 0.5)
    assert bench.calls == [] and tuner.cache == {}
    np.testing.assert_array_equal(out, before)
    pruned = _tuned(bench, prune_configs_by={"early_config_prune": lambda configs, named: configs[1:]})
    assert pruned.choose(_empty_grid, (x, out, N, 0.5), {}) == sp.Config({"BLOCK": 128}, num_warps=4)
    tuner[_grid](x, out, N, 0.5)  # a non-empty call tunes among the same configs
    assert bench.calls == [64, 128] and "skipped     BLOCK: 48: SP0301" in tuner.summary()


class _OnGpu1(np.ndarray):
    """A float32 array that says it lives on cuda:1 (DLPack's device query)."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 1)


def test_a_call_on_another_gpu_is_tuned_for_that_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a host of two GPUs a call whose arrays live on cuda:1 is keyed by, compiled for and timed
    on cuda:1, not the current device (driver/array_devices.py)."""
    from sparsile.backend import runtime
    from sparsile.driver import array_devices, autotune_timing

    monkeypatch.setattr(array_devices, "_COUNT", [2])
    monkeypatch.setattr(Autotuner, "_gpu_name", lambda self, ordinal=None: {None: "GPU zero", 1: "GPU one"}[ordinal])
    bench = FakeBench({64: 3.0, 128: 1.0, 256: 2.0})
    tuner = _tuned(bench)
    x, out = _data()
    tuner.choose(_grid, (x, out, N, 0.5), {})
    tuner.choose(_grid, (x.view(_OnGpu1), out.view(_OnGpu1), N, 0.5), {})
    assert sorted(k.split("|")[0] for k in tuner.cache) == ["GPU one", "GPU zero"]
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    timer = autotune_timing._default_benchmarker("axpy", 1)
    assert timer.keywords == {"device": 1}


@pytest.mark.parametrize("on_gpu1", [True, False])
def test_a_custom_benchmarker_sees_the_tuned_gpu_as_current(monkeypatch: pytest.MonkeyPatch, on_gpu1: bool) -> None:
    """A ``benchmarker=`` times with the current device's events (``do_bench`` without ``device=``,
    ``torch.cuda.Event``): on a host of two GPUs, while it times a call whose arrays live on cuda:1
    (sparsile's and torch's current device 0), both current devices are 1, restored after; for host
    arrays (launched on sparsile's current device, 1 after ``use_device(1)``) torch's is made 1 too.
    It timed device 0's events around launches on device 1."""
    import contextlib
    import sys
    from types import SimpleNamespace

    from sparsile.backend import runtime
    from sparsile.backend.runtime import devices
    from sparsile.driver import array_devices
    from sparsile.tests.stdlib.test_gemm_tuning import _device

    sparsile_current = 0 if on_gpu1 else 1
    state = {"torch": 0, "context": f"ctx{sparsile_current}"}

    @contextlib.contextmanager
    def torch_device(ordinal: int) -> Any:
        before, state["torch"] = state["torch"], ordinal
        try:
            yield
        finally:
            state["torch"] = before

    def switch(device: Any) -> Any:
        previous, state["context"] = state["context"], device.context
        return previous

    def leave(previous: Any) -> None:
        if previous is not None:
            state["context"] = previous

    gpu = _device("Fake GPU", (9, 0), 132)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True,
                                                                                    device=torch_device)))
    monkeypatch.setattr(array_devices, "_COUNT", [2])
    monkeypatch.setattr(Autotuner, "_gpu_name", lambda self, ordinal=None: "Fake GPU")
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(runtime, "current_device", lambda ordinal=None: gpu)
    monkeypatch.setattr(devices, "default_ordinal", sparsile_current)
    monkeypatch.setattr(devices, "device_state", lambda ordinal=None: devices.DeviceState(gpu, None, f"ctx{ordinal}"))
    monkeypatch.setattr(devices, "switch", switch)
    monkeypatch.setattr(devices, "leave", leave)
    seen: list[tuple[int, int, str]] = []

    def bench(fn: Any, *, warmup: int, rep: int, stream: Any) -> float:
        seen.append((devices.default_ordinal, state["torch"], state["context"]))
        return float(fn.config.kwargs["BLOCK"])

    tuner = _tuned(bench)  # type: ignore[arg-type]
    x, out = _data()
    args = (x.view(_OnGpu1), out.view(_OnGpu1), N, 0.5) if on_gpu1 else (x, out, N, 0.5)
    assert tuner.choose(_grid, args, {}) == sp.Config({"BLOCK": 64})
    assert seen == [(1, 1, "ctx1")] * 3
    restored = (sparsile_current, 0, f"ctx{sparsile_current}")
    assert (devices.default_ordinal, state["torch"], state["context"]) == restored


def test_a_default_assigned_since_is_the_key_of_the_next_call() -> None:
    """``EXTRA``'s default reassigned (``fn.__defaults__``) after a tuned call: the next call's key is
    the new default's and it tunes for it (BLOCK 64); the key was built from the parameters as first
    read, so it took the winner cached for EXTRA=0, whose launch (the new default: arange of 96)
    failed with SP0301 although a config fits it."""
    tuner = _shifted_tuner()
    x, _ = _data()
    for extra, block in ((0, 32), (64, 64)):
        tuner.kernel.fn.__defaults__ = (extra,)
        out = np.full(N, np.nan, np.float32)
        tuner[_grid](x, out, N)
        assert tuner.choose(_grid, (x, out, N), {}) == sp.Config({"BLOCK": block})
        np.testing.assert_allclose(out, x.astype(np.float64) + 1, rtol=1e-6)
    assert sorted(tuner.cache) == ["Fake GPU|n=300, EXTRA=0; dtypes: x=float32 out=float32",
                                   "Fake GPU|n=300, EXTRA=64; dtypes: x=float32 out=float32"]


def test_nans_of_other_payloads_and_signed_zeros_are_other_keys(tmp_path: Any) -> None:
    """`a` in the key: `repr` is `nan` for every NaN, so NaNs of two payloads (which a kernel folds
    into other constants) shared one tuning entry; the plain float("nan") keeps its spelling `nan`
    (a shipped table's key)."""
    import struct

    def nan(payload: int) -> float:
        return struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0000 | payload << 29))[0]

    bench = FakeBench({64: 3.0, 128: 1.0, 256: 2.0})
    tuner = sp.autotune([{"BLOCK": 64}, {"BLOCK": 128}, {"BLOCK": 256}], key=["n", "a"],
                        benchmarker=bench)(_axpy_kernel())
    x, out = _data()
    for a in (nan(1), nan(2), float("nan"), -0.0, 0.0, (nan(1),)[0]):
        tuner.choose(_grid, (x, out, N, a), {})
    assert len(bench.calls) == 15
    assert sorted(k.split("|")[1].split(";")[0] for k in tuner.cache) == [
        "n=300, a=-0.0", "n=300, a=0.0", "n=300, a=nan", "n=300, a=nan(0x7ff8000020000000)",
        "n=300, a=nan(0x7ff8000040000000)"]
    assert autotune_keys.exact_repr((1.5, [nan(1)])) == "(1.5, [nan(0x7ff8000020000000)])"
    assert autotune_keys.exact_repr((1.5, [2.0], (3,))) == repr((1.5, [2.0], (3,)))


def test_a_subclass_value_with_its_own_repr_is_keyed_by_its_plain_value() -> None:
    """`class Size(int)` spelled `Size` gave every n one tuning entry (the winner for one size
    launched for all)."""
    import enum

    class Size(int):
        def __repr__(self) -> str:
            return "Size"

    class Mode(enum.IntEnum):
        FAST = 1

    keys = {autotune_keys.key_string(["n"], {"n": Size(v)}) for v in (2, 3)}
    assert keys == {"n=Size(2)", "n=Size(3)"}
    assert autotune_keys.key_string(["n"], {"n": (Size(2), 4)}) == "n=(Size(2), 4)"
    assert autotune_keys.key_string(["n"], {"n": Mode.FAST}) == "n=<Mode.FAST: 1>"  # (an enum member: its repr)
