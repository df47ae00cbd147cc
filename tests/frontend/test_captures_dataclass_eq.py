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

import numpy as np
import pytest

from sparsile.frontend.sema.fingerprints import fields_may_change, fingerprint
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


@dataclasses.dataclass
class Mutable:
    block: int


@pytest.mark.parametrize("make", [Mutable, lambda b: types.SimpleNamespace(block=b)], ids=["dataclass", "namespace"])
@pytest.mark.parametrize("changed", [0, 1], ids=["left", "right"])
def test_an_object_changed_in_place_is_compared_anew_in_the_process(tmp_path, fresh_cache, make, changed) -> None:
    """``cfg.block = 2`` between two calls: the kernel folded ``cfg == FAST`` with the old fields,
    and the same object (an identity test) no longer proves the same value."""
    module = import_source(SOURCE, tmp_path, "eq_in_place")
    pair = (make(1), make(1))
    kernel = module.make_eq(*pair)
    scales_x(kernel, 2.0)
    pair[changed].block = 2
    scales_x(kernel, 3.0)
    assert len(distinct_cached_ptx([kernel])) == 1  # (through the cache: the new fields' entry)
    pair[changed].block = 1
    scales_x(kernel, 2.0)


@dataclasses.dataclass(frozen=True)
class Holder:
    inner: object


@pytest.mark.parametrize("make", [lambda: ([1, 2],), lambda: ((([1, 2],),),), lambda: ((1, [1, 2]),)],
                         ids=["tuple-of-list", "nested-tuples", "tuple-in-tuple"])
def test_a_frozen_object_holding_a_list_in_a_tuple_changed_in_place_recompiles(tmp_path, make) -> None:
    """A frozen dataclass holding a tuple that holds a list: the list changed in place changes
    ``cfg == FAST`` (it kept the old code: fields_may_change looked for lists as fields only)."""
    pair = (Holder(make()), Holder(make()))
    kernel = import_source(SOURCE, tmp_path, "eq_tuple_list").make_eq(*pair)
    scales_x(kernel, 2.0)
    inner = pair[0].inner
    while not isinstance(inner, list):
        inner = inner[-1]
    inner.append(3)
    scales_x(kernel, 3.0)
    inner.pop()
    scales_x(kernel, 2.0)


def test_which_objects_are_compared_by_their_fields_where_a_kernel_folds_them() -> None:
    assert not fields_may_change(Cfg(1)) and not fields_may_change(Holder(Cfg(1)))  # frozen all the way: identity
    assert fields_may_change(Mutable(1)) and fields_may_change(types.SimpleNamespace(a=1))
    assert fields_may_change(Holder(Mutable(1))) and fields_may_change(Holder([1]))
    assert fields_may_change(Holder((1, Mutable(1)))) and not fields_may_change(Holder((1, Cfg(2))))
    assert fields_may_change(Holder(((1, [2]),))) and not fields_may_change(Holder(((1, (2,)),)))
    assert not fields_may_change((Mutable(1),)) and not fields_may_change([1])  # (no fields: a list is compared anyway)
    deep = Holder(None)
    for _ in range(20):
        deep = Holder(deep)
    assert fields_may_change(deep)  # (deeper than the fingerprint reads fields: compared, never assumed unchanged)


ATTRIBUTE_ONLY = '''
import sparsile as sp


def make_attr(cfg):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * cfg.scale)

    return k
'''


def test_a_kernel_reading_attributes_only_keeps_the_identity_test_of_the_object(tmp_path) -> None:
    """(the fields compared at every launch only where the kernel folded the object: `cfg.scale`
    alone is its own read, checked by identity of the float, and cfg by identity)"""
    kernel = import_source(ATTRIBUTE_ONLY, tmp_path, "attr_only").make_attr(types.SimpleNamespace(scale=1.5))
    scales_x(kernel, 1.5)
    x, out = np.ones(8, np.float32), np.ones(8, np.float32)
    _, bindings, key = kernel.bind((x, out), {})
    reads = kernel.ir_entry(bindings, key)[1].reads
    assert reads and not any(r.by_value for r in reads)
    eq = import_source(SOURCE, tmp_path, "eq_reads").make_eq(Mutable(1), Mutable(1))
    _, bindings, key = eq.bind((x, out), {})
    assert [r.where[0] for r in eq.ir_entry(bindings, key)[1].reads if r.by_value] == ["folded", "folded"]
