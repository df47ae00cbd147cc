"""A captured dataclass instance or ``SimpleNamespace`` keys the compile cache by its fields too
(docs/language.md, "What a kernel captures").

History: ``fingerprint`` keyed such an object on disk by its type's name alone (and each attribute a
kernel read from it). A kernel comparing two of them (``if cfg == FAST:``) folds Python's ``==``,
which compares their fields: two kernels of one source capturing ``Cfg(1), Cfg(1)`` and
``Cfg(1), Cfg(2)`` shared one compile cache entry, and the second compiled to the first's PTX,
silently (the interpreter, which does not go through that cache, gave the right numbers).
"""

from __future__ import annotations

import dataclasses
import types

import pytest

from sparsile.frontend.sema.fingerprints import fingerprint
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import distinct_cached_ptx, scales_x
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import sparsile as sp


def make_eq(v, w):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        if v == w:
            sp.store(out + i, sp.load(x + i) * 2.0)
        else:
            sp.store(out + i, sp.load(x + i) * 3.0)

    return k
'''



@dataclasses.dataclass(frozen=True)
class Cfg:
    block: int
    scale: float = 1.0


fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.mark.parametrize("make", [Cfg, lambda b: types.SimpleNamespace(block=b)], ids=["dataclass", "namespace"])
def test_a_captured_object_compared_with_eq_keys_the_compile_cache_by_its_fields(tmp_path, fresh_cache, make) -> None:
    module = import_source(SOURCE, tmp_path, "eq_capture")
    kernels = []
    for other, scale in ((1, 2.0), (2, 3.0)):
        kernels.append(module.make_eq(make(1), make(other)))
        scales_x(kernels[-1], scale)
    assert len(distinct_cached_ptx(kernels)) == 2


def test_dataclasses_and_namespaces_are_fingerprinted_by_their_fields() -> None:
    assert fingerprint(Cfg(1)) == fingerprint(Cfg(1)) != fingerprint(Cfg(2)) != fingerprint(Cfg(2, -0.0))
    assert fingerprint(Cfg(2, 0.0)) != fingerprint(Cfg(2, -0.0))
    ns = types.SimpleNamespace
    assert fingerprint(ns(a=1, b=2)) == fingerprint(ns(b=2, a=1)) != fingerprint(ns(a=1, b=3))
    assert fingerprint(Cfg(1))[0] == "object"  # (compared by identity in the process, as before)


@dataclasses.dataclass
class Node:
    value: int
    parent: Node | None = None
    children: list[Node] = dataclasses.field(default_factory=list)


def test_cyclic_and_deep_objects_have_a_fingerprint() -> None:
    root = Node(1)
    root.children.append(Node(2, root))  # a cycle through `parent`
    ns = types.SimpleNamespace(a=1)
    ns.me = ns
    chain = Node(0)
    for i in range(5000):  # deeper than Python's recursion limit
        chain = Node(i, chain)
    for obj in (root, ns, chain):
        assert fingerprint(obj) == fingerprint(obj)
        assert fingerprint(obj)[:2] == ("object", f"{type(obj).__module__}.{type(obj).__qualname__}")
    assert fingerprint(Node(1, Node(2))) != fingerprint(Node(1, Node(3)))
