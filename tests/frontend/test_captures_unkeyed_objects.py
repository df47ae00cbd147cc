"""A kernel may not fold the value of a Python object that no compile cache key holds (SP0254;
docs/diagnostics.md, frontend/sema/keyed_values.py).

History: an instance of a user's class (a NumPy array, a dict, a Python function) is keyed by its
type's name on disk and by identity in the process, yet a kernel folded its value through Python:
``if MODE == FAST:`` with a custom ``__eq__``, ``float(v)``, ``len(A)``, ``v < 3``, ``if v:`` with
a ``__bool__``, ``k in D``. Two kernels of one source capturing ``Mode("fast")`` and
``Mode("slow")`` shared one compile cache entry and the second compiled to the first's PTX,
silently; in the process, an object changed in place kept its old code. Attribute reads stay
allowed (each is keyed by its value), and so do ``v is None``, ``isinstance(v, C)`` and a truth test
of an object without ``__bool__`` / ``__len__`` (always true).
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.sema.fingerprints import unkeyed_part
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import distinct_cached_ptx, scales_x
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import dataclasses

import numpy as np

import sparsile as sp


class Mode:
    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return isinstance(other, Mode) and self.name == other.name

    def __lt__(self, other):
        return len(self.name) < other

    def __bool__(self):
        return self.name == "fast"

    def __float__(self):
        return float(len(self.name))


class Plain:
    def __init__(self, scale):
        self.scale = scale


@dataclasses.dataclass(eq=False)
class ById:
    block: int


FAST = Mode("fast")
TABLE = {"fast": 2.0}
ARRAY = np.zeros(4)
BY_ID = ById(1)
'''

KERNEL = '''
@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    c = {expr}
    sp.store(out + i, sp.load(x + i) * c)
'''

fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.mark.parametrize(("expr", "value", "use", "type_name", "operand"), [
    ("2.0 if v == FAST else 3.0", 'Mode("fast")', "`==`", "Mode", "v"),
    ("2.0 if v < 5 else 3.0", 'Mode("fast")', "`<`", "Mode", "v"),
    ("2.0 if v else 3.0", 'Mode("fast")', "the condition", "Mode", "v"),
    ("2.0 if not v else 3.0", 'Mode("fast")', "`not`", "Mode", "v"),
    ("v and 2.0", 'Mode("fast")', "`and`", "Mode", "v"),
    ("float(v)", 'Mode("fast")', "`float`", "Mode", "v"),
    ("float(len(v))", "ARRAY", "`len`", "ndarray", "v"),
    ("2.0 if 'fast' in v else 3.0", "TABLE", "`in`", "dict", "'fast' in v"),
    ("2.0 if (v, 1) == (FAST, 1) else 3.0", 'Mode("fast")', "`==`", "Mode", "(v, 1)"),
    ("2.0 if v == BY_ID else 3.0", "ById(1)", "`==`", "ById", "v"),
    ("2.0 if v is FAST else 3.0", "FAST", "`is`", "Mode", "v is FAST"),
])
def test_folding_the_value_of_an_unkeyed_object_is_sp0254_at_its_use(tmp_path, expr, value, use, type_name,
                                                                        operand) -> None:
    text = SOURCE + f"\nv = {value}\n" + KERNEL.format(expr=expr)
    module = import_source(text, tmp_path, "unkeyed_error")
    out = np.full(8, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        module.k.interpret[(1,)](np.ones(8, np.float32), out)
    assert np.isnan(out).all()
    d = info.value.diagnostics[0]
    assert d.code == "SP0254"
    assert d.message == f"{use} needs the value of a Python object of type `{type_name}`, which the compile cache " \
                        "cannot key"
    line = text.split("\n")[d.span.file_line - 1]
    assert line == f"    c = {expr}"
    assert line[d.span.file_col - 1:].startswith(operand)
    assert "read the attributes it needs" in d.help


ALLOWED = '''

def make_attr(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * v.scale)

    return k


def make_none(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        if v is None:
            sp.store(out + i, sp.load(x + i) * 2.0)
        elif v and isinstance(v, Plain):
            sp.store(out + i, sp.load(x + i) * v.scale)
        else:
            sp.store(out + i, sp.load(x + i) * 3.0)

    return k
'''


def test_attributes_none_tests_and_plain_truth_of_an_object_stay_allowed_and_keyed(tmp_path, fresh_cache) -> None:
    module = import_source(SOURCE + ALLOWED, tmp_path, "unkeyed_allowed")
    kernels = []
    for make, value, scale in ((module.make_attr, 1.5, 1.5), (module.make_attr, 2.5, 2.5),
                               (module.make_none, None, 2.0), (module.make_none, 4.0, 4.0)):
        kernels.append(make(None if value is None else module.Plain(value)))
        scales_x(kernels[-1], scale)
    assert len(distinct_cached_ptx(kernels)) == 4
    plain = module.Plain(1.5)
    kernel = module.make_attr(plain)
    scales_x(kernel, 1.5)
    plain.scale = -0.5  # in place: the attribute read is checked at every call
    scales_x(kernel, -0.5)


def test_the_unkeyed_part_of_a_value() -> None:
    import dataclasses
    import types
    from decimal import Decimal
    from fractions import Fraction

    class Opaque:
        pass

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        a: object

    @dataclasses.dataclass(eq=False)
    class ById:
        a: int

    o = Opaque()
    for keyed in (1, 2.5, "s", None, (1, (2.0,)), [1], Fraction(1, 3), Decimal("1.5"), np.float32(1.5), np.int8(3),
                  sp.f32, sp.f32(1.5), sp.ptr[sp.f16], np.dtype(np.float16), Cfg(1),
                  types.SimpleNamespace(a=Cfg((1, 2))), Opaque):
        assert unkeyed_part(keyed) is None, keyed
    for value, part in ((o, o), ((1, o), o), ([o], o), (Cfg(o), o), (types.SimpleNamespace(a=(o,)), o),
                        (ById(1), None), (np.zeros(2), None), ({"a": 1}, None), (len, None), (lambda: 0, None),
                        (sp.Config({"BLOCK": 64}), None)):  # (a sparsile object of the host side: keyed by repr)
        found = unkeyed_part(value)
        assert found is (value if part is None else part), value
