"""A captured NumPy array indexed in a kernel (``TABLE[1]``) is SP0333, with a help line saying what
works: a captured tuple indexed by a constant (keyed by its value, checked here in one process and
across processes) or the array passed as a pointer argument and loaded (docs/language.md, "What a
kernel captures")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import FACTORIES, distinct_cached_ptx, scales_x
from sparsile.tests.support.jit_source import import_source

fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)

ARRAY_SOURCE = '''
import numpy as np
import sparsile as sp

TABLE = np.array([1.5, 2.5, 3.5])


@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * TABLE[1])


def make_closure(table):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * table[0])

    return k
'''

INDEXED = FACTORIES + '''

def make_index(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * v[1])

    return k
'''
"""capture_cache's factories and ``make_index(v)``: a kernel writing ``x * v[1]``, ``v`` a captured tuple."""


def _sp0333(kernel) -> CompileError:
    x = np.random.default_rng(3).uniform(-1.0, 1.0, 8).astype(np.float32)
    with pytest.raises(CompileError) as info:
        kernel.interpret[(1,)](x, np.full(8, np.nan, np.float32))
    return info.value


def test_a_captured_array_indexed_says_to_capture_a_tuple_or_pass_a_pointer(tmp_path) -> None:
    module = import_source(ARRAY_SOURCE, tmp_path, "array_capture")
    e = _sp0333(module.k)
    line = ARRAY_SOURCE.splitlines().index("    sp.store(out + i, sp.load(x + i) * TABLE[1])") + 1
    assert (e.code, e.message) == ("SP0333", "array([1.5, 2.5, 3.5]) cannot be indexed")
    assert (e.span.file_line, e.span.col) == (line, 40)
    assert e.help == ("a kernel does not read the elements of an array it captures: capture a tuple and index it "
                      "by a constant (`TABLE = (1.5, 2.5, 3.5)`), or pass the array as a pointer argument and "
                      "load it (`sp.load(table + i)`)")
    big = _sp0333(module.make_closure(np.arange(6, dtype=np.float32)))
    assert big.code == "SP0333"
    assert big.help is not None and "(`table = (0.0, 1.0, 2.0, ...)`)" in big.help, big.help


@pytest.mark.parametrize("factory", ["make_index", "make_closure"])
def test_a_captured_tuple_indexed_by_a_constant_is_keyed_by_its_value(tmp_path, fresh_cache, factory: str) -> None:
    """What the help offers works: ``v[1]`` of a captured tuple folds the element, and two kernels
    of one source capturing tuples that differ there compile apart (results and PTX)."""
    module = import_source(INDEXED, tmp_path, "tuple_capture")
    tables = ((1.5, 2.5, 3.5), (1.5, -4.25, 3.5))
    kernels = []
    for table in tables:
        kernels.append(getattr(module, factory)(table if factory == "make_index" else table[1]))
        scales_x(kernels[-1], table[1])
    assert len(distinct_cached_ptx(kernels)) == 2


CHILD = '''
import os

import numpy as np
import sparsile as sp
from sparsile.driver import cache
from sparsile.tests.support.capture_cache import cached_ptx, scales_x

TABLE = tuple(float(v) for v in os.environ["TABLE"].split(","))


@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * TABLE[1])


scales_x(k, TABLE[1])
ptx = cached_ptx(k)
stats = cache.default_cache().stats
print("hits", stats.disk_hits, "misses", stats.misses)
print(ptx)
'''


def test_a_new_process_with_another_captured_tuple_compiles_anew(tmp_path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = Path(sp.__file__).resolve().parents[1]

    def child(table: str) -> tuple[str, str]:
        env = {**os.environ, "TABLE": table, "SPARSILE_CACHE_DIR": str(tmp_path / "cache"),
               "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        stats, _, ptx = done.stdout.partition("\n")
        return stats, ptx

    first = child("1.5,2.5,3.5")
    assert first[0] == "hits 0 misses 1"
    other = child("1.5,-4.25,3.5")
    assert other[0] == "hits 0 misses 1" and other[1] != first[1]
    assert child("1.5,2.5,3.5") == ("hits 1 misses 0", first[1])
