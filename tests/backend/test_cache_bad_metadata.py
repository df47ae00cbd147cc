"""Issue 15 item 7: a compile-cache entry whose checksum is valid but whose metadata the compiler
cannot read is discarded and rebuilt, instead of failing on every run."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.driver import cache as C
from sparsile.driver.compiler import compile_cached
from sparsile.driver.kernel import KERNEL_OPTIONS
from sparsile.target.targets import get_target

SOURCE = """
@kernel
def k(x: ptr[f32], n: i32, BLOCK: constexpr = 32):
    offs = arange(0, BLOCK)
    store(x + offs, load(x + offs, mask=offs < n) + 1.0, mask=offs < n)
"""


@pytest.mark.parametrize("bad", [{}, {"name": "k", "params": 5}, {"params": [], "name": 1, "target": None}])
def test_entry_with_bad_metadata_is_discarded_and_rebuilt(tmp_path, monkeypatch, bad) -> None:
    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path))
    C.reset_default_cache()
    try:
        kernel = sp.loads(SOURCE, "case.spk").kernels["k"]
        _, bindings, key = kernel.bind((np.zeros(32, np.float32), 32), {})
        options = {**KERNEL_OPTIONS, **kernel.options}
        target = get_target("sm_90a")
        good = compile_cached(kernel, bindings, key, target, options)
        cache = C.default_cache()
        (path,) = tmp_path.rglob("*.entry")
        ckey = path.stem
        entry = cache.get(ckey)
        cache.put(ckey, dict(entry.blobs), bad)  # checksum-valid, unusable metadata
        cache.clear_memory()
        assert dict(C.CompileCache(tmp_path).get(ckey).metadata) == bad
        again = compile_cached(kernel, bindings, key, target, options)
        assert again.cubin == good.cubin and again.name == good.name
        assert dict(C.CompileCache(tmp_path).get(ckey).metadata)["name"] == good.name  # rewritten
    finally:
        C.reset_default_cache()


def test_discard_forgets_memory_and_disk(tmp_path) -> None:
    cache = C.CompileCache(tmp_path)
    key = C.make_key(target="sm_90a", source="k = 1", kernel_name="k")
    cache.put(key, {"ptx": b"x"}, {"a": 1})
    cache.discard(key)
    assert cache.get(key) is None and C.CompileCache(tmp_path).get(key) is None
    cache.discard(key)  # nothing there: no error
