"""A ``@jit`` kernel is recompiled when a Python value it captured changes (issue 15, item 1).

Every cache of a kernel is keyed on what it read from Python: its IR per specialization (which
``.interpret`` runs), its GPU launchers, and the disk cache of compiled code (docs/language.md,
"What a kernel captures, and when it is recompiled").
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.driver.launch import cached_launcher
from sparsile.frontend.sema.captures import EMPTY, CaptureSet, recording
from sparsile.frontend.sema.fingerprints import fingerprint

SCALE = 3.0
OFFSET_LIST = [1.0, 2.0]
CFG = types.SimpleNamespace(shift=10.0)
DEFAULT_BLOCK = 16
THIS = sys.modules[__name__]


@sp.jit
def double(v):
    return v * 2.0


@sp.jit
def plus_scale(v):
    return v + SCALE  # a helper's own global: captured by every kernel that inlines it


@sp.jit
def scaled(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 16):
    offs = sp.arange(0, BLOCK)
    m = offs < n
    sp.store(out + offs, sp.load(x + offs, mask=m) * SCALE, mask=m)


@sp.jit
def via_helpers(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 16):
    offs = sp.arange(0, BLOCK)
    m = offs < n
    sp.store(out + offs, plus_scale(double(sp.load(x + offs, mask=m))), mask=m)


@sp.jit
def via_list_and_object(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 16):
    offs = sp.arange(0, BLOCK)
    m = offs < n
    sp.store(out + offs, sp.load(x + offs, mask=m) + OFFSET_LIST[1] + CFG.shift, mask=m)


@sp.jit
def default_from_global(out: sp.ptr[sp.f32], BLOCK: sp.constexpr = DEFAULT_BLOCK):
    offs = sp.arange(0, BLOCK)
    sp.store(out + offs, sp.full((BLOCK,), 1.0, sp.f32))


def inputs(n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(n).uniform(0.5, 2.0, n).astype(np.float32)
    return x, np.full(n, np.nan, np.float32)  # poisoned output


def run(kernel: sp.Kernel, n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    x, out = inputs(n)
    kernel.interpret[(1,)](x, out, n)
    return x.astype(np.float64), out.astype(np.float64)


# ------------------------------------------------------------------------------------ (a) globals
def test_a_changed_global_gives_the_new_result_in_the_same_process(monkeypatch) -> None:
    x, out = run(scaled)
    np.testing.assert_allclose(out, x * 3.0, rtol=1e-6)
    monkeypatch.setattr(THIS, "SCALE", 7.0)
    x, out = run(scaled)
    np.testing.assert_allclose(out, x * 7.0, rtol=1e-6)
    monkeypatch.setattr(THIS, "SCALE", 3.0)
    x, out = run(scaled)  # and back
    np.testing.assert_allclose(out, x * 3.0, rtol=1e-6)


def test_an_equal_value_in_a_new_object_keeps_the_cached_ir(monkeypatch) -> None:
    x, out = inputs()
    _, bindings, key = scaled.bind((x, out, 8), {})
    first = scaled.ir_for(bindings, key)
    monkeypatch.setattr(THIS, "SCALE", float("3.0"))  # equal, not necessarily the same object
    assert scaled.ir_for(bindings, key) is first
    monkeypatch.setattr(THIS, "SCALE", 3)  # an int is another constant (its type differs)
    assert scaled.ir_for(bindings, key) is not first


def test_a_parameter_default_is_the_value_python_gave_it(monkeypatch) -> None:
    # `BLOCK=DEFAULT_BLOCK` is evaluated once, when the `def` runs, as Python's call would take it:
    # rebinding the global leaves the default (it was evaluated again in the module at each
    # compile: BLOCK became 32); assigning the function's `__defaults__` changes it
    out = np.full(32, np.nan, np.float32)
    default_from_global.interpret[(1,)](out)
    assert np.all(out[:16] == 1.0) and np.all(np.isnan(out[16:]))
    monkeypatch.setattr(THIS, "DEFAULT_BLOCK", 32)
    out[:] = np.nan
    default_from_global.interpret[(1,)](out)
    assert np.all(out[:16] == 1.0) and np.all(np.isnan(out[16:]))
    fn = default_from_global.fn
    assert fn is not None
    monkeypatch.setattr(fn, "__defaults__", (32,))
    out[:] = np.nan
    default_from_global.interpret[(1,)](out)
    assert np.all(out == 1.0)


# ------------------------------------------------------------------------------------ (b) closures, helpers
def test_a_changed_closure_variable_gives_the_new_result() -> None:
    factor = 2.0

    @sp.jit
    def k(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 16):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(x + offs, mask=offs < n) * factor, mask=offs < n)

    x, out = run(k)
    np.testing.assert_allclose(out, x * 2.0, rtol=1e-6)
    factor = -5.0
    x, out = run(k)
    np.testing.assert_allclose(out, x * -5.0, rtol=1e-6)


def test_a_rebound_jit_helper_is_inlined_anew() -> None:
    @sp.jit
    def helper(v):
        return v + 1.0

    @sp.jit
    def k(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 16):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, helper(sp.load(x + offs, mask=offs < n)), mask=offs < n)

    x, out = run(k)
    np.testing.assert_allclose(out, x + 1.0, rtol=1e-6)

    @sp.jit
    def helper(v):  # noqa: F811 (the rebinding under test)
        return v * 10.0

    x, out = run(k)
    np.testing.assert_allclose(out, x * 10.0, rtol=1e-6)


def test_a_global_of_an_inlined_helper_is_captured_too(monkeypatch) -> None:
    x, out = run(via_helpers)
    np.testing.assert_allclose(out, x * 2.0 + 3.0, rtol=1e-6)
    monkeypatch.setattr(THIS, "SCALE", 0.25)
    x, out = run(via_helpers)
    np.testing.assert_allclose(out, x * 2.0 + 0.25, rtol=1e-6)


def test_a_global_helper_rebound_in_its_module(monkeypatch) -> None:
    x, out = run(via_helpers)
    np.testing.assert_allclose(out, x * 2.0 + 3.0, rtol=1e-6)

    @sp.jit
    def triple(v):
        return v * 3.0

    monkeypatch.setattr(THIS, "double", triple)
    x, out = run(via_helpers)
    np.testing.assert_allclose(out, x * 3.0 + 3.0, rtol=1e-6)


def test_a_list_changed_in_place_and_an_attribute_of_an_object(monkeypatch) -> None:
    x, out = run(via_list_and_object)
    np.testing.assert_allclose(out, x + 2.0 + 10.0, rtol=1e-6)
    OFFSET_LIST[1] = 5.0
    try:
        x, out = run(via_list_and_object)
    finally:
        OFFSET_LIST[1] = 2.0
    np.testing.assert_allclose(out, x + 5.0 + 10.0, rtol=1e-6)
    monkeypatch.setattr(CFG, "shift", 100.0)
    x, out = run(via_list_and_object)
    np.testing.assert_allclose(out, x + 2.0 + 100.0, rtol=1e-6)


def test_spk_kernels_capture_nothing() -> None:
    k = sp.loads("S = 2.0\n@kernel\ndef k(x: ptr[f32], n: i32):\n    store(x, load(x) * S)\n").kernels["k"]
    _, bindings, key = k.bind((np.ones(1, np.float32), 1), {})
    assert k.is_closed and k.captures_for(bindings, key) is EMPTY
    assert not k.ir_entry(bindings, key)[1]


# ------------------------------------------------------------------------------------ the capture set
def test_capture_set_reports_what_changed_and_keys_the_disk_on_values(monkeypatch) -> None:
    x, out = inputs()
    _, bindings, key = scaled.bind((x, out, 8), {})
    caps = scaled.ir_entry(bindings, key)[1]
    assert caps.still_valid() and caps.changed() == []
    before = caps.disk_key()
    assert "SCALE" in before and "3.0" in before
    monkeypatch.setattr(THIS, "SCALE", 7.0)
    assert not caps.still_valid()
    assert caps.changed() == [f"global `SCALE` of module `{__name__}`"]
    assert scaled.captures_for(bindings, key).disk_key() != before


def test_objects_in_a_tuple_are_compared_by_identity(monkeypatch) -> None:
    monkeypatch.setattr(THIS, "PAIR", (CFG, 1.0), raising=False)
    with recording() as r:
        scaled.globals("PAIR")
    monkeypatch.setattr(THIS, "PAIR", (CFG, 1.0), raising=False)  # another tuple, the same object
    assert r.captures.still_valid()
    monkeypatch.setattr(THIS, "PAIR", (types.SimpleNamespace(shift=10.0), 1.0), raising=False)
    assert not r.captures.still_valid()


def test_fingerprints() -> None:
    assert fingerprint(3.0) == fingerprint(float("3.0")) != fingerprint(3)
    assert fingerprint([1, 2]) != fingerprint((1, 2))
    assert fingerprint(np.float32) == ("class", "numpy.float32")
    assert fingerprint(np.dtype("float16")) == ("dtype", "float16")
    assert fingerprint(sp.f16) == fingerprint(sp.f16) != fingerprint(sp.f32)
    assert fingerprint(scaled)[0] == "kernel" and fingerprint(np)[:2] == ("module", "numpy")
    assert fingerprint(CFG) == ("object", "types.SimpleNamespace", ("shift", fingerprint(10.0)))  # (its fields too)


def test_reads_are_recorded_inside_a_recording_misses_included(monkeypatch) -> None:
    resolve = scaled.globals
    resolve("SCALE")  # outside a recording: nothing to record into
    with recording() as r:
        resolve("SCALE")
        resolve("SCALE")
        with pytest.raises(KeyError):
            resolve("no_such_name")  # a miss: the kernel would use a builtin of that name
    assert isinstance(r.captures, CaptureSet)
    assert [x.where for x in r.captures.reads] == [("global", __name__, "SCALE"), ("global", __name__, "no_such_name")]
    assert r.captures.still_valid()
    monkeypatch.setattr(THIS, "no_such_name", 1.0, raising=False)  # now it would shadow the builtin
    assert not r.captures.still_valid()


# ------------------------------------------------------------------------------------ (d) launchers
def test_the_launcher_cache_rebuilds_when_a_capture_changes(monkeypatch) -> None:
    """kernel[grid]'s launcher cache (driver/launch.py) without a GPU: ``build`` stands in for
    compiling and loading a module."""
    x, out = inputs()
    _, bindings, key = scaled.bind((x, out, 8), {})
    built: list[object] = []

    def build() -> object:
        launcher = types.SimpleNamespace(captures=scaled.captures_for(bindings, key, {}))
        built.append(launcher)
        return launcher

    first = cached_launcher(scaled, key, 0, build)
    assert cached_launcher(scaled, key, 0, build) is first and len(built) == 1
    monkeypatch.setattr(THIS, "SCALE", 7.0)
    second = cached_launcher(scaled, key, 0, build)
    assert second is not first and len(built) == 2
    assert cached_launcher(scaled, key, 0, build) is second


def test_a_launch_rebuilds_its_launcher_when_a_capture_changes(monkeypatch) -> None:
    """``kernel[grid](...)`` end to end with the device and the compile-and-load step faked."""
    from sparsile.backend import runtime
    from sparsile.driver import launch

    class FakeLauncher:
        spec_has_tensormaps = False
        spec = types.SimpleNamespace(user_params=[])

        def __init__(self, scale: float):
            self.scale, self.calls = scale, 0

        def __call__(self, grid, values, stream=None) -> None:
            self.calls += 1

    built: list[FakeLauncher] = []

    def build(kernel, bindings, key, target, options, ordinal=None):
        launcher = FakeLauncher(THIS.SCALE)
        launcher.captures = kernel.captures_for(bindings, key, options)
        built.append(launcher)
        return launcher

    device = types.SimpleNamespace(ordinal=0, compute_capability=(9, 0))
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(runtime, "current_device", lambda ordinal=None: device)
    monkeypatch.setattr(launch, "_build_launcher", build)
    monkeypatch.setattr(scaled, "_launchers", {}, raising=False)
    x, out = inputs()
    scaled[(1,)](x, out, 8)
    scaled[(1,)](x, out, 8)
    assert [(b.scale, b.calls) for b in built] == [(3.0, 2)]
    monkeypatch.setattr(THIS, "SCALE", 7.0)
    scaled[(1,)](x, out, 8)
    assert [(b.scale, b.calls) for b in built] == [(3.0, 2), (7.0, 1)]


@pytest.mark.gpu
def test_a_changed_global_on_the_gpu(monkeypatch) -> None:
    x, _ = inputs(100)
    out = np.full(100, np.nan, np.float32)
    scaled[(1,)](x, out, 100, BLOCK=128)
    np.testing.assert_allclose(out, x.astype(np.float64) * 3.0, rtol=1e-6)
    monkeypatch.setattr(THIS, "SCALE", 7.0)
    out[:] = np.nan
    scaled[(1,)](x, out, 100, BLOCK=128)
    np.testing.assert_allclose(out, x.astype(np.float64) * 7.0, rtol=1e-6)


# ------------------------------------------------------------------------------------ (c) the disk cache
SCRIPT = '''
import os, sys
import sparsile as sp
from sparsile.driver import cache

SCALE = float(os.environ["H1_SCALE"])

@sp.jit
def scaled(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 16):
    offs = sp.arange(0, BLOCK)
    sp.store(out + offs, sp.load(x + offs, mask=offs < n) * SCALE, mask=offs < n)

ptx = scaled.compile(target="sm_90a", stop_after="ptx").ptx
stats = cache.default_cache().stats
print("hits", stats.disk_hits, "misses", stats.misses)
print([w for w in ptx.split() if w.startswith("0f")])
'''


def _child(script: Path, scale: str, cache_dir: Path) -> str:
    root = Path(sp.__file__).resolve().parents[1]
    env = {**os.environ, "H1_SCALE": scale, "SPARSILE_CACHE_DIR": str(cache_dir),
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_global_read_from_the_environment_gives_new_ptx_in_a_new_process(tmp_path) -> None:
    script = tmp_path / "scaled_kernel.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cache_dir = tmp_path / "cache"
    three = _child(script, "3.0", cache_dir)
    seven = _child(script, "7.0", cache_dir)
    assert "hits 0 misses 1" in three and "0f40400000" in three  # 3.0
    assert "hits 0 misses 1" in seven and "0f40E00000" in seven and "0f40400000" not in seven  # 7.0
    again = _child(script, "3.0", cache_dir)
    assert "hits 1 misses 0" in again and "0f40400000" in again


DEFAULT_SCRIPT = '''
import os
import sparsile as sp
from sparsile.driver import cache

@sp.jit
def scaled(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, S: sp.constexpr = 3.0, BLOCK: sp.constexpr = 16):
    offs = sp.arange(0, BLOCK)
    sp.store(out + offs, sp.load(x + offs, mask=offs < n) * S, mask=offs < n)

if os.environ["H1_SCALE"] != "3.0":
    scaled.fn.__defaults__ = (float(os.environ["H1_SCALE"]), 16)
ptx = scaled.compile(target="sm_90a", stop_after="ptx").ptx
stats = cache.default_cache().stats
print("hits", stats.disk_hits, "misses", stats.misses)
print([w for w in ptx.split() if w.startswith("0f")])
'''


def test_a_default_changed_through_defaults_gives_new_ptx_in_a_new_process(tmp_path) -> None:
    # the source text is the same in each process: the disk key holds the default Python gave
    # (`__defaults__`), which the compile takes (it took the source's `3.0` at module level)
    script = tmp_path / "default_kernel.py"
    script.write_text(textwrap.dedent(DEFAULT_SCRIPT))
    cache_dir = tmp_path / "cache"
    three = _child(script, "3.0", cache_dir)
    seven = _child(script, "7.0", cache_dir)
    assert "hits 0 misses 1" in three and "0f40400000" in three  # 3.0
    assert "hits 0 misses 1" in seven and "0f40E00000" in seven and "0f40400000" not in seven  # 7.0
    again = _child(script, "7.0", cache_dir)
    assert "hits 1 misses 0" in again and "0f40E00000" in again
