"""Captured values that compile differently key the compile cache differently (docs/language.md,
"What a kernel captures"): a NaN by its payload, an enum member by its value.

History: ``fingerprint`` keyed a float by ``repr`` (every NaN is ``nan``) and an enum member by its
class and name. A NaN's payload reaches the PTX (``x * v`` with a quiet NaN of payload 1 or 2 are
two constants), and two ``IntEnum`` classes of one qualified name (made by one factory) may give a
member of one name other values: two kernels of one source shared one compile cache entry, and the
second compiled to the first's PTX, silently (the interpreter, which does not go through that
cache, gave the right numbers).
"""

from __future__ import annotations

from typing import Any

import pytest

import sparsile as sp
from sparsile.frontend.sema.fingerprints import fingerprint
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import FACTORIES, distinct_cached_ptx, f32_nan, f64_nan, scales_x
from sparsile.tests.support.jit_source import import_source

SOURCE = FACTORIES + '''

def make_enum(v):
    import enum

    class Scale(enum.IntEnum):
        A = v

    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * Scale.A)

    return k
'''



fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.mark.parametrize("factory", ["make_closure", "make_default"])
@pytest.mark.parametrize("nan", [f64_nan, f32_nan], ids=["float", "np.float32"])
def test_a_captured_nan_keys_the_compile_cache_by_its_payload(tmp_path, fresh_cache, factory: str, nan: Any) -> None:
    module = import_source(SOURCE, tmp_path, "nan_capture")
    assert len(distinct_cached_ptx(getattr(module, factory)(v) for v in (nan(1), nan(2)))) == 2


def test_a_captured_enum_member_keys_the_compile_cache_by_its_value(tmp_path, fresh_cache) -> None:
    module = import_source(SOURCE, tmp_path, "enum_capture")
    for value in (2, 3):
        scales_x(module.make_enum(value), value)
    assert len(distinct_cached_ptx(module.make_enum(v) for v in (2, 3, -5))) == 3


def test_nans_and_enum_members_are_fingerprinted_by_their_bits_and_values() -> None:
    import enum

    assert fingerprint(f64_nan(1)) == fingerprint(f64_nan(1)) != fingerprint(f64_nan(2))
    assert fingerprint(f32_nan(1)) == fingerprint(f32_nan(1)) != fingerprint(f32_nan(2))
    assert fingerprint((f32_nan(1),)) != fingerprint((f32_nan(2),))
    assert fingerprint(1.5) == ("value", "float", "1.5")  # numbers other than NaN: as before

    def member(v: int) -> enum.IntEnum:
        class E(enum.IntEnum):
            A = v

        return E.A

    assert fingerprint(member(2)) == fingerprint(member(2)) != fingerprint(member(3))


CHILD = '''
import enum
import os
import struct

import sparsile as sp
from sparsile.driver import cache


class Scale(enum.IntEnum):
    A = int(os.environ["SCALE_A"])


NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0000 | int(os.environ["NAN_PAYLOAD"]) << 29))[0]


@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * Scale.A)
    sp.store(out + 8 + i, sp.load(x + i) * NAN)


ptx = k.compile({"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32]}, stop_after="ptx").ptx
stats = cache.default_cache().stats
print("hits", stats.disk_hits, "misses", stats.misses)
print(ptx)
'''


def test_a_new_process_with_another_enum_value_or_nan_payload_compiles_anew(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = Path(sp.__file__).resolve().parents[1]

    def child(scale: int, payload: int) -> tuple[str, str]:
        env = {**os.environ, "SCALE_A": str(scale), "NAN_PAYLOAD": str(payload), "SPARSILE_CACHE_DIR":
               str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        stats, _, ptx = done.stdout.partition("\n")
        return stats, ptx

    first = child(2, 1)
    assert first[0] == "hits 0 misses 1"
    for scale, payload in ((3, 1), (2, 2)):
        other = child(scale, payload)
        assert other[0] == "hits 0 misses 1" and other[1] != first[1], (scale, payload)
    assert child(2, 1) == ("hits 1 misses 0", first[1])
