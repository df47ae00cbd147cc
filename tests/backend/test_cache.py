"""Tests for driver/cache.py: keys, memory/disk behaviour, corruption, concurrency, env."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import time

import pytest

from sparsile.driver import cache as C
from sparsile.target.targets import get_target

VERSIONS = {"compiler": "sparsile test", "llvmlite": "0.50.0", "nvjitlink": "13.5"}


def key_for(source: str = "k = 1", **overrides) -> str:
    fields = dict(target="sm_90a", source=source, kernel_name="matmul", specialization=(128, "f16"),
                  options={"opt_level": 3, "num_warps": 4}, versions=VERSIONS)
    fields.update(overrides)
    return C.make_key(**fields)


def blobs_for(key: str) -> dict[str, bytes]:
    """Deterministic, key-dependent content (~40 KB) so that any reader can check what it got."""
    seed = hashlib.sha256(key.encode()).digest()
    return {"ptx": b"// ptx for " + key.encode(), "cubin": seed * 1250}


# --------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------


def test_key_is_stable_hex_digest():
    k = key_for()
    assert k == key_for()
    assert len(k) == 64 and int(k, 16) >= 0


@pytest.mark.parametrize("change", [
    {"source": "k = 2"}, {"target": "sm_100a"}, {"kernel_name": "other"}, {"specialization": (64, "f16")},
    {"options": {"opt_level": 2, "num_warps": 4}},
    {"versions": {**VERSIONS, "llvmlite": "0.51.0"}}, {"versions": {**VERSIONS, "nvjitlink": "13.6"}},
    {"versions": {**VERSIONS, "compiler": "sparsile other"}},
])
def test_every_input_changes_the_key(change):
    assert key_for(**change) != key_for()


def test_option_order_does_not_matter_and_targets_may_be_objects():
    assert key_for(options={"num_warps": 4, "opt_level": 3}) == key_for()
    assert key_for(target=get_target("sm_90a")) == key_for()


def test_default_versions_are_filled_in():
    versions = C.toolchain_versions()
    assert set(versions) == {"compiler", "llvmlite", "nvjitlink", "ptxas", "python", "numpy", "ml_dtypes"}
    assert versions["compiler"].startswith("sparsile ")
    k = C.make_key(target="sm_90a", source="s", kernel_name="k")
    assert k == C.make_key(target="sm_90a", source="s", kernel_name="k", versions=versions)
    assert k != C.make_key(target="sm_90a", source="s", kernel_name="k", versions=VERSIONS)


# --------------------------------------------------------------------------------------------
# Memory and disk
# --------------------------------------------------------------------------------------------


def test_memory_only_cache():
    cache = C.CompileCache(None)
    k = key_for()
    assert not cache.disk_enabled
    assert cache.get(k) is None
    entry = cache.put(k, blobs_for(k), {"registers": 40, "spills": 0})
    assert cache.get(k) is entry
    assert entry["cubin"] == blobs_for(k)["cubin"]
    assert dict(entry.metadata) == {"registers": 40, "spills": 0}
    assert k in cache and len(cache) == 1
    assert (cache.stats.memory_hits, cache.stats.misses) == (2, 1)
    with pytest.raises(TypeError):
        entry.blobs["ptx"] = b"x"  # read-only view


def test_memory_hit_is_fast():
    """Sanity bound only: 1000 memory hits in well under 200 ms (a hit should be ~1 us)."""
    cache = C.CompileCache(None)
    k = key_for()
    cache.put(k, blobs_for(k))
    start = time.perf_counter()
    for _ in range(1000):
        assert cache.get(k) is not None
    assert time.perf_counter() - start < 0.2


def test_disk_round_trip_across_instances(tmp_path):
    k = key_for()
    writer = C.CompileCache(tmp_path)
    writer.put(k, blobs_for(k), {"registers": 40, "name": "matmul"})
    assert writer.entry_path(k).is_file()
    assert writer.entry_path(k).parent.parent.name == C.FORMAT_VERSION
    reader = C.CompileCache(tmp_path)
    entry = reader.get(k)
    assert entry is not None
    assert dict(entry.blobs) == blobs_for(k)
    assert entry.metadata["name"] == "matmul"
    assert reader.stats.disk_hits == 1
    assert reader.get(k) is entry  # promoted to memory
    assert reader.stats.memory_hits == 1


def test_memory_false_always_reads_disk(tmp_path):
    k = key_for()
    C.CompileCache(tmp_path).put(k, blobs_for(k))
    cache = C.CompileCache(tmp_path, memory=False)
    assert cache.get(k) is not None and cache.get(k) is not None
    assert cache.stats.disk_hits == 2 and len(cache) == 0


def test_lru_eviction(tmp_path):
    cache = C.CompileCache(None, max_memory_entries=2)
    keys = [key_for(str(i)) for i in range(3)]
    for k in keys:
        cache.put(k, {"ptx": k.encode()})
    assert len(cache) == 2
    assert cache.get(keys[0]) is None
    assert cache.get(keys[2]) is not None


def test_get_or_create_builds_once(tmp_path):
    cache = C.CompileCache(tmp_path)
    k = key_for()
    calls = []

    def build():
        calls.append(1)
        return blobs_for(k), {"built": True}

    first = cache.get_or_create(k, build)
    second = cache.get_or_create(k, build)
    assert first is second and calls == [1]
    assert C.CompileCache(tmp_path).get_or_create(k, build).metadata["built"] is True
    assert calls == [1]


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "other_key"])
def test_corrupted_entries_are_misses(tmp_path, damage):
    k = key_for()
    C.CompileCache(tmp_path).put(k, blobs_for(k), {"registers": 40})
    path = C.CompileCache(tmp_path).entry_path(k)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    elif damage == "garbage":
        path.write_bytes(b"\x00garbage" * 100)
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a valid entry for another key sitting at this path
        other = key_for("something else")
        C.CompileCache(tmp_path).put(other, blobs_for(other))
        path.write_bytes(C.CompileCache(tmp_path).entry_path(other).read_bytes())
    cache = C.CompileCache(tmp_path)
    assert cache.get(k) is None
    assert cache.stats.misses == 1
    cache.put(k, blobs_for(k))  # a new put repairs it
    assert dict(C.CompileCache(tmp_path).get(k).blobs) == blobs_for(k)


def test_bad_inputs_are_rejected(tmp_path):
    cache = C.CompileCache(tmp_path)
    k = key_for()
    with pytest.raises(ValueError, match="64 lowercase hex"):
        cache.put("../../etc/passwd", {"ptx": b""})
    with pytest.raises(ValueError, match="blob name"):
        cache.put(k, {"../x": b""})
    with pytest.raises(ValueError, match="bytes"):
        cache.put(k, {"ptx": "text"})
    with pytest.raises(ValueError, match="JSON"):
        cache.put(k, {"ptx": b""}, {"fn": object()})
    assert cache.get("not-a-key") is None


def test_unusable_directory_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cache = C.CompileCache(blocker / "cache")
    k = key_for()
    with pytest.warns(RuntimeWarning, match="in-memory cache only"):
        cache.put(k, blobs_for(k))
    assert not cache.disk_enabled
    assert cache.get(k) is not None
    assert cache.stats.disk_errors == 1


def test_clear(tmp_path):
    cache = C.CompileCache(tmp_path)
    k = key_for()
    cache.put(k, blobs_for(k))
    cache.clear()
    assert len(cache) == 0
    assert cache.get(k) is None
    assert not list((tmp_path / C.FORMAT_VERSION).glob("*/*.entry"))


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------


def test_cache_dir_from_env(tmp_path):
    assert C.cache_dir_from_env({"SPARSILE_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert C.cache_dir_from_env({"SPARSILE_CACHE_DIR": "off"}) is None
    assert C.cache_dir_from_env({"SPARSILE_CACHE_DIR": "OFF"}) is None
    assert C.cache_dir_from_env({"SPARSILE_NO_DISK_CACHE": "1", "SPARSILE_CACHE_DIR": str(tmp_path)}) is None
    assert C.cache_dir_from_env({"SPARSILE_NO_DISK_CACHE": "0", "SPARSILE_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert C.cache_dir_from_env({"HOME": "/home/someone"}) == C.Path("/home/someone/.cache/sparsile")


def test_default_cache_reads_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.delenv("SPARSILE_NO_DISK_CACHE", raising=False)
    C.reset_default_cache()
    try:
        assert C.default_cache().directory == tmp_path / "c"
        assert C.default_cache() is C.default_cache()
        monkeypatch.setenv("SPARSILE_CACHE_DIR", "off")
        C.reset_default_cache()
        assert not C.default_cache().disk_enabled
        assert C.CompileCache().directory is None
    finally:
        C.reset_default_cache()


# --------------------------------------------------------------------------------------------
# Several processes on one directory
# --------------------------------------------------------------------------------------------

_WORKER = textwrap.dedent("""
    import hashlib, sys
    from sparsile.driver.cache import CompileCache, make_key
    directory, worker = sys.argv[1], int(sys.argv[2])
    versions = {"compiler": "c", "llvmlite": "l", "nvjitlink": "n"}
    keys = [make_key(target="sm_90a", source=f"kernel {i}", kernel_name="k", versions=versions)
            for i in range(6)]
    def expected(key):
        seed = hashlib.sha256(key.encode()).digest()
        return {"ptx": b"// " + key.encode(), "cubin": seed * 4000}
    hits = 0
    for step in range(150):
        key = keys[(step * (worker + 1)) % len(keys)]
        cache = CompileCache(directory, memory=False)
        entry = cache.get(key)
        if entry is None or step % 5 == worker % 5:
            cache.put(key, expected(key), {"key": key, "worker": worker})
        else:
            hits += 1
            assert dict(entry.blobs) == expected(key), "torn or wrong entry"
            assert entry.metadata["key"] == key
    print("ok", hits)
""")


def test_concurrent_processes_share_a_directory(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(tmp_path), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
        assert out.startswith("ok")
    assert sum(int(out.split()[1]) for out, _ in outputs) > 0  # readers really read shared entries
    entries = list((tmp_path / C.FORMAT_VERSION).glob("*/*.entry"))
    assert len(entries) == 6
    assert not list(tmp_path.rglob("*.tmp"))  # no temporary files left behind


def test_the_versions_of_the_code_a_kernel_folds_through_are_keyed():
    """A kernel folds captured values through Python's and NumPy's code (`str(v)` of an `IntEnum`
    member is "1" from Python 3.11 on, "Level.LOW" before; NumPy 2 promotes `np.int8(100) + 1000`
    otherwise than NumPy 1): two environments sharing one cache folder shared entries."""
    import platform

    import ml_dtypes
    import numpy as np

    versions = C.toolchain_versions()
    assert versions["python"] == f"{platform.python_implementation()} {platform.python_version()}"
    assert versions["numpy"] == np.__version__ and versions["ml_dtypes"] == ml_dtypes.__version__
